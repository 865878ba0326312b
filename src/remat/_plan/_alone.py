"""Checking a candidate on its scans alone: the step's peak predicted from each scan compiled
on its own (`check_alone`), and the charges of `remat.Nested` and `remat.Binomial` options
(what a schedule keeps beyond the memory model, learned the first time one is checked).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._shard._target import compile_device
from ._body import scan_memories
from ._calibrate import Prepared
from ._memo import Knowledge
from ._milp import Option, Solution, materialised
from ._options import Choice, alone_key
from ._perlayer import shared_extra
from ._phases import contribution as phase_contribution
from ._twolines import lone_last, sets_of

# A per-layer option charged its sibling's extra memory (`_perlayer.shared_extra`) is solved
# again, once checked alone, when its own differs by more than this fraction of the scan's.
RECHARGE = 0.01


def charged_options(prep: Prepared, know: Knowledge) -> tuple[Option, ...]:
    return tuple(
        charge(option, _extra(prep, know, o), prep.stored, prep.weight)
        for o, option in enumerate(prep.options)
    )


def _extra(prep: Prepared, know: Knowledge, o: int) -> float:
    """What option ``o`` keeps beyond the model: measured on its scan alone, else a
    per-layer option's sibling's (`_perlayer.shared_extra`), else nothing."""
    if o in know.option_extra:
        return know.option_extra[o]
    shared = shared_extra(prep.cands, know.option_extra, o)
    return 0.0 if shared is None else shared


def scan_terms(prep: Prepared, solution: Solution, o: int) -> tuple[float, float, float]:
    """``(stored, sliced, transient)`` of option ``o``'s scan in ``solution``, unweighted, as
    the integer program counts them (the option's own bytes and transient included)."""
    cand = prep.cands[o]
    block = range(prep.offsets[o], prep.offsets[o] + len(cand.nodes))
    nodes = prep.nodes
    saved = [i for i in block if i in solution.saved]
    stored = sum(nodes[i].bytes * nodes[i].multiplicity for i in saved) + cand.option.bytes
    sliced = sum(nodes[i].bytes for i in saved if nodes[i].multiplicity > 1) + cand.option.sliced
    live = materialised(nodes, frozenset(i for i in block if i in solution.recomputed))
    groups: dict[int, float] = {}  # one per option's graph
    for i in live:
        if nodes[i].needed:
            groups[nodes[i].group] = groups.get(nodes[i].group, 0.0) + nodes[i].bytes
    transient = max(max(groups.values(), default=0.0), cand.option.transient)
    return float(stored), float(sliced), float(transient)


def compiled_alone(prep: Prepared, know: Knowledge, solution: Solution, choice: Choice) -> bool:
    """Whether every scan of ``choice`` was compiled alone with its save set (`check_alone`
    then compiles nothing)."""
    return all(
        alone_key(o, choice.choices[prep.infos[prep.cands[o].scan].position]) in know.alone
        for o in solution.options
    )


def check_alone(
    prep: Prepared,
    know: Knowledge,
    solution: Solution,
    choice: Choice,
    priced: bool = False,
    least: bool = False,
) -> tuple[float, bool] | None:
    """The step's peak predicted for ``choice`` from each of its scans compiled alone (before
    the memory outside the scans is known: add ``know.margin``), and whether a schedule got
    its first charge (the solution should then be solved again).

    Each scan is compiled alone at its own length (see `remat._calibrate.ScanFit`); what a
    `remat.Nested` or `remat.Binomial` one keeps beyond the model is charged to its option
    from then on. Without scan fits (a
    program calibrated on compiled steps) the model's own prediction is returned.

    With ``priced``, nothing is compiled: a scan not compiled alone with its choice is priced
    from the memories its save sets showed in the programs compiled alone (`_twolines`),
    else from the other mixes of its two save sets (`priced_mix`), and None is returned (and
    nothing recorded) where one cannot be. With ``least`` too, each such scan counts the
    least it can keep (`_twolines.Sets.bounds`), and nothing is recorded.
    """
    if not prep.scan_fits:
        return prep.base + choice.model_bytes, False
    fits = _fits(prep)
    left_out = sorted(set(fits) - {prep.cands[o].scan for o in solution.options})
    if left_out:  # they compile as written, and no scan alone would count them
        raise ValueError(
            f"`remat.plan`: a candidate leaves scan(s) {left_out} out of its scans alone; "
            "its predicted peak would miss them. This is a bug in the planner: please report it."
        )
    baseline = prep.baseline
    total = float(baseline.argument_bytes + baseline.output_bytes - baseline.alias_bytes)
    recharged = False
    if not priced:
        compile_alone(prep, know, [(solution, choice)])
    contributions = {}
    for o in solution.options:
        scan_choice = choice.choices[prep.infos[prep.cands[o].scan].position]
        known = know.alone.get(alone_key(o, scan_choice))
        contributions[o] = known if known is not None else _price(prep, know, o, scan_choice,
                                                                   least)  # fmt: skip
        if contributions[o] is None:
            return None
    if least:
        return total + sum(contributions.values()), False
    for o in solution.options:
        cand = prep.cands[o]
        fit = fits[cand.scan]
        stored, sliced, transient = scan_terms(prep, solution, o)
        contribution = contributions[o]
        if cand.schedule != "per_step" and o not in know.option_extra:
            model = (fit.fixed + prep.stored * stored + prep.slice * sliced
                     + prep.weight * transient)  # fmt: skip
            shared = shared_extra(prep.cands, know.option_extra, o)
            know.option_extra[o] = contribution - model
            # A per-layer option charged its sibling's before: solved again only if that was
            # off by more than `RECHARGE` of the scan's contribution.
            recharged = shared is None or abs(contribution - model - shared) > RECHARGE * abs(
                contribution
            )
        total += contribution
    return total, recharged


def _price(prep: Prepared, know: Knowledge, o: int, scan_choice: Any, least: bool) -> float | None:
    """Per-layer option ``o``'s scan-alone contribution without a compile (`check_alone`'s
    ``priced``): where its sets' memories learnt so far meet on it (`_twolines`), else on
    the line through two mixes of its sets (`priced_mix`); with ``least``, its floor."""
    pattern = prep.cands[o].pattern
    if not pattern:
        return None
    sets = sets_of(prep, know, o)
    if least:
        return sets.bounds(pattern)[0]
    price = sets.price(pattern)
    return price if price is not None else priced_mix(prep, know, o, scan_choice)


def priced_mix(prep: Prepared, know: Knowledge, o: int, scan_choice: Any) -> float | None:
    """The scan-alone contribution of per-layer option ``o`` (``scan_choice``: a run of layers
    saving one set, then a run saving another, or one set in every layer) on the line through
    two mixes of the same two sets compiled alone with other counts of layers (the nearest
    two): each layer moved from one set to the other changes it by as much (on the models of
    `benchmarks/vs_torch.py`, to within 20 KB in 1-2 MiB a layer). None where no two such
    mixes are known.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._alone import priced_mix
      >>> from remat._plan._options import alone_key
      >>> from remat._trace._tag import ScanChoice
      >>> prep = N(cands=[N(scan=0, pattern=(1,))] * 3)
      >>> a, b = ("a",), ()
      >>> know = N(alone={alone_key(0, ScanChoice(names=a, pattern=(b, a, a, a))): 70.0,
      ...                 alone_key(1, ScanChoice(names=a, pattern=(b, b, a, a))): 60.0})
      >>> priced_mix(prep, know, 2, ScanChoice(names=a, pattern=(a, a, a, a)))
      80.0
    """
    pattern = scan_choice.pattern
    if not pattern or lone_last(pattern):  # a loop of one step: off the line (`_twolines`)
        return None
    scan, rest = prep.cands[o].scan, alone_key(o, scan_choice)[2:4]  # offload, schedule
    known = [
        (key[4], contribution)
        for key, contribution in know.alone.items()
        if prep.cands[key[0]].scan == scan
        and key[2:4] == rest
        and len(key[4]) == len(pattern)
        and not lone_last(key[4])
    ]
    first, last = pattern[0], pattern[-1]
    if first != last:
        lines = [(first, last)]
    else:  # one set in every layer: the end of a line from (or to) another set
        lines = [(p[0], last) for p, _ in known if p[-1] == last and p[0] != last]
        lines += [(first, p[-1]) for p, _ in known if p[0] == first and p[-1] != first]
    best = None
    for one, other in dict.fromkeys(lines):
        x = _count(pattern, one, other)
        points = {}
        for pattern_, contribution in known:
            y = _count(pattern_, one, other)
            if y is not None and y != x:
                points[y] = contribution
        if x is None or len(points) < 2:
            continue
        near = sorted(points.items(), key=lambda p: (abs(p[0] - x), p[0]))[:2]
        distance = sum(abs(y - x) for y, _ in near)
        if best is None or distance < best[0]:
            (x0, y0), (x1, y1) = near
            best = distance, y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None if best is None else best[1]


def _count(pattern: Any, first: Any, last: Any) -> int | None:
    """The layers saving ``last`` where ``pattern`` is a run saving ``first`` then a run
    saving ``last`` (either run may be empty); None for another pattern."""
    x = 0
    while x < len(pattern) and pattern[len(pattern) - 1 - x] == last:
        x += 1
    return x if all(p == first for p in pattern[: len(pattern) - x]) else None


def compile_alone(prep: Prepared, know: Knowledge, candidates) -> None:
    """Compiles, all at once (`remat._plan._body.scan_memories`: while one lowers, others
    compile), every scan-alone program that the ``(solution, choice)`` pairs need and
    ``know`` has not seen, and records each one's contribution in ``know.alone``."""
    if not prep.scan_fits:
        return
    fits = _fits(prep)
    missing: dict = {}  # scans not yet compiled alone with these choices
    for solution, choice in candidates:
        for o in solution.options:
            info = prep.infos[prep.cands[o].scan]
            scan_choice = choice.choices[info.position]
            key = alone_key(o, scan_choice)
            if key not in know.alone and key not in missing:
                missing[key] = (info, scan_choice, fits[prep.cands[o].scan].length)
    temps = scan_memories(
        list(missing.values()),
        prep.placement or compile_device(prep.args),
        phases=prep.phases is not None,
    )
    for key, memory in zip(missing, temps, strict=True):
        know.alone[key] = phase_contribution(memory, prep.phases)


def _fits(prep: Prepared) -> dict:
    """The scans' `ScanFit` s by scan index."""
    return {prep.cands[o].scan: f for o, f in zip(_per_step(prep), prep.scan_fits, strict=True)}


def _per_step(prep: Prepared) -> list[int]:
    return [o for o, c in enumerate(prep.cands) if c.schedule == "per_step"]


def charge(option: Option, extra: float, stored: float, weight: float) -> Option:
    """``option`` charged ``extra`` bytes of memory (what it keeps beyond the model, measured
    on its scan compiled alone), as the MILP counts them: ``stored * bytes + weight *
    transient``. A negative charge (the option keeps less than the fit predicts) takes the
    option's bytes down to zero and the rest off its transient, so that options whose bytes
    would all be clamped to zero stay ranked.

    Example:
      >>> from remat._plan._milp import Option
      >>> from remat._plan._alone import charge
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), 6.0, stored=2.0, weight=1.0)
      Option(group=0, bytes=13.0, flops=0.0, transient=40.0, sliced=0.0)
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), -30.0, stored=2.0, weight=0.5)
      Option(group=0, bytes=0.0, flops=0.0, transient=20.0, sliced=0.0)
    """
    if not stored or not extra:
        return option
    bytes_ = option.bytes + extra / stored
    if bytes_ >= 0 or not weight:
        return dataclasses.replace(option, bytes=max(bytes_, 0.0))
    transient = max(option.transient + bytes_ * stored / weight, 0.0)
    return dataclasses.replace(option, bytes=0.0, transient=transient)


def solution_of(prep: Prepared, choice: Choice) -> Solution:
    """A `Solution` with ``choice``'s per-step options and saved values (for `check_alone`)."""
    options, saved = [], set()
    for o, cand in enumerate(prep.cands):
        scan_choice = choice.choices.get(prep.models[cand.scan].index)
        if (
            scan_choice is None
            or scan_choice.pattern
            or repr(scan_choice.schedule) != repr(cand.schedule)
        ):
            continue  # (a calibration point is uniform)
        options.append(o)
        names = set(scan_choice.names or ())
        values = prep.models[cand.scan].values
        for i, node in enumerate(cand.nodes):
            if values[i].name in names or (node.saveable and not node.recomputable):
                saved.add(prep.offsets[o] + i)
    block = {
        i
        for o in options
        for i in range(prep.offsets[o], prep.offsets[o] + len(prep.cands[o].nodes))
    }
    return Solution(
        saved=frozenset(saved), recomputed=frozenset(block - saved), recompute_flops=0.0,
        saved_bytes=0, transient_bytes=0, options=tuple(options),
    )  # fmt: skip
