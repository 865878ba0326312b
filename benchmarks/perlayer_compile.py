"""Compile time of a per-layer step beside the uniform step it replaces, interleaved.

On the models of `benchmarks/vs_torch.py` (8 layers in one ``lax.scan``), in one process:

- planned: at each budget, ``remat.plan(..., per_layer=False)`` and ``per_layer=True`` (each
  from scratch), then the step of each plan (``jax.value_and_grad(plan.fn)``) lowered and
  compiled `REPEATS` times, the two plans in turn and the first of each pair alternating (a
  fresh function each time, so nothing is cached), with XLA's default options (what the
  user's ``jax.jit`` compiles) and with the planner's (`remat._plan._compile.COMPILER_OPTIONS`,
  how `remat.plan` verifies a plan). Per plan the median CPU seconds of this process
  (``time.process_time``: the machine's other jobs take little of it) and wall seconds,
  their spread, and the median of the per-pair ratios;
- forms: at each budget whose per-layer plan mixes two save sets, the same step in other
  forms of its save sets, CPU seconds beside the uniform plan's (each split into JAX's
  trace and lowering, and XLA's compile with its default options and with LLVM's
  optimisation off, the planner's options: where the time goes), with the optimised HLO's
  size, the compiled peak and the FLOPs over the un-checkpointed step.

Usage:
  PYTHONPATH=src python benchmarks/perlayer_compile.py [--arch gpt,mlp] [--budgets 40%,25%]
      [--repeats 7] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import remat
import vs_torch
from bench_common import (
    MIB,
    compiled_peak,
    markdown_table,
    print_table,
    section_start,
    write_section,
)
from remat._plan import _memo
from remat._plan._compile import COMPILER_OPTIONS
from remat._trace import _periodic
from remat._trace._tag import ScanChoice, planned_scans, rewrite

REPEATS = 5
FORM_REPEATS = 3
BUDGETS = ("40%", "25%")
MARKERS = ("<!-- perlayer_compile:start -->", "<!-- perlayer_compile:end -->")
OPTIONS = {"default": None, "planner's": COMPILER_OPTIONS}
PLAN_HEAD = ("budget", "options", "uniform plan: CPU s (min-max)", "per-layer plan: CPU s (min-max)",
             "per-layer / uniform, CPU (pairs min-max)", "wall s: uniform / per-layer (ratio)",
             "saved per layer")  # fmt: skip
FORM_HEAD = ("form", "CPU s (x uniform plan)", "of which: lower / LLVM opt", "LLVM opt off",
             "loops", "HLO lines", "peak MiB", "FLOPs")  # fmt: skip


def compile_once(fn, args, options, one_loop: bool = False) -> tuple[float, float, object]:
    """``(wall s, CPU s, compiled)`` of lowering and compiling ``jax.value_and_grad(fn)``;
    ``one_loop``: a per-layer pattern whose sets nest runs in one loop each way
    (`remat._trace._one_loop`, off in the planner's form)."""
    before, _periodic.ONE_LOOP = _periodic.ONE_LOOP, one_loop
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        lowered = jax.jit(jax.value_and_grad(lambda *a: fn(*a))).lower(*args)
        compiled = (
            lowered.compile() if options is None else lowered.compile(compiler_options=options)
        )
        return time.perf_counter() - wall, time.process_time() - cpu, compiled
    finally:
        _periodic.ONE_LOOP = before


def compile_parts(fn, args, one_loop: bool) -> tuple[float, float, float]:
    """CPU seconds of ``(lowering, compiling with XLA's default options, compiling with the
    planner's)`` of the step ``jax.value_and_grad(fn)`` (lowered once, compiled twice)."""
    before, _periodic.ONE_LOOP = _periodic.ONE_LOOP, one_loop
    try:
        cpu = time.process_time()
        lowered = jax.jit(jax.value_and_grad(lambda *a: fn(*a))).lower(*args)
        lower = time.process_time() - cpu
        cpu = time.process_time()
        lowered.compile()
        default = time.process_time() - cpu
        cpu = time.process_time()
        lowered.compile(compiler_options=COMPILER_OPTIONS)
        return lower, default, time.process_time() - cpu
    finally:
        _periodic.ONE_LOOP = before


def interleaved(fns: dict[str, tuple], args, options, repeats: int) -> dict[str, list]:
    """``{label: [(wall, cpu), ...]}``: each ``(fn, one_loop)`` compiled ``repeats`` times,
    in turn, the order rotating each round so that a change of load hits each alike."""
    out: dict[str, list] = {k: [] for k in fns}
    labels = list(fns)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            fn, one_loop = fns[label]
            out[label].append(compile_once(fn, args, options, one_loop)[:2])
    return out


def spread(values) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def both_plans(loss, args, spec: str) -> dict[bool, remat.Plan]:
    """``{per_layer: plan}``: ``remat.plan`` at budget ``spec`` without and with per-layer
    options, each from scratch."""
    got = {}
    for per_layer in (False, True):
        _memo.forget()
        got[per_layer] = remat.plan(loss, *args, budget=spec, per_layer=per_layer,
                                    verbose=False)  # fmt: skip
    return got


def planned(loss, args, budgets, repeats) -> tuple[list[list[str]], dict]:
    rows, plans = [], {}
    for spec in budgets:
        plans[spec] = got = both_plans(loss, args, spec)
        pattern = "; ".join(str([len(n) for n in s.pattern]) for s in got[True].scans
                            if s.pattern) or "uniform"  # fmt: skip
        for name, options in OPTIONS.items():
            t = interleaved(
                {"u": (got[False].fn, False), "p": (got[True].fn, False)}, args, options, repeats
            )
            cpu = {k: [c for _, c in v] for k, v in t.items()}
            wall = {k: statistics.median(w for w, _ in v) for k, v in t.items()}
            pairs = [p / u for u, p in zip(cpu["u"], cpu["p"], strict=True)]
            rows.append([
                spec, name, spread(cpu["u"]), spread(cpu["p"]),
                f"{statistics.median(cpu['p']) / statistics.median(cpu['u']):.2f}x "
                f"({min(pairs):.2f}-{max(pairs):.2f})",
                f"{wall['u']:.2f} / {wall['p']:.2f} ({wall['p'] / wall['u']:.2f}x)",
                pattern,
            ])  # fmt: skip
            print("  " + " | ".join(rows[-1]), flush=True)
    return rows, plans


def forms(loss, args, plan, base_flops, repeats) -> list[list[str]]:
    """The per-layer plan's save sets in each form, beside the uniform plan: CPU seconds of
    lowering and compiling (`compile_parts`), each form in turn, the order rotating each round."""
    uniform, mixed = plan[False], plan[True]
    scan = planned_scans(loss, *args)[0]
    (chosen,) = [s for s in mixed.scans if s.pattern]
    pattern = tuple(tuple(p) for p in chosen.pattern)
    most = max(pattern, key=len)
    mixed_fn = rewrite(loss, {scan.position: ScanChoice(names=chosen.names, pattern=pattern)})
    fns = {
        "the uniform plan (plain scan)": (uniform.fn, False),
        "plain scan, the per-layer plan's larger set in every layer": (
            rewrite(loss, {scan.position: ScanChoice(names=most)}), False),
        "the per-layer plan as segments (the planner's form)": (mixed_fn, False),
        "the per-layer plan in one loop each way (`_one_loop`)": (mixed_fn, True),
    }  # fmt: skip
    t: dict[str, list] = {k: [] for k in fns}
    labels = list(fns)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t[label].append(compile_parts(fns[label][0], args, fns[label][1]))

    def median(label, k):
        return statistics.median(p[k] for p in t[label])

    ref = median("the uniform plan (plain scan)", 0) + median("the uniform plan (plain scan)", 1)
    rows = []
    for label, (fn, one_loop) in fns.items():
        hlo = compile_once(fn, args, None, one_loop)[2].as_text()
        before, _periodic.ONE_LOOP = _periodic.ONE_LOOP, one_loop
        try:
            m = remat.measure(fn, *args)
        finally:
            _periodic.ONE_LOOP = before
        lower, default, off = (median(label, k) for k in range(3))
        cpu = lower + default
        rows.append([label, f"{cpu:.2f} ({cpu / ref:.2f}x)",
                     f"{lower:.2f} / {default - off:.2f}", f"{off:.2f}",
                     str(hlo.count(" while(")), str(len(hlo.splitlines())),
                     f"{compiled_peak(m) / MIB:.2f}", f"+{m.flops / base_flops - 1:.2%}"])  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mlp,gpt")
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    opts = parser.parse_args(argv)
    began = time.perf_counter()
    budgets = opts.budgets.split(",")
    parts = []
    for kind in opts.arch.split(","):
        sizes = vs_torch.FULL
        args = (jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
                jnp.asarray(vs_torch.init_inputs(kind, **sizes)))  # fmt: skip
        loss = vs_torch.make_jax_loss(kind, sizes["heads"])
        base = remat.measure(loss, *args)
        rows, plans = planned(loss, args, budgets, opts.repeats)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        print_table(f"{kind}: the plans' steps, {opts.repeats} compiles each (load {load})",
                    PLAN_HEAD, rows)  # fmt: skip
        mixed = [s for s in budgets if any(p.pattern and len(set(p.pattern)) > 1
                                           for p in plans[s][True].scans)]  # fmt: skip
        form_rows = {s: forms(loss, args, plans[s], base.flops, FORM_REPEATS) for s in mixed}
        for spec, rows_ in form_rows.items():
            print_table(f"{kind} {spec}: forms", FORM_HEAD, rows_)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        parts += [
            "",
            f"### {kind}",
            "",
            f"Load average {load} after this model (1/5/15 min); each step compiled "
            f"{opts.repeats} times per options, interleaved with the other plan's.",
            "",
            markdown_table(PLAN_HEAD, rows),
        ]
        for spec, rows_ in form_rows.items():
            parts += ["", f"The {spec} plan's save sets in other forms (CPU s of lowering and "
                      f"compiling with default options, {FORM_REPEATS} times each, "
                      f"interleaved; of which JAX's lowering and LLVM's optimisation, the "
                      f"default compile less the compile with it off):", "",
                      markdown_table(FORM_HEAD, rows_)]  # fmt: skip
    command = "PYTHONPATH=src python benchmarks/perlayer_compile.py"
    title = (
        "Per-layer plans: compile time against the uniform plan (`benchmarks/perlayer_compile.py`)"
    )
    head = section_start(MARKERS, title, time.perf_counter() - began, command)
    text = "\n".join([*head, "", INTRO, *parts, "", OUTRO, MARKERS[1]])
    write_section(MARKERS, text, not opts.no_write)
    return 0


INTRO = (
    "Measured under load (other jobs share the 2 cores): the times are this process's CPU "
    "seconds (`time.process_time`, which other jobs barely change) with wall seconds beside; "
    "compare the two plans of a row, compiled in turn in one process, not rows or runs. "
    "\"default\" is the compile of `jax.jit` (what the user's step costs, the issue's target); "
    "\"planner's\" is the planner's own verification compile "
    "(`COMPILER_OPTIONS`: LLVM's optimisation off)."
)
OUTRO = (
    "Where the time goes: a plan whose layers save two sets runs as segments (one loop per "
    "run of layers saving one set; XLA removes the loop of a lone layer and inlines it), so "
    "XLA compiles a second copy of the layer, forward and backward: the optimised HLO has "
    "1.9-2.0x the uniform plan's lines, and each part of the compile grows with it (JAX's "
    "lowering, XLA's passes and code generation, LLVM's optimisation: the columns of the "
    "forms tables). A plan with one set in every layer as segments (chosen for its smaller "
    "peak at equal FLOPs) costs only the segments' custom VJP; the plain scan with the larger "
    "set in every layer compiles within about 1.1x of the uniform plan: what costs is a "
    "second copy of the layer: one even of the same set costs what the plan "
    "costs (`benchmarks/perlayer_copies.py`: the uniform plan's own set split as the "
    "per-layer plan splits, 1.57-1.69x on the GPT, as the plans' 1.58-1.62x), and XLA:CPU "
    "reuses a kernel only between runs of the same length (two runs of 4 layers: 1.29-1.36x). "
    "The one-loop form (`remat._trace._one_loop`, for sets that nest, as the "
    "planner's do) has one forward body and one backward VJP for all layers, a layer saving "
    "less computing in a `lax.switch` what it did not keep and the values of its "
    "recomputation that the VJP would compute again, so it recomputes what segments do (the "
    "same FLOPs). It compiles in less where the layer is large (the GPT), hardly less on the "
    "MLP stack (whose switch branch is most of a layer's forward pass), and peaks higher: a "
    "loop holds its buffers to its end, so a layer saving less recomputes beside every other "
    "layer's values, where segments run it once the other run's values are freed; and the "
    "switch computes what it gives the VJP before the VJP's backward pass starts, where "
    "segments compute each value when XLA's schedule needs it. Read with `remat.memory` on "
    "the GPT's 25% plan (1 layer saving 2 values, 7 saving 3): one-loop 54.43 MiB against "
    "segments' 51.18; at its peak (the attention's backward pass in a layer saving 3) the "
    "saved values are segments' (27.02 against 27.03 MiB), but the cotangent of the MLP's "
    "up-projection (2 MiB) is live from the MLP's backward pass to the end of the layer's "
    "(XLA schedules the matmul of that projection's parameter gradient after the switch), "
    "beside 1 MiB more recomputed values. Making the VJP's cotangents wait for the switch's "
    "outputs (so that the switch runs first) raises the peak to 60.67 MiB. The planner "
    "keeps segments. "
    "Tried and not kept: "
    "the switch around the whole VJP of each set (one forward body, a backward per set: the "
    "same FLOPs, MLP 25% 1.39x with a peak 3.5 MiB over the segments', the recomputing "
    "layer's working set beside every buffer); the switch giving the VJP every value its "
    "backward pass reads (GPT 25% 58.92 MiB, MLP 41.28: elementwise values XLA would fuse "
    "are written out); the recomputation in a `while` loop of zero or one step whose state "
    "is the buffer, or the buffer passed through the switch, to write in place (no lower "
    "peak: XLA copies a buffer passed through a `switch` whole, and a matmul's output is "
    "written apart from the slot it goes to either way); one forward loop with a backward "
    "loop per run (no faster on the GPT plans, slower on the MLP); the lone layer kept as a "
    "loop, or its checkpoint without `prevent_cse` (no change: XLA removes a loop of one step "
    "either way)."
)

if __name__ == "__main__":
    sys.exit(main())
