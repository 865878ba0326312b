"""Llama-shaped steps compiled for TPU slices from this CPU host: MaxText's presets and plans.

Every figure comes from XLA's TPU compiler (libtpu, deviceless: `remat.Target`), for the
slices these sizes train on (one sequence per chip):

- Llama-3.2-1B on a v5e-4 (2x2) and Llama-3-8B on a v5p-8 (2x2x1), data parallel, and
  Llama-3-8B on a v5e-16 (4x4) with FSDP (weights sharded along their model dimension,
  activations constrained to the batch inside the layers, as MaxText's logical axis rules
  shard them), built
  with `remat._models._maxtext` (MaxText's layers and ``checkpoint_name`` s; multi-head
  attention where Llama has 8 key-value heads, and no flash attention, so the attention
  scores are materialised), bfloat16 activations on float32 parameters;
- the un-checkpointed step and MaxText's presets compiled for the same slice: compile time,
  per-chip peak (`remat.measure`'s TPU rule: the HBM of the compiler's buffer assignment), the
  compiler's own ``peak_memory_in_bytes`` beside it, and matmul FLOPs per chip; a step the
  compiler refuses ("Ran out of memory on HBM") is shown with the HBM it asked for;
- ``remat.plan`` at the chip's HBM (16 GiB v5e, 95 GiB v5p; a budget above what the compiler
  gives a program, 15.75 GiB of a v5e's 16, is planned at that), given MaxText's presets
  (``strategies=``, `GIVEN`) or, with ``--own``, not: plan time, compiles, its peak and
  FLOPs. The compiler refuses
  the un-checkpointed step of both, so the planner starts
  from the step that recomputes everything (`remat._plan._baseline`).

Usage (needs libtpu: ``pip install 'remat[tpu]'``):
  PYTHONPATH=src python benchmarks/tpu_bench.py [--quick] [--no-plan] [--no-write]
  PYTHONPATH=src python benchmarks/tpu_bench.py --only 0 --save 1b.json   # one run, saved
  PYTHONPATH=src python benchmarks/tpu_bench.py --only 0 --plan-only --own --stages \
      --save 1b_own.json   # the plan without MaxText's presets, its stages printed
  PYTHONPATH=src python benchmarks/tpu_bench.py --load 1b.json 8b.json    # write the section

``--only``/``--save`` let the runs go in separate processes (each compile uses one core);
``--load`` writes BENCHMARKS.md from the saved rows.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

import remat
from bench_common import BENCH_MD, machine_line, markdown_table, print_table, replace_section
from remat._measure._hbm import compile_measured
from remat._measure._hlo import hlo_flops
from remat._measure._peak import compiled_memory
from remat._measure._step import lower_step
from remat._models._maxtext import PRESETS, decoder_shapes
from remat._shard._target import MESH_AXIS

MARKERS = ("<!-- tpu:start -->", "<!-- tpu:end -->")
GIB = 2.0**30
LLAMA_1B = dict(layers=16, d_model=2048, heads=32, mlp_dim=8192, vocab=128256)
LLAMA_8B = dict(layers=32, d_model=4096, heads=32, mlp_dim=14336, vocab=128256)
# (model, sizes, slice, global batch, sequence, parallelism)
RUNS = [
    ("Llama-3.2-1B", LLAMA_1B, "tpu:v5e-4", 4, 2048, "data"),
    ("Llama-3-8B", LLAMA_8B, "tpu:v5p-8", 4, 4096, "data"),
    ("Llama-3-8B", LLAMA_8B, "tpu:v5e-16", 16, 4096, "fsdp"),
]
QUICK_RUNS = [("Llama-3.2-1B (4 layers)", {**LLAMA_1B, "layers": 4}, "tpu:v5e-4", 4, 1024, "data")]
STRATEGIES = ("none", "minimal", "save_qkv_proj", "full")
# MaxText's presets, given to the planner (`remat.plan`'s ``strategies``): compiled beside its
# own candidates, so that the plan is never dearer than one of them that fits.
GIVEN = tuple("names:" + ",".join(PRESETS[s]) if PRESETS[s] else s
              for s in STRATEGIES if PRESETS[s] is not None)  # fmt: skip
_OOM = re.compile(r"required for HLO temporaries \(([0-9.]+)G\)|Used ([0-9.]+)G of")


def data_parallel(args, target: remat.Target):
    """Data parallelism: the parameters replicated on every chip, the batch split over them.
    (`remat.Target.place`'s FSDP placement alone shards each weight along its largest
    dimension, the vocabulary or MLP one, and XLA then keeps the activations whole on each
    chip: 455.70 G asked per chip for the 8B step; the ``"fsdp"`` runs add the decoder's
    sharding constraints on the activations, see `placed`.)"""
    mesh = target.mesh()
    P = jax.sharding.PartitionSpec

    def on(leaf, spec):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))

    params, tokens = args
    return jax.tree_util.tree_map(lambda p: on(p, P()), params), on(tokens, P("fsdp"))


def placed(preset, sizes: dict, target: remat.Target, parallelism: str):
    """The decoder's loss and arguments on ``target``: ``"data"`` parallel (`data_parallel`),
    or ``"fsdp"``: every weight sharded along its model dimension (`fsdp`) and the
    activations along the batch inside the layers, as MaxText's logical axis rules shard them
    (`remat._models._maxtext.DecoderLayer.activations`)."""
    sizes = {**sizes, "dtype": jnp.bfloat16}
    if parallelism == "fsdp":
        P = jax.sharding.PartitionSpec
        sizes["activations"] = NamedSharding(target.mesh(), P(MESH_AXIS))
        loss, args = decoder_shapes(preset, sizes)
        return loss, fsdp(args, target, sizes["d_model"])
    loss, args = decoder_shapes(preset, sizes)
    return loss, data_parallel(args, target)


def fsdp(args, target: remat.Target, d_model: int):
    """FSDP as MaxText's logical axis rules give it on a mesh of one ``fsdp`` axis: every
    weight sharded along its model dimension (``embed``: the embedding table's columns, the
    logits' and every layer kernel's ``d_model`` side), the tokens along the batch.
    (`remat.Target.place` shards each weight along its largest dimension instead: the
    vocabulary of the embedding table, whose lookup then gathers every chip's tokens.)"""
    mesh = target.mesh()
    P = jax.sharding.PartitionSpec

    def spec(leaf):
        axes = [None] * len(leaf.shape)
        model = [i for i, n in enumerate(leaf.shape) if n == d_model]
        if model:
            axes[model[-1]] = MESH_AXIS
        return NamedSharding(mesh, P(*axes))

    params, tokens = args
    params = jax.tree_util.tree_map(
        lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=spec(p)), params
    )
    batch = NamedSharding(mesh, P(MESH_AXIS))
    return params, jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=batch)


def compile_preset(name: str, sizes: dict, target: remat.Target, parallelism: str) -> dict:
    """One compile of the preset's gradient step for ``target``: memory, FLOPs, seconds."""
    loss, args = placed(PRESETS[name], sizes, target, parallelism)
    start = time.perf_counter()
    try:
        compiled = compile_measured(lower_step(loss, args, 0))
    except Exception as err:  # the TPU compiler's out-of-memory refusal
        found = _OOM.search(str(err))
        if found is None:
            raise
        need = float(found[1] or found[2])
        return dict(name=name, seconds=time.perf_counter() - start, oom=need)
    seconds = time.perf_counter() - start
    memory = compiled_memory(compiled)
    stats = compiled.memory_analysis()
    return dict(
        name=name,
        seconds=seconds,
        peak=memory.peak_bytes,
        source=memory.peak_source,
        backend_peak=int(stats.peak_memory_in_bytes),
        host=int(stats.host_temp_size_in_bytes),
        flops=hlo_flops(compiled.as_text()),
    )


def plan_at_hbm(sizes: dict, target: remat.Target, parallelism: str, given: bool) -> dict:
    """`remat.plan` at the chip's HBM, given MaxText's presets (`GIVEN`) or not (``given``)."""
    loss, args = placed(None, sizes, target, parallelism)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # a budget above what the compiler gives: said below
            warnings.simplefilter("ignore", remat.RematWarning)
            plan = remat.plan(loss, *args, budget=target.hbm_bytes, target=target,
                              verbose=False, strategies=GIVEN if given else ())  # fmt: skip
    except remat.InfeasibleBudget as err:
        return dict(seconds=time.perf_counter() - start, error=str(err).splitlines()[0])
    except ValueError as err:  # the compiler refused even the step that recomputes everything
        if "no checkpointing of the scans fits" not in str(err):
            raise
        asked = re.findall(r"HLO temporaries \(([0-9.]+)G\)", str(err))
        error = f"nothing fits: `full` on every scan asks {asked[-1]} G" if asked else str(err)
        return dict(seconds=time.perf_counter() - start, error=error)
    print(plan.explain(), flush=True)
    return dict(
        seconds=time.perf_counter() - start,
        budget=plan.budget_bytes,
        peak=plan.measured_peak_bytes,
        flops=plan.measured.flops,
        baseline_peak=plan.baseline_peak_bytes,
        baseline_flops=plan.baseline_flops,
        step_compiles=plan.stats.step_compiles,
        compiles=plan.stats.step_compiles + plan.stats.scan_compiles,
        compile_seconds=plan.stats.compile_seconds,
        strategy=_strategy(plan),
    )


def _strategy(plan) -> str:
    """The plan's save set in a few words: per scan, its schedule and saved names."""
    parts = []
    for scan in plan.scans:
        names = ", ".join(n for n in scan.names if not n.startswith("carry")) or "carry only"
        parts.append(f"{scan.schedule!r}: {names}")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small run")
    parser.add_argument("--no-plan", action="store_true", help="presets only")
    parser.add_argument("--plan-only", action="store_true", help="plans only")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--only", type=int, help="run only this entry of RUNS")
    parser.add_argument("--save", help="save the rows to this JSON file (and write nothing)")
    parser.add_argument("--load", nargs="+", help="write BENCHMARKS.md from saved rows")
    parser.add_argument(
        "--own", action="store_true", help="plan without MaxText's presets (no strategies=)"
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="print each stage of the plan with its time (a log of progress)",
    )
    opts = parser.parse_args()
    head = ("model", "slice", "batch x seq", "strategy", "compile s", "peak GiB/chip",
            "compiler peak_memory_in_bytes GiB", "TFLOP/chip", "fits HBM")  # fmt: skip
    plan_head = ("model", "slice", "presets given", "budget GiB", "un-checkpointed GiB (refusal)",
                 "plan peak GiB/chip", "TFLOP/chip", "FLOPs vs un-checkpointed",
                 "plan s (compiling s)", "step / all compiles", "saves")  # fmt: skip
    rows, plan_rows, machines = [], [], []
    if opts.load:
        for path in opts.load:
            saved = json.loads(Path(path).read_text())
            rows += [tuple(r) for r in saved["rows"]]
            # rows saved before the column "presets given" were planned with them
            plan_rows += [tuple(r) if len(r) == len(plan_head) else (*r[:2], "yes", *r[2:])
                          for r in saved["plan_rows"]]  # fmt: skip
            machine = saved["machine"]  # a run's line, or the lines of rows kept from runs
            machines += machine if isinstance(machine, list) else [machine]
        return write(head, rows, plan_head, plan_rows, machines)
    runs = QUICK_RUNS if opts.quick else RUNS
    if opts.stages:
        _print_stages()
    if opts.only is not None:
        runs = [RUNS[opts.only]]

    def save() -> None:  # after every row: a run cut short keeps what it measured
        if opts.save:
            Path(opts.save).write_text(json.dumps(
                dict(rows=rows, plan_rows=plan_rows, machine=machine_line())))  # fmt: skip

    for model, sizes, name, batch, seq, parallelism in runs:
        target = remat.parse_target(name)
        sized = {**sizes, "batch": batch, "seq": seq}
        label = f"{name[4:]} ({target.name[4:]}), {parallelism}"
        if not opts.no_plan:  # the plan first: the slowest, and the figure wanted most
            p = plan_at_hbm(sized, target, parallelism, given=not opts.own)
            given = "no" if opts.own else "yes"
            if "error" in p:
                plan_rows.append((model, label, given, f"{target.hbm_bytes / GIB:.2f}", "",
                                  p["error"],
                                  "", "", f"{p['seconds']:.1f}", "", ""))  # fmt: skip
            else:
                plan_rows.append((model, label, given, f"{p['budget'] / GIB:.2f}",
                                  f"{p['baseline_peak'] / GIB:.2f}", f"{p['peak'] / GIB:.2f}",
                                  f"{p['flops'] / 1e12:.1f}",
                                  f"{p['flops'] / p['baseline_flops']:.3f}x",
                                  f"{p['seconds']:.0f} ({p['compile_seconds']:.0f})",
                                  f"{p['step_compiles']} / {p['compiles']}",
                                  p["strategy"]))  # fmt: skip
            print(plan_rows[-1], flush=True)
            save()
        for strategy in () if opts.plan_only else STRATEGIES:
            r = compile_preset(strategy, sized, target, parallelism)
            if "oom" in r:
                cells = ("refused", f"{r['oom']:.2f} G asked", "", "no")
            else:
                # the budget the planner is held to: the chip's HBM, or less where the
                # compiler gives a program less (15.75 GiB of a v5e's 16)
                fits = "yes" if r["peak"] <= min(target.hbm_bytes, target.usable_bytes) else "no"
                cells = (f"{r['peak'] / GIB:.2f}", f"{r['backend_peak'] / GIB:.2f}",
                         f"{r['flops'] / 1e12:.1f}", fits)  # fmt: skip
            rows.append((model, label, f"{batch} x {seq}", strategy, f"{r['seconds']:.1f}",
                         *cells))  # fmt: skip
            print(rows[-1], flush=True)
            save()
    print_table("TPU compiler, per chip", head, rows)
    if plan_rows:
        print_table("remat.plan at the chip's HBM", plan_head, plan_rows)
    if opts.save or opts.no_write or opts.quick:
        return
    write(head, rows, plan_head, plan_rows, [machine_line()])


def _print_stages() -> None:
    """Prints each stage `remat.plan` reports (its `Progress`), with the seconds since it
    began, whether or not stderr is a terminal: a log of a long plan's progress."""
    from remat._plan._progress import Progress

    def call(self, stage: str) -> None:
        print(f"  [{time.perf_counter() - self.start:7.1f} s] {stage}", flush=True)

    Progress.__call__ = call


def _machines(lines: list[str]) -> str:
    """One host line for runs on the same host, with each run's load average."""
    hosts = {line.split("; load average")[0] for line in lines}
    if len(hosts) != 1 or len(lines) == 1:
        return "; ".join(lines)
    loads = [line.split("; load average", 1)[1].split(" (1/5/15 min)")[0] for line in lines]
    return f"{hosts.pop()}; load average (1/5/15 min) at the end of each run:{';'.join(loads)}"


def write(head, rows, plan_head, plan_rows, machines) -> None:
    """BENCHMARKS.md's TPU section from the rows (``machines``: each run's machine line)."""
    text = "\n".join([
        MARKERS[0],
        "## TPU compiler: Llama-shaped steps on v5e and v5p slices, from a CPU host",
        "",
        "Compiled for TPU slices on this CPU host (XLA's TPU compiler from libtpu, deviceless; "
        "`PYTHONPATH=src python benchmarks/tpu_bench.py`, or one run per process with "
        "`--only N --save FILE`, then `--load FILES`). " + _machines(machines) + ".",
        "Peaks are per chip, HBM as the compiler's buffer assignment holds it (remat's TPU "
        "rule, read from XLA's dump of each compile); the compiler's `peak_memory_in_bytes` "
        "counts on-chip VMEM in on some programs and less than the HBM on others "
        "(docs/tpu.md). `data`: "
        "parameters replicated, the batch split; `fsdp`: every weight sharded along its model "
        "dimension (MaxText's `embed` axis) and the activations along the batch inside the "
        "layers (sharding constraints, `_models/_maxtext.py`); gradients sharded as their "
        "parameters; one sequence per chip; bf16 activations, f32 parameters and gradients "
        "(RoPE's output, and so the attention scores, in f32); multi-head attention without "
        "flash attention. A step the compiler refuses shows the HBM it asked for; `fits HBM` "
        "is at most the chip's HBM and what the compiler gives a program (15.75 GiB of a "
        "v5e's 16). The compiler "
        "refuses every un-checkpointed step, so `remat.plan` starts from the step that "
        "recomputes everything and takes the un-checkpointed step's peak from the refusal "
        "(docs/tpu.md); a budget of a v5e's 16 GiB is planned at the 15.75 GiB the compiler "
        "gives a program. `presets given`: the planner is given MaxText's presets "
        "(`strategies=`: compiled beside its own candidates, so the plan is never dearer "
        "than one that fits; `--own` plans without them). Near a chip's memory the compiler "
        "recomputes values of its own accord, which the cost model does not see: a plan "
        "compiled to more FLOPs than the model counts has candidates with less memory "
        "compiled and compared by their compiled FLOPs (docs/tpu.md). The plan's FLOPs are "
        "against the un-checkpointed step's, counted on its jaxpr (it is refused). Compile "
        "and plan seconds were measured while other jobs loaded this "
        "machine's 2 cores.",
        "",
        markdown_table(head, rows),
        "",
        markdown_table(plan_head, plan_rows) if plan_rows else "",
        MARKERS[1],
    ])  # fmt: skip
    replace_section(BENCH_MD, MARKERS, text)
    print(f"wrote {BENCH_MD}")


if __name__ == "__main__":
    main()
