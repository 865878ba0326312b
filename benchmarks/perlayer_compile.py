"""Where a per-layer step's compile time goes, beside the uniform step's, side by side.

On a model of `benchmarks/vs_torch.py`, three forms of the same step
(``jax.value_and_grad`` of the loss), each lowered and compiled `REPEATS` times in turn
(alternating, a fresh function each time, so nothing is cached):

- the plain scan with the first point of the layer's Pareto front in every layer (the
  uniform plan that recomputes nothing);
- segments (`remat._trace._periodic.segments`) with that point in every layer (one run);
- segments with the front's middle point in the first 5 layers and the first point in the
  last 3 (two runs: a per-layer mix).

For each: the seconds spent tracing and lowering (``jit(...).lower``) and compiling
(``.compile()``, XLA), the number of ``while`` loops and lines of the optimised HLO, the
compiled peak and the FLOPs over the un-checkpointed step. Timings are medians and vary with
the machine's load (printed): compare the forms of one run, not runs.

Usage:
  PYTHONPATH=src python benchmarks/perlayer_compile.py [--arch gpt] [--repeats 5] [--no-write]
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
from remat._trace._tag import ScanChoice, rewrite
from vs_torch_sets import remat_front

REPEATS = 5
MARKERS = ("<!-- perlayer_compile:start -->", "<!-- perlayer_compile:end -->")
HEAD = ("form", "lower s", "compile s", "x plain", "loops", "HLO lines", "peak MiB", "FLOPs")


def forms(front) -> dict[str, ScanChoice]:
    """The three forms of the module docstring, from the layer's Pareto front."""
    first = front[0][1]
    middle = front[len(front) // 2][1]
    both = tuple(sorted(set(first) | set(middle)))
    layers = vs_torch.FULL["layers"]
    return {
        "plain scan, first point in every layer": ScanChoice(names=first),
        "segments, first point in every layer": ScanChoice(names=first, pattern=(first,) * layers),
        "segments, middle point in 5 layers, first in 3": ScanChoice(
            names=both, pattern=(middle,) * (layers - 3) + (first,) * 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args_ = parser.parse_args(argv)
    kind, sizes = args_.arch, vs_torch.FULL
    began = time.perf_counter()
    args = (jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
            jnp.asarray(vs_torch.init_inputs(kind, **sizes)))  # fmt: skip
    loss = vs_torch.make_jax_loss(kind, sizes["heads"])
    base = remat.measure(loss, *args)
    front, scan = remat_front(loss, args, base.flops)
    chosen = forms(front)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in chosen}
    shape: dict[str, tuple[int, int]] = {}
    for _ in range(args_.repeats):
        for label, choice in chosen.items():
            fn = rewrite(loss, {scan.index: choice})
            start = time.perf_counter()
            lowered = jax.jit(jax.value_and_grad(lambda *a, fn=fn: fn(*a))).lower(*args)
            lowered_at = time.perf_counter()
            hlo = lowered.compile().as_text()
            times[label].append((lowered_at - start, time.perf_counter() - lowered_at))
            shape[label] = (hlo.count(" while("), len(hlo.splitlines()))
    rows = []
    reference = None
    for label, choice in chosen.items():
        m = remat.measure(rewrite(loss, {scan.index: choice}), *args)
        lower = statistics.median(t[0] for t in times[label])
        compile_ = statistics.median(t[1] for t in times[label])
        reference = reference or lower + compile_
        rows.append([label, f"{lower:.2f}", f"{compile_:.2f}",
                     f"{(lower + compile_) / reference:.2f}x", str(shape[label][0]),
                     str(shape[label][1]), f"{compiled_peak(m) / MIB:.2f}",
                     f"+{m.flops / base.flops - 1:.2%}"])  # fmt: skip
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print_table(f"{kind}: compile time of the step, median of {args_.repeats} (load {load})",
                HEAD, rows)  # fmt: skip
    command = "PYTHONPATH=src python benchmarks/perlayer_compile.py"
    parts = section_start(MARKERS, "Where a per-layer step's compile time goes "
                          "(`benchmarks/perlayer_compile.py`)", time.perf_counter() - began,
                          command + ("" if kind == "gpt" else f" --arch {kind}"))  # fmt: skip
    parts += [
        "",
        f"The {kind} of `benchmarks/vs_torch.py`; the same step in three forms, lowered and "
        f"compiled {args_.repeats} times in turn (median seconds; measured under the load "
        "shown above, other jobs sharing the 2 cores: compare the rows of this run, not runs). "
        "Lowering is tracing and emitting the program; compiling is XLA's. The loops and lines "
        "are the optimised HLO's.",
        "",
        markdown_table(HEAD, rows),
        "",
        "A mix of two save sets runs as two segments: two forward and two backward loop "
        "bodies where the plain scan has one of each, so XLA compiles more loop code (the "
        "HLO lines); lowering is a small part of the time. Running both segments' "
        "forward passes in one loop (each step the layer's forward under both runs' "
        "policies, each run's residuals written where the layer is its) was tried: XLA did "
        "not merge the two forward computations (the step's FLOPs rose by the forward's), and "
        "the compile time did not fall, so the forms stay one loop per run.",
        MARKERS[1],
    ]
    write_section(MARKERS, "\n".join(parts), not args_.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
