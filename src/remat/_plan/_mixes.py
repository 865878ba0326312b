"""A program's per-layer options found while the uniform rounds run.

The per-layer options (`_perlayer.period_candidates`) need the calibrated memory model, and
finding them is a dozen solves of the layer's integer program (`_perlayer.pareto_points`:
0.3 s of CPU on the GPT of `benchmarks/vs_torch.py`, a tenth of one compile of its step).
The planner's rounds run on the uniform options first (`_rounds.plan_prepared`), and their
scan-alone checks spend most of their time in XLA, which compiles without Python's lock:
so `prepare` with ``later`` returns the uniform options at once, with the per-layer ones
being found on a thread of their own (`Later`), and `completed` waits for them where they
are first needed (before the rounds' first step compile, `_first.InPlace`). The options are
the same either way: the uniform ones first, the mixes appended after them.

No thread outlives the plan that started it: `finished` waits for it however the plan
ends, so a plan that raises (an infeasible budget, an interrupt) leaves none running. An
error on the thread is raised where the options are completed, with its own message; a
program's knowledge whose options failed is not recalled (`_memo.recall`), so the next plan
finds them again instead of raising that error once more.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from ._perlayer import period_candidates


class Later:
    """The per-layer options of a `Prepared` being found on a thread of their own."""

    def __init__(self, models, cands, stored, slice_, weight) -> None:
        def find():
            clock = time.perf_counter()
            more = period_candidates(models, cands, stored, slice_, weight)
            return tuple(more), time.perf_counter() - clock

        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="remat-mixes")
        self._pending = pool.submit(find)
        pool.shutdown(wait=False)
        self._done: dict[int, tuple[Any, Any]] = {}  # id(prep) -> (prep, completed)

    def failed(self) -> bool:
        """Whether the thread has ended with an error (`complete` raises it)."""
        return self._pending.done() and self._pending.exception() is not None

    def wait(self) -> None:
        """Waits for the thread to end, raising nothing (`complete` raises its error)."""
        concurrent.futures.wait([self._pending])

    def complete(self, prep: Any) -> Any:
        """``prep`` (the uniform options) with the per-layer options appended (the same
        object each time for one ``prep``)."""
        if id(prep) in self._done:
            return self._done[id(prep)][1]
        more, seconds = self._pending.result()
        full = dataclasses.replace(
            prep,
            cands=prep.cands + more,
            options=prep.options + tuple(c.option for c in more),
            offsets=prep.offsets + (len(prep.nodes),) * len(more),
            option_extra=tuple(e + (0.0,) * len(more) for e in prep.option_extra),
            model_seconds=prep.model_seconds + seconds,
            later=None,
        )
        self._done[id(prep)] = (prep, full)
        return full


def finding(prep: Any) -> bool:
    """Whether ``prep``'s per-layer options are still being found (`completed` gives them)."""
    return prep.later is not None


def completed(prep: Any, know: Any = None) -> Any:
    """``prep`` with its per-layer options (itself when it has none pending); ``know`` (a
    `_memo.Knowledge` of ``prep``) then keeps the completed one, for later budgets."""
    if prep.later is None:
        return prep
    full = prep.later.complete(prep)
    if know is not None and know.prepared is prep:
        know.prepared = full
    return full


@contextlib.contextmanager
def finished(know: Any) -> Iterator[None]:
    """Waits, on leaving, for the per-layer options of ``know`` (a `_memo.Knowledge`) still
    being found: however the plan inside ends, no thread of it is left running."""
    try:
        yield
    finally:
        later = know.prepared.later
        if later is not None:
            later.wait()
