"""Candidates the rounds and their search can call over the budget without compiling them:
the line that the candidates checked alone lie on, in the model's bytes.

The integer program weighs every saved byte alike, and XLA does not: at Llama-3-70B shapes
the model weighs a saved value 1.18x its bytes where the scans compiled alone keep 2x (a
candidate saving 15.0 GiB more than another compiles alone to 30.0 GiB more), so every
uniform candidate the planner checked alone lay on one line in the model's predicted bytes,
of slope 1.669, to 0.002 GiB (thirty-seven save sets, planned at the peaks of MaxText's
presets), and the search for a cheaper plan compiled four candidates in a row that the line
put 1.4-2.3% over the budget (`_search.cheaper_candidate`). `surely_over` fits that line
by least squares on at least `POINTS` candidates compiled alone and predicts a candidate
from it only where the candidate lies between the points and the line puts it over by more
than `FLOOR` of the budget and `SAFETY` times the largest distance of a point from the
line; elsewhere the candidate is compiled as before. The line is no law: at Llama-3-8B
shapes the points lie up to 0.9% of the budget off it (two save sets of equal predicted
bytes compile 0.55 GiB apart), at Llama-3.2-1B 3.5%, and the line then calls over only
what it puts over by four times that.

Only the compile is saved: a candidate called over goes where one compiled over goes (it
rules out its tier, steps the model back, is kept as missed), so the rounds
(`_rounds._uniform_rounds`, past the margins' spread) and the search visit what they
visited before (`guess`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ._alone import compiled_alone
from ._memo import choice_key, per_layer

# Candidates compiled alone that a line needs (two always lie on one).
POINTS = 3
# A candidate the line puts over the budget by more than this fraction of the budget, and by
# more than `SAFETY` times the line's largest residual, is not compiled.
FLOOR = 0.005
SAFETY = 4.0


@dataclasses.dataclass(frozen=True)
class Line:
    """Scan-alone bytes as ``intercept + slope * x`` of the model's bytes ``x``
    (``prep.base + choice.model_bytes``), and the largest residual of the points it was
    fitted on."""

    slope: float
    intercept: float
    residual: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit(points: Sequence[tuple[float, float]]) -> Line | None:
    """The least-squares `Line` through ``points`` (``(model bytes, scan-alone bytes)``);
    None with fewer than `POINTS` or all at one model's bytes.

    Example:
      >>> from remat._plan._line import fit
      >>> line = fit([(10.0, 20.0), (20.0, 40.0), (30.0, 61.0)])
      >>> round(line.slope, 3), round(line.residual, 3)
      (2.05, 0.333)
      >>> fit([(10.0, 20.0), (20.0, 40.0)]) is None
      True
    """
    if len(points) < POINTS:
        return None
    n = float(len(points))
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= (1e-9 * max(abs(x) for x, _ in points)) ** 2 * n:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    residual = max(abs(y - intercept - slope * x) for x, y in points)
    return Line(slope, intercept, residual)


def surely_over(prep: Any, pairs: Sequence[tuple[Any, float]], guessed: Any, choice: Any,
                limit: float, budget_bytes: float) -> float | None:  # fmt: skip
    """The scan-alone bytes of uniform ``choice`` on the line through the uniform candidates
    of ``pairs`` (``(choice, scan-alone bytes)``) compiled alone (those whose `choice_key`
    is not in ``guessed``), where that is over ``limit`` (the scan-alone bytes that fit) by
    more than `FLOOR` of ``budget_bytes`` and `SAFETY` times the line's residual, and
    ``choice`` lies between the points in the model's bytes; else None (compile it).

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._line import surely_over
      >>> def c(x):
      ...     return N(model_bytes=x, choices={0: N(pattern=(), names=(str(x),), offload=(),
      ...              schedule="per_step", kept_calls=False)})
      >>> pairs = [(c(x), 2.0 * x) for x in (400.0, 420.0, 480.0)]
      >>> surely_over(N(base=0.0), pairs, set(), c(460.0), 900.0, 1000.0)
      920.0
      >>> surely_over(N(base=0.0), pairs, set(), c(452.0), 900.0, 1000.0) is None  # 0.4%
      True
      >>> surely_over(N(base=0.0), pairs, set(), c(490.0), 900.0, 1000.0) is None  # beyond
      True
    """
    if not _plain(choice):
        return None
    points = [
        (prep.base + c.model_bytes, alone)
        for c, alone in pairs
        if _plain(c) and choice_key(c) not in guessed
    ]
    line = fit(points)
    if line is None:
        return None
    x = prep.base + choice.model_bytes
    if not min(p[0] for p in points) <= x <= max(p[0] for p in points):
        return None  # between the points only: nothing shows the line holds beyond them
    predicted = line(x)
    if predicted - limit > max(FLOOR * budget_bytes, SAFETY * line.residual):
        return predicted
    return None


def guess(prep: Any, know: Any, solution: Any, choice: Any, pairs: Sequence[tuple[Any, float]],
          limit: float, budget_bytes: float) -> float | None:  # fmt: skip
    """`surely_over` for a candidate not yet compiled alone (one that was costs nothing to
    check), recorded in ``know.guessed`` where it is called over."""
    alone = surely_over(prep, pairs, know.guessed, choice, limit, budget_bytes)
    if alone is None or compiled_alone(prep, know, solution, choice):
        return None
    know.guessed.add(choice_key(choice))
    return alone


def _plain(choice: Any) -> bool:
    """One save set in every step of every scan: no per-layer pattern (its program keeps
    more than its save sets', `_search`) and no `remat.Nested` or `remat.Binomial` schedule
    (charged beyond the model once checked, `_alone.check_alone`)."""
    return not per_layer(choice) and all(s.schedule == "per_step" for s in choice.choices.values())
