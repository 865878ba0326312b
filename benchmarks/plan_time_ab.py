"""The first plan's time of two versions of remat, side by side.

``scale_bench.py``'s decoder at one of its shapes, planned at 50% from shapes alone, in fresh
processes that alternate between the two source trees (so both see the same load on a
shared machine).

Each run prints one compile of the step (XLA's default options), the first plan's wall time
and its ratio to that compile, the same in the process's CPU seconds (steadier on a loaded
machine, but blind to what runs beside a compile on another core), its step and scan-alone compiles, FLOPs and compiled peak.
``--budgets 50%,70%,35%`` plans each budget in turn in the same process (the first a first
plan, the others re-plans, as `scale_bench.py`'s size rows do) and prints a line for each.

Usage:
  PYTHONPATH=src python benchmarks/plan_time_ab.py --before OLD/src --after src \\
      [--model Llama-3-70B] [--repeats 2] [--budgets 50%[,70%,35%]]

``OLD/src`` is another checkout's ``src`` folder (e.g. ``git worktree add /tmp/old
<commit>``). Nothing is written to BENCHMARKS.md: the numbers are quoted where they are read.

``--scan-options`` instead compiles the planner's four calibration programs of the model's
scan alone (every needed value saved, none, every unfused value, as written) with the step's
options and with a scan's (`remat._plan._compile.scan_options`), alternating, and prints the
CPU seconds of each compile and whether their memory analyses agree:

  PYTHONPATH=src python benchmarks/plan_time_ab.py --scan-options [--model Llama-3-8B]

``--lowering`` lowers the calibration programs but the one as written (`_plan._body`) from
the scan's forward program traced once and, alternating, traced with each save set, and
prints the median CPU seconds of each way:

  PYTHONPATH=src python benchmarks/plan_time_ab.py --lowering [--model Llama-3-70B]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from scale_bench import MODELS


def child(model: str, budgets: str) -> None:
    import optax

    import remat
    from remat._models._maxtext import decoder_shapes
    from scale_bench import compile_seconds, sizes_of

    opt = optax.adam(1e-4)
    loss, args = decoder_shapes(None, sizes_of(MODELS[model], 4096))
    cpu = time.process_time()
    one, _ = compile_seconds(loss, args, opt)
    one_cpu = time.process_time() - cpu
    for budget in budgets.split(","):  # the first a first plan, the others re-plans
        start, cpu = time.perf_counter(), time.process_time()
        try:
            p = remat.plan(loss, *args, budget=budget, optimizer=opt, verbose=False)
        except remat.InfeasibleBudget as err:
            seconds = time.perf_counter() - start
            row = dict(infeasible=True, smallest=err.smallest_peak_bytes)
        else:
            seconds = time.perf_counter() - start
            row = dict(infeasible=False, steps=p.stats.step_compiles, flops=p.measured.flops,
                       scans=p.stats.scan_compiles, peak=p.measured_peak_bytes)  # fmt: skip
        print(json.dumps(dict(row, budget=budget, compile=one, plan=seconds,
                              compile_cpu=one_cpu, plan_cpu=time.process_time() - cpu,
                              load=os.getloadavg()[0])))  # fmt: skip


def calibration_points(model: str):
    """The model's scan (`ScanInfo`), its length, and the planner's calibration save sets of
    it (every needed value saved, none, every unfused value, as written)."""
    from remat._models._maxtext import decoder_shapes
    from remat._plan._costmodel import model_scans
    from remat._plan._options import assemble, candidates, fixed_choice
    from remat._trace._tag import planned_scans
    from scale_bench import sizes_of

    loss, args = decoder_shapes(None, sizes_of(MODELS[model], 4096))
    (info,) = infos = planned_scans(loss, *args)
    models = model_scans(infos)
    cands = candidates(models, False)
    _, _, offsets = assemble(cands)
    points = {
        str(save): fixed_choice(cands, offsets, models, [0], save=save).choices[info.position]
        for save in (True, False, "unfused")
    }
    points["as written"] = None
    return info, models[0].length, points


def scan_options(model: str) -> None:
    from remat._measure._peak import compiled_memory
    from remat._plan._body import lower_scan
    from remat._plan._compile import COMPILER_OPTIONS, scan_options

    info, length, points = calibration_points(model)
    for k, (label, choice) in enumerate(points.items()):
        lowered = lower_scan(info, choice, length)
        runs = [("step's", COMPILER_OPTIONS), ("scan's", scan_options())]
        memories = {}
        for name, options in runs if k % 2 == 0 else runs[::-1]:
            cpu = time.process_time()
            memories[name] = compiled_memory(lowered.compile(options))
            print(f"{model} scan alone, {label:10s} {name} options: "
                  f"{time.process_time() - cpu:5.2f} s of CPU", flush=True)  # fmt: skip
        step, scan = memories.values()
        print(f"  same memory analysis: {step == scan}", flush=True)


def lowering(model: str, repeats: int) -> None:
    from remat._plan import _body

    info, length, points = calibration_points(model)
    derivable = _body._derivable
    seconds: dict[str, list[float]] = {"derived": [], "traced": []}
    for k in range(2 * repeats):
        for how in ("derived", "traced") if k % 2 == 0 else ("traced", "derived"):
            _body._derivable = derivable if how == "derived" else (lambda _: False)
            for choice in points.values():
                if choice is not None:
                    cpu = time.thread_time()
                    _body.lower_scan(info, choice, length)
                    seconds[how].append(time.thread_time() - cpu)
    _body._derivable = derivable
    for how, s in seconds.items():
        print(f"{model} scan alone lowered, {how}: median {sorted(s)[len(s) // 2]:.3f} s of CPU "
              f"({len(s)} lowerings); load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the other version's src folder")
    parser.add_argument("--after", help="this version's src folder")
    parser.add_argument("--scan-options", action="store_true")
    parser.add_argument("--lowering", action="store_true")
    parser.add_argument("--model", default="Llama-3-70B", choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--budgets",
        default="50%",
        help="planned in turn in each process: a first plan, then re-plans",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.budgets)
        return
    if args.scan_options:
        scan_options(args.model)
        return
    if args.lowering:
        lowering(args.model, args.repeats)
        return
    if not args.before or not args.after:
        parser.error("give --before and --after (two src folders), --scan-options or --lowering")
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(args.repeats):
        for label, src in (("before", args.before), ("after", args.after)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(src), here]))
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", args.model,
                 "--budgets", args.budgets],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if not lines:
                print(f"{label}: failed: {done.stderr.strip()[-300:]}", flush=True)
                continue
            for line in lines:
                print(f"{args.model} {label:6s} {_row(json.loads(line))}", flush=True)


def _row(r: dict) -> str:
    head = (f"{r['budget']:>4s} compile {r['compile']:5.1f} s  plan {r['plan']:5.1f} s "
            f"({r['plan'] / r['compile']:.2f}x; CPU {r['compile_cpu']:.1f} s, "
            f"{r['plan_cpu']:.1f} s, {r['plan_cpu'] / r['compile_cpu']:.2f}x)")  # fmt: skip
    if r["infeasible"]:
        return (
            f"{head}  infeasible (smallest {r['smallest'] / 2**30:.2f} GiB)  load {r['load']:.1f}"
        )
    return (f"{head}  {r['steps']} + {r['scans']} compiles  {r['flops'] / 1e15:.3f} PFLOP  "
            f"{r['peak'] / 2**30:.2f} GiB  load {r['load']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
