"""Where one first plan spends its time: its phases, its scan-alone compiles, its solves.

One model of `benchmarks/vs_torch.py` planned once from scratch at one budget (per-layer
options on unless ``--uniform``), in this process, beside one compile of the un-checkpointed
step just before it and one just after (their mean is the "one compile" every time is given
over, as in `benchmarks/perlayer_bench.py`). The plan is split where the planner's own
functions are entered (the private names below, wrapped for the run and put back after):

- preparing: `remat._plan._calibrate.prepare` (the un-checkpointed step compiled beside the
  calibration programs, the tracing and the cost model);
- the uniform search: from there to `remat._plan._first.instead` (a per-layer plan), or to the
  first `remat._plan._rounds._verify` (a uniform one);
- the per-layer search: from `instead` to its first `_verify`;
- verifying: from the first `_verify` to the end (the step compiles, what runs beside them).

For each phase: its wall and CPU seconds (all threads) over the one compile's, the
scan-alone programs it lowered (`remat._plan._body._lowered`: how many names each saves, or
per layer for a per-layer mix) and the seconds HiGHS held its lock on the planner's thread
(`remat._plan._milp._HIGHS`: solves on the thread finding the per-layer options are counted
apart). Nothing is written to BENCHMARKS.md: the numbers are quoted where they are read, and
under load only the ratios mean anything.

Usage:
  PYTHONPATH=src python benchmarks/first_plan_phases.py [--arch gpt] [--budget 25%] [--uniform]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import remat
import vs_torch
from remat._plan import _body, _calibrate, _first, _memo, _milp, _rounds

MIB = 2**20


class Recorder:
    """Marks (``(label, wall, cpu)``), lowered scan-alone programs and HiGHS's lock held, per
    thread, in the order they happen."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, float]] = []
        self.lowered: list[tuple[float, str]] = []
        self.held: list[tuple[float, float, str]] = []  # (start, seconds, thread)
        self.lock = threading.Lock()

    def mark(self, label: str) -> None:
        self.marks.append((label, time.perf_counter(), time.process_time()))


class TimedLock:
    """`_milp._HIGHS` with the seconds it is held recorded (`Recorder.held`)."""

    def __init__(self, rec: Recorder) -> None:
        self.inner, self.rec, self.start = threading.Lock(), rec, 0.0

    def __enter__(self) -> None:
        self.inner.acquire()
        self.start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.rec.held.append((self.start, time.perf_counter() - self.start,
                              threading.current_thread().name))  # fmt: skip
        self.inner.release()


def _replace(original: Callable, wrapper: Callable, undo: list) -> None:
    """``wrapper`` wherever a ``remat`` module holds ``original``."""
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("remat"):
            continue
        for name, value in list(vars(module).items()):
            if value is original:
                setattr(module, name, wrapper)
                undo.append((module, name, original))


def _marking(rec: Recorder, label: str, original: Callable) -> Callable:
    """``original`` marking ``label`` when entered and ``label + " done"`` when it returns."""

    def wrapped(*args, **kwargs):
        rec.mark(label)
        try:
            return original(*args, **kwargs)
        finally:
            rec.mark(label + " done")

    return wrapped


def _label(choice: Any) -> str:
    if choice is None or choice.names is None:
        return "as written"
    if choice.pattern:
        return "mix " + ",".join(str(len(p)) for p in choice.pattern)
    return f"{len(choice.names)} names"


def instrumented(rec: Recorder) -> list:
    """Wraps the planner's functions named in the module docstring; returns what to undo."""
    undo: list = []
    for module, name, label in ((_calibrate, "prepare", "prepare"), (_first, "instead", "instead"),
                                (_rounds, "_verify", "verify")):  # fmt: skip
        original = getattr(module, name)
        _replace(original, _marking(rec, label, original), undo)
    lowered = _body._lowered

    def lowering(info, choice, length, device=None):
        rec.lowered.append((time.perf_counter(), _label(choice)))
        return lowered(info, choice, length, device)

    _replace(lowered, lowering, undo)
    undo.append((_milp, "_HIGHS", _milp._HIGHS))
    _milp._HIGHS = TimedLock(rec)
    return undo


def one_compile(loss, args) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    jax.jit(jax.value_and_grad(lambda *a: loss(*a))).lower(*args).compile()
    return time.perf_counter() - start, time.process_time() - cpu


def phases(rec: Recorder, start: tuple[float, float], end: tuple[float, float]) -> list:
    """``(name, (wall, cpu) at its start, at its end)`` of each phase (module docstring)."""
    at = {}
    for label, wall, cpu in rec.marks:
        at.setdefault(label, (wall, cpu))
    prepared = at.get("prepare done", start)
    searched = at.get("instead")
    verified = next(((w, c) for label, w, c in rec.marks
                     if label == "verify" and (searched is None or w >= searched[0])), end)  # fmt: skip
    bounds = [("preparing", start), ("uniform search", prepared)]
    if searched is not None:
        bounds.append(("per-layer search", searched))
    bounds.append(("verifying", verified))
    return [(name, at_, bounds[k + 1][1] if k + 1 < len(bounds) else end)
            for k, (name, at_) in enumerate(bounds)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt", choices=("gpt", "mlp"))
    parser.add_argument("--budget", default="25%")
    parser.add_argument("--uniform", action="store_true", help="per_layer=False")
    args_ = parser.parse_args(argv)
    sizes = vs_torch.FULL
    loss = vs_torch.make_jax_loss(args_.arch, sizes["heads"])
    args = (
        jax.tree.map(jnp.asarray, vs_torch.init_params(args_.arch, **sizes)),
        jnp.asarray(vs_torch.init_inputs(args_.arch, **sizes)),
    )
    one_compile(loss, args)  # warm: the first compile in a process is slower
    before = one_compile(loss, args)
    rec = Recorder()
    undo = instrumented(rec)
    _memo.forget()
    start = (time.perf_counter(), time.process_time())
    try:
        plan = remat.plan(loss, *args, budget=args_.budget, per_layer=not args_.uniform,
                          verbose=False)  # fmt: skip
    finally:
        end = (time.perf_counter(), time.process_time())
        for module, name, value in reversed(undo):
            setattr(module, name, value)
    after = one_compile(loss, args)
    one = [(b + a) / 2 for b, a in zip(before, after, strict=True)]
    main_thread = threading.main_thread().name
    print(f"{args_.arch} at {args_.budget}, per_layer={not args_.uniform}: "
          f"+{plan.flops_ratio - 1:.2%} FLOPs, {plan.measured_peak_bytes / MIB:.2f} MiB, "
          f"{plan.stats.step_compiles} step and {plan.stats.scan_compiles} scan compiles; "
          f"one compile {one[0]:.2f} s wall, {one[1]:.2f} s CPU")  # fmt: skip
    print(
        f"{'phase':18s} {'wall x':>7s} {'CPU x':>7s} {'HiGHS x':>8s}  scan-alone programs lowered"
    )
    for name, at, stop in phases(rec, start, end):
        lowered = [label for t, label in rec.lowered if at[0] <= t < stop[0]]
        highs = sum(
            s for t, s, thread in rec.held if at[0] <= t < stop[0] and thread == main_thread
        )
        print(f"{name:18s} {(stop[0] - at[0]) / one[0]:7.2f} {(stop[1] - at[1]) / one[1]:7.2f} "
              f"{highs / one[0]:8.2f}  {'; '.join(lowered) or '-'}")  # fmt: skip
    other = sum(s for _, s, thread in rec.held if thread != main_thread)
    print(f"{'the plan':18s} {(end[0] - start[0]) / one[0]:7.2f} {(end[1] - start[1]) / one[1]:7.2f} "
          f"{sum(s for _, s, t in rec.held if t == main_thread) / one[0]:8.2f}  "
          f"(HiGHS on other threads: {other / one[0]:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
