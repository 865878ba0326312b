"""The first plan's time of two versions of remat, side by side.

``scale_bench.py``'s decoder at one of its shapes, planned at 50% from shapes alone, in fresh
processes that alternate between the two source trees (so both see the same load on a
shared machine).

Each run prints one compile of the step (XLA's default options), the first plan's wall time
and its ratio to that compile, its step and scan-alone compiles, FLOPs and compiled peak.

Usage:
  PYTHONPATH=src python benchmarks/plan_time_ab.py --before OLD/src --after src \\
      [--model Llama-3-70B] [--repeats 2]

``OLD/src`` is another checkout's ``src`` folder (e.g. ``git worktree add /tmp/old
<commit>``). Nothing is written to BENCHMARKS.md: the numbers are quoted where they are read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from scale_bench import MODELS


def child(model: str) -> None:
    import optax

    import remat
    from remat._models._maxtext import decoder_shapes
    from scale_bench import compile_seconds, sizes_of

    opt = optax.adam(1e-4)
    loss, args = decoder_shapes(None, sizes_of(MODELS[model], 4096))
    one, _ = compile_seconds(loss, args, opt)
    start = time.perf_counter()
    p = remat.plan(loss, *args, budget="50%", optimizer=opt, verbose=False)
    seconds = time.perf_counter() - start
    print(json.dumps(dict(
        compile=one, plan=seconds, steps=p.stats.step_compiles, scans=p.stats.scan_compiles,
        flops=p.measured.flops, peak=p.measured_peak_bytes, load=os.getloadavg()[0],
    )))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other version's src folder")
    parser.add_argument("--after", required=True, help="this version's src folder")
    parser.add_argument("--model", default="Llama-3-70B", choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(args.repeats):
        for label, src in (("before", args.before), ("after", args.after)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(src), here]))
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", args.model],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if not lines:
                print(f"{label}: failed: {done.stderr.strip()[-300:]}", flush=True)
                continue
            r = json.loads(lines[-1])
            print(
                f"{args.model} {label:6s} compile {r['compile']:5.1f} s  plan {r['plan']:5.1f} s "
                f"({r['plan'] / r['compile']:.1f}x)  {r['steps']} + {r['scans']} compiles  "
                f"{r['flops'] / 1e15:.3f} PFLOP  {r['peak'] / 2**30:.2f} GiB  load {r['load']:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
