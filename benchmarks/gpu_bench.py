"""remat on a GPU: XLA's compiled peak against the allocator's, checkpoints outside loops,
and plans made there or carried from a CPU host.

Questions a CPU host cannot answer, each answered by a job that runs in a process of its own
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``, so the allocator's ``peak_bytes_in_use`` is that
job's own):

- ``peak``: for a program and a strategy, `remat.measure` (compiled peak, ``peak_source``,
  FLOPs, seconds per step) beside the allocator's peak after the step ran
  (``device.memory_stats()``; the arguments and the optimizer state count in both). The
  allocator's peak is also read after the compile, before the first run, to tell the
  compiler's own scratch (autotuning) from the step's.
- ``unrolled``: an MLP stack in a Python loop with a ``jax.checkpoint`` around each layer.
  On the CPU backend XLA undoes such checkpoints (`measure` warns ``recompute_eliminated``)
  and they save nothing; here the compiled peak and FLOPs say whether this backend keeps them.
- ``plan``: `remat.plan` at 50% on this backend: time against one compile, predicted against
  compiled peak, and the allocator's peak when the plan's step runs.
- ``carried``: a plan made on a CPU host from shapes alone (``--make-carry DIR`` writes it
  there), loaded with `remat.load_plan` here and re-verified with ``repeats=0``: its peak on
  this backend against the budget it was made for.
- ``perlayer``: ``remat.plan(per_layer=True)`` at 25% on the demo GPT.

The models: the demo GPT (`remat._models._gpt.make_gpt`, 8 layers in one scan) and a
mid-size Llama-style decoder (`remat._models._maxtext`: 8 layers, d_model 1024, GQA 16/4
heads, MLP 4096, vocab 32000, 8 sequences of 1024 tokens, bf16 compute on float32 weights) trained with Adam.

Usage:
  PYTHONPATH=src python benchmarks/gpu_bench.py --make-carry DIR      # on the CPU host
  PYTHONPATH=src python benchmarks/gpu_bench.py --carry DIR --json PATH   # on the GPU host
  PYTHONPATH=src python benchmarks/gpu_bench.py --from-json PATH [--cpu-json PATH]  # section
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

MARKERS = ("<!-- gpu:start -->", "<!-- gpu:end -->")
MIB = 2**20
MID = dict(
    layers=8, d_model=1024, heads=16, kv_heads=4, mlp_dim=4096, vocab=32000, seq=1024,
    batch=8,
)  # fmt: skip
GPT = dict(layers=8, d_model=128, seq=128, batch=8, heads=4)
PLAN_FILE = "mid_plan_50.json"

# (job, program, strategy) in the order they run: the most telling first.
JOBS = [
    ("peak", "gpt", None),
    ("peak", "gpt", "full"),
    ("unrolled", "mlp", None),
    ("unrolled", "mlp", "checkpoint"),
    ("peak", "mid", None),
    ("peak", "mid", "minimal"),
    ("peak", "mid", "full"),
    ("carried", "mid", None),
    ("plan", "mid", "50%"),
    ("perlayer", "gpt", "25%"),
    ("direct", "gpt", None),
    ("direct", "mid", None),
    ("direct", "mid", "full"),
    ("real", "1b", "plan"),
    ("real", "1b", "run"),
]
# Llama-3.2-1B's dimensions (`scale_bench.py`), 4096 tokens: 114 GiB un-checkpointed on CPU.
REAL = dict(layers=16, d_model=2048, heads=32, kv_heads=8, mlp_dim=8192, vocab=128256,
            seq=4096, batch=1)  # fmt: skip
if os.environ.get("GPU_BENCH_SMALL"):  # a smoke test of the jobs on a CPU host
    REAL = dict(layers=2, d_model=64, heads=4, kv_heads=2, mlp_dim=128, vocab=256, seq=64,
                batch=2)  # fmt: skip
REAL_BUDGET = os.environ.get("GPU_BENCH_BUDGET", 60 * 2**30)  # asked of an 80 GB card
REAL_PLAN = "/tmp/gpu_bench_plan_1b.json"


### The programs


def adam():
    import optax

    return optax.adam(1e-3)


def program(name: str, preset: str | None = None):
    """``(loss, args)`` of a benchmark program, its arguments on the default device."""
    import jax
    import jax.numpy as jnp

    if name == "gpt":
        from remat._models._gpt import make_gpt

        loss, args = make_gpt(**GPT)
        return loss, args
    if name == "mid":
        from remat._models._maxtext import PRESETS, make_decoder

        sizes = dict(MID, dtype=jnp.bfloat16)
        return make_decoder(PRESETS[preset] if preset else None, sizes)
    if name == "mlp":
        layers, width, batch = 8, 1024, 2048
        keys = jax.random.split(jax.random.key(0), layers)
        ws = [jax.random.normal(k, (width, width)) / width**0.5 for k in keys]
        x = jax.random.normal(jax.random.key(1), (batch, width))
        return ws, x
    raise ValueError(f"gpu_bench: unknown program {name!r}")


def shapes(name: str):
    """``(loss, args)`` of ``name`` as `jax.ShapeDtypeStruct` s (the carried plan's)."""
    import jax.numpy as jnp

    from remat._models._maxtext import decoder_shapes

    assert name == "mid"
    return decoder_shapes(None, dict(MID, dtype=jnp.bfloat16))


def mlp_loss(checkpointed: bool):
    import jax
    import jax.numpy as jnp

    def layer(h, w):
        return jnp.tanh(h @ w) + h

    step = jax.checkpoint(layer) if checkpointed else layer

    def loss(ws, x):
        h = x
        for w in ws:  # a Python loop: no scan
            h = step(h, w)
        return jnp.mean(h**2)

    return loss


### One job (in its own process)


def allocator() -> dict:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats.get(k) for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")}


def measured(m) -> dict:
    return dict(
        peak=m.peak_bytes, source=m.peak_source, temp=m.temp_bytes, argument=m.argument_bytes,
        output=m.output_bytes, alias=m.alias_bytes, flops=m.flops, plain_flops=m.plain_flops,
        eliminated=m.recompute_eliminated, requested=m.recompute_requested,
        seconds=m.seconds.median if m.seconds else None, compile_s=m.compile_seconds,
        backend=m.backend,
    )  # fmt: skip


def compiled_then_run(loss, args, **kw) -> dict:
    """`remat.measure` of ``loss`` compiled only, the allocator read, then timed (3 runs):
    the measurement, the allocator after the compile and the warnings either gave."""
    import warnings

    import remat

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        remat.measure(loss, *args, repeats=0, **kw)
        after_compile = allocator()
        m = remat.measure(loss, *args, repeats=3, **kw)
    return dict(measured(m), after_compile=after_compile,
                warnings=[str(w.message)[:200] for w in caught])  # fmt: skip


def step_compile_seconds(loss, args) -> float:
    """Seconds of one compile of the Adam step (the planner's own step)."""
    import remat

    return remat.measure(loss, *args, optimizer=adam(), repeats=0).compile_seconds


def job(kind: str, name: str, arg: str | None, carry: str | None) -> dict:

    import jax

    import remat

    out: dict = dict(kind=kind, program=name, arg=arg, backend=jax.default_backend(),
                     device=jax.devices()[0].device_kind, jax=jax.__version__)  # fmt: skip
    out["before"] = allocator()
    if kind == "peak":
        loss, args = program(name, arg if name == "mid" else None)
        strategy = arg if name == "gpt" else None
        out.update(compiled_then_run(loss, args, optimizer=adam(), strategy=strategy))
    elif kind == "unrolled":
        ws, x = program(name)
        out.update(compiled_then_run(mlp_loss(arg == "checkpoint"), (ws, x)))
    elif kind == "plan" or kind == "perlayer":
        loss, args = program(name)
        out["one_compile_s"] = step_compile_seconds(loss, args)
        start = time.perf_counter()
        p = remat.plan(loss, *args, budget=arg, optimizer=adam(), per_layer=kind == "perlayer",
                       verbose=False)  # fmt: skip
        out["plan_s"] = time.perf_counter() - start
        out.update(budget=p.budget_bytes, predicted=p.predicted_peak_bytes,
                   compiled=p.measured_peak_bytes, baseline=p.baseline_peak_bytes,
                   baseline_flops=p.baseline_flops, plan_flops=p.measured.flops,
                   explain=p.explain()[-1500:])  # fmt: skip
        if p.stats is not None:
            out.update(step_compiles=p.stats.step_compiles, scan_compiles=p.stats.scan_compiles)
        out["after_plan"] = allocator()
        m = remat.measure(p.fn, *args, optimizer=adam(), repeats=3)
        out.update(measured(m))
    elif kind == "carried":
        path = Path(carry or "", PLAN_FILE)
        loss, args = program(name)
        saved = json.loads(path.read_text())
        out.update(budget=saved["budget_bytes"], planned_peak=saved["measured"]["peak_bytes"],
                   made_on=saved["measured"]["backend"], made_with=saved.get("jax"))  # fmt: skip
        try:
            fn = remat.load_plan(path, loss, *args, optimizer=adam()).fn
            out["loaded"] = "load_plan"
        except ValueError as e:  # another JAX traces another program: apply it by scan
            out["load_plan_error"] = str(e)[:600]
            fn, out["loaded"] = remat.apply(loss, str(path)), "apply"
        m = remat.measure(fn, *args, optimizer=adam(), repeats=0)
        out.update(measured(m))
        out["after_compile"] = allocator()
        m = remat.measure(fn, *args, optimizer=adam(), repeats=3)
        out["seconds"] = m.seconds.median if m.seconds else None
    elif kind == "direct":
        loss, (params, tokens) = program(name, arg)
        out.update(direct(loss, params, tokens))
    elif kind == "real":
        out.update(real(arg))
    out["after"] = allocator()
    return out


def real(stage: str) -> dict:
    """Llama-3.2-1B's shapes: ``plan`` plans the un-checkpointed decoder from shapes at
    `REAL_BUDGET` and writes the plan; ``run`` loads it at real arrays and runs its step
    (`direct`)."""
    import jax.numpy as jnp

    import remat
    from remat._models._maxtext import decoder_shapes, make_decoder

    sizes = dict(REAL, dtype=jnp.bfloat16)
    if stage == "plan":
        loss, args = decoder_shapes(None, sizes)
        base = remat.measure(loss, *args, optimizer=adam(), repeats=0)
        start = time.perf_counter()
        p = remat.plan(loss, *args, budget=REAL_BUDGET, optimizer=adam(), verbose=False)
        p.to_json(REAL_PLAN)
        return dict(baseline=base.peak_bytes, one_compile_s=base.compile_seconds,
                    plan_s=time.perf_counter() - start, budget=p.budget_bytes,
                    predicted=p.predicted_peak_bytes, compiled=p.measured_peak_bytes,
                    baseline_flops=base.flops, plan_flops=p.measured.flops,
                    step_compiles=p.stats.step_compiles, scan_compiles=p.stats.scan_compiles,
                    explain=p.explain()[-1500:])  # fmt: skip
    loss, (params, tokens) = make_decoder(None, sizes)
    plan = remat.load_plan(REAL_PLAN, loss, params, tokens, optimizer=adam())
    return dict(direct(plan.fn, params, tokens), budget=plan.budget_bytes)


def direct(loss, params, tokens) -> dict:
    """The Adam step compiled with `jax.jit` alone (donating the parameters and the optimizer
    state) and run twice, the allocator read after each stage: nothing of remat's between
    XLA's memory analysis and the device."""
    import jax
    import optax

    opt = adam()
    state = opt.init(params)

    def step(p, s, t):
        value, grads = jax.value_and_grad(loss)(p, t)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    out = {"args_placed": allocator()}
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, tokens).compile()
    out["after_compile"] = allocator()
    ma = compiled.memory_analysis()
    out.update(peak=ma.peak_memory_in_bytes, temp=ma.temp_size_in_bytes,
               argument=ma.argument_size_in_bytes, output=ma.output_size_in_bytes,
               alias=ma.alias_size_in_bytes, source="peak_memory_in_bytes")  # fmt: skip
    for run in (1, 2):
        params, state, value = compiled(params, state, tokens)
        jax.block_until_ready(value)
        out[f"after_run{run}"] = allocator()
    return out


def child(spec: str, carry: str | None) -> None:
    kind, name, arg = json.loads(spec)
    try:
        result = job(kind, name, arg, carry)
    except Exception as e:  # the parent records it; one failing job does not stop the rest
        result = dict(kind=kind, program=name, arg=arg, error=f"{type(e).__name__}: {e}"[:2000],
                      trace=traceback.format_exc()[-3000:])  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)


### The run


def run(path: Path, carry: str | None, only: list[int] | None, timeout: int) -> list[dict]:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    results = []
    for i, spec in enumerate(JOBS):
        if only is not None and i not in only:
            continue
        if spec[0] == "carried" and not carry:
            continue
        start = time.perf_counter()
        argv = [sys.executable, __file__, "--child", json.dumps(spec)]
        argv += ["--carry", carry] if carry else []
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            row = json.loads(lines[-1][7:]) if lines else dict(
                kind=spec[0], program=spec[1], arg=spec[2],
                error=f"exit {done.returncode}: {done.stderr[-1500:]}")  # fmt: skip
        except subprocess.TimeoutExpired:
            row = dict(kind=spec[0], program=spec[1], arg=spec[2], error=f"timeout {timeout} s")
        row["wall_s"] = time.perf_counter() - start
        results.append(row)
        print(summary(row), flush=True)
        path.write_text(json.dumps(results, indent=1))
    return results


def summary(r: dict) -> str:
    head = f"[{r['kind']} {r['program']} {r.get('arg')}] {r.get('wall_s', 0):.0f} s"
    if "error" in r:
        return f"{head} ERROR {r['error'][:600]}\n{r.get('trace', '')[-1200:]}"
    alloc = (r.get("after") or {}).get("peak_bytes_in_use")
    compiled_alloc = (r.get("after_compile") or {}).get("peak_bytes_in_use")
    text = (f"{head}: after compile {mib(compiled_alloc)}; compiled peak {mib(r.get('peak'))} ({r.get('source')}), allocator peak "
            f"{mib(alloc)}, temp {mib(r.get('temp'))}, flops {r.get('flops', 0):.4g}, "
            f"s/step {r.get('seconds')}, eliminated {r.get('eliminated')}")  # fmt: skip
    if "plan_s" in r:
        text += (f"; plan {r['plan_s']:.1f} s vs one compile {r['one_compile_s']:.1f} s, budget "
                 f"{mib(r['budget'])}, predicted {mib(r['predicted'])}, compiled "
                 f"{mib(r['compiled'])}")  # fmt: skip
    if r["kind"] == "carried":
        text += f"; made on {r.get('made_on')}, budget {mib(r.get('budget'))}"
    if r.get("warnings"):
        text += f"; warnings {r['warnings']}"
    return text


def gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def mib(b) -> str:
    return "-" if b is None else f"{b / MIB:.2f} MiB"


def make_carry(folder: str) -> None:
    """Plans the mid-size decoder at 50% from shapes on this host and writes the plan file."""
    import remat

    loss, args = shapes("mid")
    p = remat.plan(loss, *args, budget="50%", optimizer=adam(), verbose=False)
    Path(folder).mkdir(parents=True, exist_ok=True)
    p.to_json(Path(folder, PLAN_FILE))
    print(f"wrote {Path(folder, PLAN_FILE)}: budget {mib(p.budget_bytes)}, compiled "
          f"{mib(p.measured_peak_bytes)} on {p.measured.backend}")  # fmt: skip


### The section


def rows_by_key(paths: list[str]) -> dict[tuple, dict]:
    """Every job's row in the JSON files, later files replacing earlier rows of a job."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text()):
            rows[(r["kind"], r["program"], r.get("arg"))] = r
    return rows


def alloc(r: dict, stage: str = "after") -> int | None:
    return (r.get(stage) or {}).get("peak_bytes_in_use")


def pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.2f}%"


def section(gpu: dict[tuple, dict], cpu: dict[tuple, dict], command: str) -> str:
    """The BENCHMARKS.md section from a GPU run's rows (and a CPU run's, side by side)."""
    from bench_common import markdown_table

    any_row = next(r for r in gpu.values() if "error" not in r)
    lines = [
        MARKERS[0],
        "## On a GPU (`benchmarks/gpu_bench.py`)",
        "",
        f"Run on one {any_row['device']} with JAX {any_row['jax']} (the device's own JAX: "
        "remat is tested on 0.10, and reads JAX 0.11's scans through "
        "`remat._core._scan_params.scan_counts`), each job in a process of its own with "
        "`XLA_PYTHON_CLIENT_PREALLOCATE=false`. Reproduce with "
        f"`{command}` on a GPU host; the CPU column with `--only 0,1,2,3,9` on a CPU host.",
        "",
        "**XLA's compiled peak against the allocator.** The Adam step compiled with `jax.jit` "
        "alone (parameters and optimizer state donated), run twice; *other arrays* are the "
        "device's bytes in use before the step that are not its arguments.",
        "",
    ]
    head = ["program", "compiled `peak_memory_in_bytes`", "other arrays on the device",
            "sum", "allocator's peak after 2 runs", "allocator - sum"]  # fmt: skip
    body = []
    for (kind, name, arg), r in gpu.items():
        if kind != "direct" or "error" in r:
            continue
        other = r["args_placed"]["bytes_in_use"] - r["argument"]
        total, seen = r["peak"] + other, alloc(r, "after_run2")
        body.append([f"{NAMES[name]}{', ' + arg if arg else ''}", mib(r["peak"]), mib(other),
                     mib(total), mib(seen), f"{mib(seen - total)} ({pct(seen, total)})"])  # fmt: skip
    lines += [markdown_table(head, body), ""]
    lines += [
        "**A checkpoint outside a loop.** The MLP stack of 8 layers (1024 wide, batch 2048) in "
        "a Python loop, each layer in `jax.checkpoint` or not; `remat.measure` of the gradient:",
        "",
    ]
    head = ["backend", "as written: peak, FLOPs", "checkpointed: peak, FLOPs",
            "`recompute_eliminated`"]  # fmt: skip
    body = []
    for label, rows in (("GPU", gpu), ("CPU", cpu)):
        plain, ck = rows.get(("unrolled", "mlp", None)), rows.get(("unrolled", "mlp", "checkpoint"))
        if not plain or not ck or "error" in plain or "error" in ck:
            continue
        body.append([label, f"{mib(plain['peak'])}, {plain['flops']:.4g}",
                     f"{mib(ck['peak'])}, {ck['flops']:.4g} ({pct(ck['flops'], plain['flops'])})",
                     str(ck["eliminated"])])  # fmt: skip
    lines += [markdown_table(head, body), ""]
    lines += [
        "**`remat.measure` and `remat.plan` on the GPU** (Adam step; *allocator* is the peak "
        "after `remat.measure`'s timed runs, which keep the caller's parameters beside the "
        "copies the step consumes):",
        "",
    ]
    head = ["program", "strategy", "compiled peak", "allocator", "FLOPs vs none",
            "s/step", "CPU: compiled peak"]  # fmt: skip
    body = []
    for name in ("gpt", "mid"):
        none = gpu.get(("peak", name, None), {})
        for (kind, n, arg), r in gpu.items():
            if n != name or kind not in ("peak", "plan", "perlayer") or "error" in r:
                continue
            label = {"peak": arg or "none", "plan": f"plan at {arg}",
                     "perlayer": f"per-layer plan at {arg}"}[kind]  # fmt: skip
            c = cpu.get((kind, n, arg), {})
            seen = mib(alloc(r))
            if (alloc(r, "after_compile") or 0) >= (alloc(r) or 0):  # the compile's scratch
                seen = f"{seen} (the compile's)"
            body.append([NAMES[name], label, mib(r["peak"]), seen,
                         pct(r["flops"], none["flops"]) if none.get("flops") else "-",
                         f"{r['seconds'] * 1e3:.1f} ms" if r.get("seconds") else "-",
                         mib(c.get("peak"))])  # fmt: skip
    lines += [markdown_table(head, body), ""]
    plans = []
    for key in (("plan", "mid", "50%"), ("perlayer", "gpt", "25%")):
        r = gpu.get(key)
        if r and "error" not in r:
            plans.append(
                f"- {NAMES[key[1]]}, {'per-layer ' if key[0] == 'perlayer' else ''}plan at "
                f"{key[2]} planned on the GPU: {r['plan_s']:.1f} s, {r['plan_s'] / r['one_compile_s']:.1f}x "
                f"one compile of the step ({r['one_compile_s']:.1f} s); budget {mib(r['budget'])}, "
                f"predicted {mib(r['predicted'])}, compiled {mib(r['compiled'])} "
                f"({pct(r['predicted'], r['compiled'])} predicted over compiled)."
            )  # fmt: skip
    plan_1b, run_1b = gpu.get(("real", "1b", "plan")), gpu.get(("real", "1b", "run"))
    if plan_1b and run_1b and "error" not in plan_1b and "error" not in run_1b:
        other = run_1b["args_placed"]["bytes_in_use"] - run_1b["argument"]
        seen = alloc(run_1b, "after_run2")
        plans.append(
            f"- Llama-3.2-1B's shapes (16 layers, 4096 tokens, bf16 compute on float32 "
            f"weights, Adam): {gib(plan_1b['baseline'])} un-checkpointed, more than the card "
            f"lends ({gib(run_1b['after']['bytes_limit'])}). Planned there from shapes at "
            f"{gib(plan_1b['budget'])} in {plan_1b['plan_s']:.1f} s "
            f"({plan_1b['plan_s'] / plan_1b['one_compile_s']:.1f}x one compile of "
            f"{plan_1b['one_compile_s']:.1f} s; the step compiled {plan_1b['step_compiles']}x, "
            f"a scan alone {plan_1b['scan_compiles']}x): predicted {gib(plan_1b['predicted'])}, "
            f"compiled {gib(plan_1b['compiled'])}, FLOPs "
            f"{plan_1b['plan_flops'] / plan_1b['baseline_flops']:.3f}x. Loaded at real arrays "
            f"(`remat.load_plan`) and run twice: the allocator peaked at {gib(seen)}, the "
            f"compiled peak plus the {mib(other)} of other arrays on the device to "
            f"{(seen - run_1b['peak'] - other) / 1024:.1f} KiB."
        )
    carried = gpu.get(("carried", "mid", None))
    if carried and "fingerprint" in (carried.get("error") or carried.get("load_plan_error", "")):
        plans.append(
            "- The mid-size plan made on the CPU host from shapes (JAX 0.10.2, `--make-carry`) "
            f"is refused on JAX {any_row['jax']} by `remat.load_plan` and `remat.apply`: JAX "
            "0.11 traces the same loss to another program (a scan's parameters differ), so "
            "the fingerprints differ. The refusal now names both JAX versions "
            "(`Plan.jax_version`); a plan is made with the JAX it runs on."
        )
    elif carried and "error" not in carried:
        plans.append(
            f"- The mid-size plan made on the CPU host (budget {mib(carried['budget'])}, "
            f"{mib(carried['planned_peak'])} there) compiles here to {mib(carried['peak'])}."
        )
    lines += [*plans, "", MARKERS[1]]
    return "\n".join(lines)


NAMES = {"gpt": "demo GPT", "mid": "mid-size decoder", "mlp": "MLP stack"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--carry")
    ap.add_argument("--make-carry")
    ap.add_argument("--json", default="/tmp/gpu_bench.json")
    ap.add_argument("--only", help="comma-separated job indices")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--from-json", nargs="+", help="GPU runs' JSON files: write the section")
    ap.add_argument("--cpu-json", nargs="*", default=[], help="a CPU run's JSON, side by side")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if a.from_json:
        from bench_common import write_section

        command = (
            "PYTHONPATH=src python benchmarks/gpu_bench.py --carry DIR --json PATH "
            "(the 1B rows: GPU_BENCH_BUDGET=59055800320 ... --only 13,14)"
        )
        text = section(rows_by_key(a.from_json), rows_by_key(a.cpu_json), command)
        return write_section(MARKERS, text, not a.no_write)
    if a.child:
        return child(a.child, a.carry)
    if a.make_carry:
        return make_carry(a.make_carry)
    only = [int(i) for i in a.only.split(",")] if a.only else None
    run(Path(a.json), a.carry, only, a.timeout)


if __name__ == "__main__":
    main()
