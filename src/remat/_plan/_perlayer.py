"""Per-layer candidates: a scan's layers given two save sets, in two runs of layers.

A uniform plan saves one set in every layer, so the memory it can reach comes in steps: the
points of one layer's Pareto front (saved bytes against recomputed FLOPs), times the number of
layers. Between two such points a per-layer plan gives ``c`` of the ``L`` layers the first set
and the others the second: its bytes and FLOPs are the mix of the two points' (``c / L`` of
one and the rest of the other), and the memory between the steps is reached at the FLOPs
between them, as torch's per-node partitioner and torchtitan's "checkpoint every Nth layer"
reach it. One set in every layer is offered run as segments too (`first_carry`): their first
layer reads its input carry from the scan's initial carry, where the plain scan stacks a copy.

The front is found once per program, before any budget (`pareto_points`): the integer
program of the scan's ``per_step`` option alone, solved for the fewest FLOPs below each
point's memory in turn, with the calibrated weights. Each mix of two points is then one more
`Option` of the scan, without nodes (`period_candidates`): its saved bytes and FLOPs are
the layers' sums, its sliced bytes and transient memory the largest layer's (the backward
pass differentiates one layer at a time), so a solve with per-layer options grows by a
binary variable per mix, not by copies of the layer's graph. The ``per_step`` option keeps
every save set reachable.

A mix runs as two segments of the scan (`remat._trace._periodic.segments`): a scan over the
``L - c`` layers saving less, then one over the ``c`` others, each indexing the stacked
inputs whole, so it compiles two loop bodies whatever ``L`` (a group of ``g`` layers per
loop step, the other form `remat._trace._periodic` has, compiles ``g`` copies of the layer).
Up to `MOST_COUNTS` counts ``c`` are offered per pair of points (every ``c`` for scans of up
to 16 layers).

The planner runs its rounds on the uniform options first and lets the per-layer ones compete
only against the plan those verified (`remat._plan._rounds`), or, before the rounds compile
their first candidate, against that candidate (`remat._plan._first`: the per-layer one that
beats it is compiled in its place), so a per-layer plan never recomputes more than the
uniform plan at the same budget; then the candidate the model puts least in memory at no
more FLOPs is compiled (`remat._plan._saved.smaller_as_cheap`), and of two plans with equal
FLOPs the smaller peak is returned.

What a mix's program keeps beyond this model is charged to the option the first time one of
its scan's mixes is checked alone (`_alone.check_alone`), and from then on to the others
(`shared_extra`). A mix's scan-alone memory is the larger of two lines through what each of
its sets keeps in every layer (`_twolines`), learnt per set from every program compiled
alone, so one mix checked alone tells about every mix sharing a set with it; else, once two
mixes of the same two sets are checked alone, the others are priced on their line. One
priced clearly over or under the budget, or whose least is clearly over, is not compiled
(`_alone.check_alone`, `_search.cheaper_candidate`).

A decoded per-layer choice records the save set of each layer (`ScanPlan.pattern`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

from .._trace._periodic import Period
from ._costmodel import ScanModel
from ._milp import Option, solve
from ._options import Candidate

# The most counts of layers saving the first set offered per pair of points of a scan's front
# (every count below the length up to this many layers).
MOST_COUNTS = 15

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
    most: int = MOST_COUNTS,
) -> list[Candidate]:
    """The per-layer candidates of every scan (see the module docstring): for each pair of
    points of its front and each count ``c`` of layers (`counts`), the last ``c`` layers
    saving the first set and the others the second (the layers saving less come first:
    their recomputation then runs last in the backward pass, when fewer saved values are
    live)."""
    out = []
    for k, model in enumerate(models):
        uniform = next((c for c in cands if c.scan == k and c.schedule == "per_step"), None)
        if model.length < 2 or uniform is None:
            continue
        points = pareto_points(uniform, model.length, stored, slice_, weight)
        for a, b in itertools.combinations(points, 2):
            for c in counts(model.length, most):
                out.append(_mix(k, model.length, ((b, model.length - c), (a, c)), model))
        # One set in every layer, as segments: the first layer reads its input carry where it
        # lives (`first_carry`); offered where that keeps less than the plain scan.
        out += [_mix(k, model.length, ((p, model.length),), model)
                for p in points if first_carry(p, model)]  # fmt: skip
    return out


def first_carry(point: Point, model: ScanModel) -> int:
    """The bytes of the input carries a layer saving ``point`` keeps: in segments
    (`remat._trace._periodic.segments`) the first layer of a run keeps the run's input carry
    itself, not a stacked copy, so a plan keeps one layer's carries fewer than the plain scan
    where the scan's initial carry lives anyway (a step's argument; elsewhere it is kept in the
    copy's place, the same bytes, which the compiled step shows).

    Example:
      >>> from remat._plan._perlayer import Point, first_carry
      >>> from remat._plan._costmodel import ScanModel, Value
      >>> v = Value("carry[0]", "carry", (4,), "float32", 16, 0.0, (), True, True, False,
      ...           False, None)
      >>> first_carry(Point(frozenset({0}), 16.0, 0.0, 0.0), ScanModel(0, 8, (v,), 16, 0, 0.0, None))
      16
    """
    return sum(model.values[i].bytes for i in point.saved if model.values[i].primitive == "carry")


def counts(length: int, most: int = MOST_COUNTS) -> list[int]:
    """The counts of layers saving the first set of a mix: each of 1..``length - 1``, or
    ``most`` of them evenly spread over the scan.

    Example:
      >>> from remat._plan._perlayer import counts
      >>> counts(8), counts(80, most=4)
      ([1, 2, 3, 4, 5, 6, 7], [16, 32, 48, 64])
    """
    if length - 1 <= most:
        return list(range(1, length))
    return sorted({round(k * length / (most + 1)) for k in range(1, most + 1)})


def _mix(scan: int, length: int, parts, model: ScanModel) -> Candidate:
    """The candidate whose layers save ``parts``: ((point, layers), ...), in order."""
    once = {i for p, _ in parts for i in p.saved if model.values[i].invariant}
    option = Option(
        group=scan,
        bytes=sum(p.step_bytes * n for p, n in parts)
        + sum(model.values[i].bytes for i in once)
        - first_carry(parts[0][0], model),  # the first layer's input: the scan's own (forward)
        flops=sum(p.flops * n for p, n in parts),
        transient=max(p.transient for p, _ in parts),
        sliced=max(p.step_bytes for p, _ in parts),
    )
    pattern = tuple(p.saved for p, n in parts for _ in range(n))
    return Candidate(scan, Period(length), option, (), False, pattern)


def shared_extra(cands: Sequence[Candidate], extra: dict[int, float], o: int) -> float | None:
    """What a per-layer option ``o`` not yet checked alone is charged beyond the model: the
    mean of the charges measured on the other mixes of its scan (see the module docstring),
    or None."""
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
