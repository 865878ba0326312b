"""The demo's table in BENCHMARKS.md: `remat demo` on the embedded GPT, recorded with its machine.

Runs ``remat demo`` (the same code as ``./dev demo``: every strategy compiled, measured and
timed side by side in this one process), or reads a ``report.json`` that a demo run wrote,
and rewrites the section between ``<!-- demo:start -->`` and ``<!-- demo:end -->`` in
BENCHMARKS.md.

Usage:
  ./dev bench demo_bench                       # run the demo, then record it
  PYTHONPATH=src python benchmarks/demo_bench.py --report remat-demo/report.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

from remat import Report
from remat._cli._cli import main as remat_main
from remat._cli._cli_demo import pick_sentence
from remat._core._io import replace_section

BENCH_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MARKERS = ("<!-- demo:start -->", "<!-- demo:end -->")


def section(report: Report, wall_seconds: float | None, load: float | None = None) -> str:
    """The BENCHMARKS.md section for a demo report."""
    timing = f" The whole demo took {wall_seconds:.0f} s." if wall_seconds else ""
    if load is not None:
        timing += f" The machine's load average was {load:.1f} at the end of the run" + (
            " (other jobs shared the cores, so ms/step is noisy)." if load > 2.5 else "."
        )
    return "\n".join(
        [
            MARKERS[0],
            "## The demo (`remat demo`, `benchmarks/demo_bench.py`)",
            "",
            f"{report.title}. Run {datetime.date.today().isoformat()} on "
            f"{report.machine.describe()}.{timing}",
            "Reproduce with `./dev demo` (prints this table and writes `remat-demo/report.json` "
            "and `remat-demo/pareto.png`), then `./dev bench demo_bench --report "
            "remat-demo/report.json` to record it here (or `./dev bench demo_bench` to do both).",
            "",
            "Peak memory is XLA's compiled memory analysis of the whole training step "
            "(`jax.value_and_grad` of the loss, parameters and gradients included); residuals "
            "are what autodiff keeps for the backward pass, one copy per layer; GFLOPs are "
            "the matmuls of the optimised HLO with the layer loop's trip count. Memory and FLOPs are "
            "exact and repeatable; ms/step is the median of the timed steps after a warm-up.",
            "",
            report.markdown(),
            "",
            pick_sentence(report),
            MARKERS[1],
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="record this report.json instead of running")
    parser.add_argument("--out", type=Path, default=Path("remat-demo"), help="demo output dir")
    parser.add_argument("--no-write", action="store_true", help="print, do not touch the file")
    args, demo_args = parser.parse_known_args(argv)
    wall = load = None
    if args.report is None:
        start = time.perf_counter()
        code = remat_main(["demo", "--out", str(args.out), *demo_args])
        wall = time.perf_counter() - start
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        if code:
            return code
        args.report = args.out / "report.json"
    text = section(Report.from_json(args.report), wall, load)
    if args.no_write:
        print(text)
    else:
        replace_section(BENCH_MD, MARKERS, text)
        print(f"wrote the demo section of {BENCH_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
