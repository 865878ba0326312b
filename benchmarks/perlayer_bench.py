"""What per-layer plans cost and gain: solve time, compile time, and FLOPs, beside uniform plans.

On the two models of `benchmarks/vs_torch.py` (the demo GPT's block stack and an MLP stack,
8 layers in one ``lax.scan``), in one process and side by side:

- preparing (`remat._plan._calibrate.prepare`) with and without per-layer options: the
  per-layer options need the layer's Pareto front, found once per program;
- one solve of the integer program (`remat._plan._milp.solve`, the planner's first round) at
  each budget, with the uniform options only and with the per-layer mixes beside them;
- ``remat.plan(..., per_layer=False)`` and ``per_layer=True`` at each budget, each from scratch
  (`_memo.forget`): FLOPs over the un-checkpointed step, compiled peak, the plan's wall and
  CPU time against one compile of the un-checkpointed step (the mean of one compiled just
  before the plan and one just after), and the compile time of the step each plan gives
  (median of `REPEATS` compiles, alternating);
- the forms a per-layer choice can take, compiled side by side (`forms`): two save sets of the
  layer's Pareto front (the first point, which recomputes nothing, and the middle one) as
  the plain scan, as segments (`remat._trace._periodic.segments`: the set in every layer,
  and 3 of 8 layers saving the first and 5 the second) and as groups of 2 layers
  (`periodic_loop` with a period of 2: alternating layers): compile time (median of
  `REPEATS`, alternating), compiled peak and FLOPs.

Usage:
  PYTHONPATH=src python benchmarks/perlayer_bench.py [--arch gpt,mlp] [--budgets 40%,30%]
      [--no-write] [--plans-only]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import remat
import vs_torch
from bench_common import BENCH_MD, MIB, machine_line, markdown_table, print_table, replace_section
from remat._core._budget import parse_budget
from remat._plan import _memo
from remat._plan._alone import charged_options
from remat._plan._calibrate import prepare
from remat._plan._compile import peak_of
from remat._plan._memo import Knowledge
from remat._plan._milp import solve
from remat._plan._perlayer import pareto_points

MARKERS = ("<!-- perlayer:start -->", "<!-- perlayer:end -->")
BUDGETS = DEFAULT_BUDGETS = ("60%", "40%", "30%", "25%", "20%")
REPEATS = 3


def compile_seconds(fn, args) -> float:
    """Seconds to lower and compile ``jax.value_and_grad(fn)`` once (a fresh function each
    time, so nothing is cached)."""
    return compile_times(fn, args)[0]


def compile_times(fn, args) -> tuple[float, float]:
    """`compile_seconds`, and the CPU seconds of this process meanwhile (XLA's threads
    included)."""
    start, cpu = time.perf_counter(), time.process_time()
    jax.jit(jax.value_and_grad(lambda *a: fn(*a))).lower(*args).compile()
    return time.perf_counter() - start, time.process_time() - cpu


def solves(loss, args) -> tuple[list[list[str]], float, float]:
    """Per budget: one first-round solve with uniform options only and with per-layer ones."""
    preps, seconds = {}, {}
    for per_layer in (False, True):
        start = time.perf_counter()
        preps[per_layer] = prepare(loss, args, 0, True, per_layer=per_layer)
        seconds[per_layer] = preps[per_layer].model_seconds
        print(f"  prepare per_layer={per_layer}: {time.perf_counter() - start:.1f} s, "
              f"{len(preps[per_layer].cands)} options", flush=True)  # fmt: skip
    rows = []
    for spec in BUDGETS:
        cells = [spec]
        for per_layer in (False, True):
            prep = preps[per_layer]
            budget = parse_budget(spec, peak_of(prep.baseline))
            options = charged_options(prep, Knowledge(prep))
            start = time.perf_counter()
            s = solve(prep.nodes, budget, options=options, fixed_bytes=prep.base,
                      transient_weight=prep.weight, stored_weight=prep.stored,
                      slice_weight=prep.slice)  # fmt: skip
            took = time.perf_counter() - start
            what = "none fits" if s is None else (
                f"+{s.recompute_flops / prep.baseline.flops:.2%}"
                + (" (per-layer)" if any(prep.cands[o].pattern for o in s.options) else "")
            )  # fmt: skip
            cells += [f"{took:.2f}", what]
        rows.append(cells)
    return rows, seconds[False], seconds[True]


def plans(loss, args) -> list[list[str]]:
    """Per budget: the uniform and the per-layer plan, each from scratch, each against one
    compile of the un-checkpointed step compiled just before it and one just after (their
    mean: the load on this shared host changes within a minute), in wall and CPU seconds."""
    compile_times(loss, args)  # warm: the first compile in a process is slower
    ones = []
    rows = []
    for spec in BUDGETS:
        got = {}
        for per_layer in (False, True):
            _memo.forget()
            before = compile_times(loss, args)
            start, cpu = time.perf_counter(), time.process_time()
            try:
                plan = remat.plan(loss, *args, budget=spec, per_layer=per_layer, verbose=False)
            except remat.InfeasibleBudget:
                got[per_layer] = None
                continue
            took = (time.perf_counter() - start, time.process_time() - cpu)
            after = compile_times(loss, args)
            ones += [before[0], after[0]]
            one = [(b + a) / 2 for b, a in zip(before, after, strict=True)]
            got[per_layer] = (plan, took[0] / one[0], took[1] / one[1])
        if got[False] is None or got[True] is None:
            rows.append([spec, "infeasible", "", "", "", "", "", ""])
            continue
        (uniform, t_u, cpu_u), (mixed, t_m, cpu_m) = got[False], got[True]
        times = {False: [], True: []}
        for _ in range(REPEATS):  # alternating, so that load changes hit both alike
            for key, plan in ((False, uniform), (True, mixed)):
                times[key].append(compile_seconds(plan.fn, args))
        c_u, c_m = (statistics.median(times[k]) for k in (False, True))
        pattern = "; ".join(
            f"{len(s.pattern)} positions saving {[len(n) for n in s.pattern]} values"
            for s in mixed.scans if s.pattern
        ) or "uniform"  # fmt: skip
        rows.append([
            spec,
            f"+{uniform.flops_ratio - 1:.2%} / {uniform.measured_peak_bytes / MIB:.2f}",
            f"+{mixed.flops_ratio - 1:.2%} / {mixed.measured_peak_bytes / MIB:.2f} ({pattern})",
            f"{c_u:.2f} / {c_m:.2f} ({c_m / c_u:.2f}x)",
            f"{t_u:.2f}x / {t_m:.2f}x",
            f"{cpu_u:.2f}x / {cpu_m:.2f}x",
            f"{uniform.solve_seconds:.2f} / {mixed.solve_seconds:.2f}",
            f"{uniform.stats.step_compiles} / {mixed.stats.step_compiles}",
        ])  # fmt: skip
        print("  " + " | ".join(rows[-1]), flush=True)
    return rows, statistics.median(ones) if ones else float("nan")


def forms(loss, args) -> list[list[str]]:
    """The same save sets compiled in each form (see the module docstring)."""
    from remat._trace._tag import ScanChoice, rewrite

    prep = prepare(loss, args, 0, True, per_layer=True)
    mixed = next(c for c in prep.cands if c.pattern)
    model = prep.models[mixed.scan]
    points = pareto_points(next(c for c in prep.cands if c.schedule == "per_step"), model.length,
                           prep.stored, prep.slice, prep.weight)  # fmt: skip
    a, b = (tuple(sorted(model.values[i].name for i in p.saved))
            for p in (points[0], points[len(points) // 2]))  # fmt: skip
    both = tuple(sorted(set(a) | set(b)))
    length = model.length
    shapes = {
        "plain scan, first set in every layer": ScanChoice(names=a),
        "segments, first set in every layer": ScanChoice(names=a, pattern=(a,) * length),
        f"segments, {length - 3} layers the second set then 3 the first":
            ScanChoice(names=both, pattern=(b,) * (length - 3) + (a,) * 3),
        "groups of 2 layers, the second set then the first":
            ScanChoice(names=both, pattern=(b, a)),
        "plain scan, second set in every layer": ScanChoice(names=b),
    }  # fmt: skip
    fns = {label: rewrite(loss, {mixed.scan: c}) for label, c in shapes.items()}
    times = {label: [] for label in fns}
    for _ in range(REPEATS):
        for label, fn in fns.items():
            times[label].append(compile_seconds(fn, args))
    base = remat.measure(loss, *args)
    rows = []
    plain = statistics.median(times[next(iter(fns))])
    for label, fn in fns.items():
        m = remat.measure(fn, *args)
        c = statistics.median(times[label])
        rows.append([label, f"{c:.2f} ({c / plain:.2f}x)", f"{peak_of(m) / MIB:.2f}",
                     f"+{m.flops / base.flops - 1:.2%}"])  # fmt: skip
        print("  " + " | ".join(rows[-1]), flush=True)
    return rows


FORM_HEAD = ("form", "compile s of the step (x the plain scan's)", "compiled peak MiB",
             "FLOPs over none")  # fmt: skip
SOLVE_HEAD = ("budget", "uniform solve s", "uniform FLOPs", "per-layer solve s",
              "per-layer FLOPs")  # fmt: skip
PLAN_HEAD = (
    "budget",
    "uniform plan: FLOPs over none / peak MiB",
    "per-layer plan: FLOPs over none / peak MiB",
    "compile s of the plan's step: uniform / per-layer",
    "plan wall / one compile beside it: uniform / per-layer",
    "plan CPU / that compile's CPU: uniform / per-layer",
    "plan solve s (with tracing): uniform / per-layer",
    "whole-step compiles: uniform / per-layer",
)


def run(kind: str, plans_only: bool = False) -> dict:
    sizes = vs_torch.FULL
    loss = vs_torch.make_jax_loss(kind, sizes["heads"])
    args = (
        jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
        jnp.asarray(vs_torch.init_inputs(kind, **sizes)),
    )
    print(f"== {kind}", flush=True)
    form_rows = [] if plans_only else forms(loss, args)
    solve_rows, prep_u, prep_m = ([], 0.0, 0.0) if plans_only else solves(loss, args)
    plan_rows, one = plans(loss, args)
    return dict(kind=kind, solve_rows=solve_rows, prep=(prep_u, prep_m), plan_rows=plan_rows,
                one=one, form_rows=form_rows)  # fmt: skip


def section(results: list[dict], wall: float) -> str:
    parts = [
        MARKERS[0],
        "## Per-layer plans: solve and compile time (`benchmarks/perlayer_bench.py`)",
        "",
        f"Run {datetime.date.today().isoformat()} on {machine_line()}; {wall:.0f} s in all, "
        "measured under the load shown (other jobs share the 2 cores: compare the two columns "
        "of a row, measured side by side, not rows or runs). Reproduce with "
        "`PYTHONPATH=src python benchmarks/perlayer_bench.py"
        + ("" if BUDGETS == DEFAULT_BUDGETS else f" --budgets {','.join(BUDGETS)}")
        + "`.",
        "",
        "The models of `benchmarks/vs_torch.py` (8 layers in one `lax.scan`). A per-layer "
        "option gives c of the 8 layers one point of the layer's Pareto front and the others "
        "another, and runs as two segments of the scan (one loop each, the stacked inputs "
        "indexed whole); the front is found once per program (the preparing time below), and "
        "each mix is one binary variable of the integer program. A per-layer plan runs the "
        "uniform plan's rounds first; before their first step compile, the per-layer "
        "candidate that beats the uniform one (cheaper, or as cheap and keeping less on its "
        "scans alone) is compiled in its place, where that one does not fit the next one "
        "(once), and the uniform candidate only if neither fits (`remat._plan._first`). A "
        "plan's wall time is given over one compile "
        "of the un-checkpointed step (the mean of one compiled just before the plan and one "
        "just after, so that both see the same load), and its CPU time (all threads) over "
        "theirs; the issue's target is a per-layer first plan under 4x one compile.",
    ]
    for r in results:
        prep_u, prep_m = r["prep"]
        parts += ["", f"### {r['kind']}", "",
                  "The forms, on the same save sets (the first point of the layer's front, "
                  "which recomputes nothing, and its middle one):", "",
                  markdown_table(FORM_HEAD, r["form_rows"]), "",
                  f"Tracing and the cost model: {prep_u:.2f} s uniform, {prep_m:.2f} s with "
                  f"the per-layer options (the Pareto front). One solve of the integer program, with the uniform options and with all:",
                  "", markdown_table(SOLVE_HEAD, r["solve_rows"]), "",
                  f"Plans from scratch (one compile of the un-checkpointed step, median of those "
                  f"beside the plans: {r['one']:.2f} s):",
                  "", markdown_table(PLAN_HEAD, r["plan_rows"])]  # fmt: skip
    parts.append(MARKERS[1])
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    global BUDGETS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--plans-only", action="store_true",
                        help="only the plans table (no forms, no solves; implies --no-write): "
                             "for a short run on another backend")  # fmt: skip
    args = parser.parse_args(argv)
    args.no_write |= args.plans_only
    BUDGETS = tuple(args.budgets.split(","))
    start = time.perf_counter()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}", flush=True)
    results = [run(kind, args.plans_only) for kind in args.arch.split(",")]
    for r in results:
        print_table(f"{r['kind']}: forms", FORM_HEAD, r["form_rows"])
        print_table(f"{r['kind']}: one solve", SOLVE_HEAD, r["solve_rows"])
        print_table(f"{r['kind']}: plans", PLAN_HEAD, r["plan_rows"])
    print(f"load average {os.getloadavg()}")
    if not args.no_write:
        replace_section(BENCH_MD, MARKERS, section(results, time.perf_counter() - start))
        print(f"wrote {BENCH_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
