"""Per-layer candidates: a scan's layers given two save sets that alternate with a period.

A uniform plan saves one set in every layer, so the memory it can reach comes in steps: the
points of one layer's Pareto front (saved bytes against recomputed FLOPs), times the number of
layers. Between two such points a per-layer plan gives ``c`` positions of every ``g`` the
first set and the others the second: its bytes and FLOPs are the mix of the two points'
(``c / g`` of one and the rest of the other), and the memory between the steps is reached at
the FLOPs between them, as torch's per-node partitioner and torchtitan's "checkpoint every
Nth layer" reach it.

The front is found once per program, before any budget (`pareto_points`): the integer
program of the scan's ``per_step`` option alone, solved for the fewest FLOPs below each
point's memory in turn, with the calibrated weights. Each mix of two points is then one more
`Option` of the scan, without nodes (`period_candidates`): its saved bytes and FLOPs are
the positions' sums, its sliced bytes and transient memory the largest position's (the
backward pass differentiates one position at a time), so a solve with per-layer options grows by a binary variable per mix, not by copies of the layer's
graph. A uniform plan is never among the mixes (two different points each); the ``per_step``
option keeps every save set reachable. A period equal to the scan's length is one group of
all its layers, without a loop: it gives any number of layers saving one set (3 of 8), and
it also offers each point alone at every layer (no stacked copy of the first layer's input).

The planner runs its rounds on the uniform options first and lets the per-layer ones compete
only against the plan those verified (`remat._plan._rounds`), so a per-layer plan never
recomputes more than the uniform plan at the same budget.

What a group body keeps beyond this model (a position's parameter gradients live until the
group's end) is charged to the option the first time one of its period on its scan is checked
alone (`_alone.check_alone`), and from then on to the others of that period (`shared_extra`).

A decoded per-layer choice runs as `remat._trace._periodic.periodic_loop`; its `ScanPlan`
records the save set of each position (``pattern``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

from .._trace._periodic import Period, periods
from ._costmodel import ScanModel
from ._milp import Option, solve
from ._options import Candidate

# The largest period the planner offers: a group body holds this many copies of the layer,
# and compile time grows with it (see `remat._trace._periodic`).
PLANNED_PERIOD = 8

# Points of a layer's Pareto front kept (the least memory first dropped beyond them): each pair
# of points, mixed at each period, is one option.
MOST_POINTS = 12


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of a layer's Pareto front: a save set of the uniform ``per_step`` plan.

    Attributes:
      saved: indices of the scan's values it saves.
      step_bytes: bytes it saves per layer (values stored once per step).
      flops: FLOPs it recomputes per layer.
      transient: one layer's materialised recomputed bytes.
    """

    saved: frozenset[int]
    step_bytes: float
    flops: float
    transient: float


def pareto_points(
    cand: Candidate,
    length: int,
    stored: float = 1.0,
    slice_: float = 1.0,
    weight: float = 1.0,
    most: int = MOST_POINTS,
) -> list[Point]:
    """The Pareto front of a ``per_step`` candidate's save sets, fewest FLOPs first: each the
    cheapest set with less memory than the one before (``stored * saved + slice_ * one step's
    saved + weight * transient``, the memory model's terms), to the least memory.

    Example:
      >>> from remat._plan._milp import Node, Option
      >>> from remat._plan._options import Candidate
      >>> from remat._plan._perlayer import pareto_points
      >>> a = Node(bytes=4, flops=20, multiplicity=8, repeats=8, needed=True)
      >>> cand = Candidate(0, "per_step", Option(group=0), (a,), False)
      >>> [(sorted(p.saved), p.step_bytes, p.flops) for p in pareto_points(cand, 8)]
      [([0], 4.0, 0.0), ([], 0.0, 20.0)]
    """
    nodes = list(cand.nodes)
    weights = dict(stored_weight=stored, slice_weight=slice_, transient_weight=weight)
    budget = stored * sum(n.bytes * n.multiplicity for n in nodes)
    budget += slice_ * sum(n.bytes for n in nodes) + weight * sum(n.bytes for n in nodes) + 1.0
    points: list[Point] = []
    last = math.inf
    while len(points) < most:
        s = solve(nodes, budget, **weights)
        if s is None:
            break
        memory = stored * s.saved_bytes + slice_ * s.slice_bytes + weight * s.transient_bytes
        if memory >= last:
            break
        last = memory
        points.append(
            Point(
                saved=s.saved,
                step_bytes=float(s.slice_bytes),
                flops=s.recompute_flops / length,
                transient=float(s.transient_bytes),
            )
        )
        budget = memory - max(1.0, 1e-6 * memory)
    return points


def period_candidates(
    models: Sequence[ScanModel],
    cands: Sequence[Candidate],
    stored: float = 1.0,
    slice_: float = 1.0,
    weight: float = 1.0,
    most: int = PLANNED_PERIOD,
) -> list[Candidate]:
    """The per-layer candidates of every scan (see the module docstring): for each period
    ``g`` dividing its length (up to ``most``) and each pair of points of its front, ``c`` of
    ``g`` positions saving the first set (``c`` prime to ``g``: other mixes are a shorter
    period's), the others the second; the positions saving less come first (their
    recomputation then runs last in the backward pass, when fewer saved values are live).
    With ``g`` the scan's length (one group, no loop: `remat._trace._periodic`), also each
    point alone at every position: the same save set without the scan, whose first layer's
    input is the initial carry rather than a copy of it."""
    out = []
    for k, model in enumerate(models):
        gs = periods(model.length, most)
        uniform = next((c for c in cands if c.scan == k and c.schedule == "per_step"), None)
        if not gs or uniform is None:
            continue
        points = pareto_points(uniform, model.length, stored, slice_, weight)
        for g in gs:
            steps = model.length // g
            for a, b in itertools.combinations(points, 2):
                for c in range(1, g):
                    if math.gcd(c, g) != 1:
                        continue
                    out.append(_mix(k, g, steps, ((b, g - c), (a, c)), model))
            if g == model.length:  # one group: each point as a form of its own
                out += [_mix(k, g, 1, ((p, g),), model) for p in points]
    return out


def _mix(scan: int, g: int, steps: int, parts, model: ScanModel) -> Candidate:
    """The candidate whose positions save ``parts``: ((point, positions), ...), in order."""
    per_group = sum(p.step_bytes * n for p, n in parts)
    once = {i for p, _ in parts for i in p.saved if model.values[i].invariant}
    option = Option(
        group=scan,
        bytes=steps * per_group + sum(model.values[i].bytes for i in once),
        flops=steps * sum(p.flops * n for p, n in parts),
        transient=max(p.transient for p, _ in parts),
        sliced=max(p.step_bytes for p, _ in parts),
    )
    pattern = tuple(p.saved for p, n in parts for _ in range(n))
    return Candidate(scan, Period(g), option, (), False, pattern)


def shared_extra(cands: Sequence[Candidate], extra: dict[int, float], o: int) -> float | None:
    """What a per-layer option ``o`` not yet checked alone is charged beyond the model: the
    mean of the charges measured on the other options of its scan and period (the group
    body's own memory, see the module docstring), or None."""
    cand = cands[o]
    if not cand.pattern:
        return None
    known = [
        v
        for j, v in extra.items()
        if cands[j].pattern and cands[j].scan == cand.scan and cands[j].schedule == cand.schedule
    ]
    return sum(known) / len(known) if known else None


def describe(pattern: Sequence[Sequence[str]], length: int, label=None) -> list[str]:
    """One line per distinct save set of a pattern: which layers save what.

    Example:
      >>> from remat._plan._perlayer import describe
      >>> describe([("a", "b"), ()], 8)
      ['layers 0,2,4,6 save {a, b}', 'layers 1,3,5,7 save nothing']
    """
    label = label or (lambda name: name)
    g = len(pattern)
    sets: dict[tuple[str, ...], list[int]] = {}
    for k, names in enumerate(pattern):
        sets.setdefault(tuple(names), []).extend(range(k, length, g))
    lines = []
    for names, layers in sets.items():
        what = "{" + ", ".join(label(n) for n in names) + "}" if names else "nothing"
        lines.append(f"layers {','.join(map(str, sorted(layers)))} save {what}")
    return lines


def uniform_of(prep: Any) -> Any:
    """``prep`` (a `_calibrate.Prepared`) without its per-layer options (appended after the
    uniform ones, so the options kept keep their indices); ``prep`` itself when it has none."""
    n = sum(1 for c in prep.cands if not c.pattern)
    if n == len(prep.cands):
        return prep
    return dataclasses.replace(
        prep,
        cands=prep.cands[:n],
        options=prep.options[:n],
        offsets=prep.offsets[:n],
        option_extra=tuple(extra[:n] for extra in prep.option_extra),
    )
