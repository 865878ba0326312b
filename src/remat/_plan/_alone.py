"""Checking a candidate on its scans alone: the step's peak predicted from each scan compiled
on its own (`check_alone`), and the charges of `remat.Nested` and `remat.Binomial` options
(what a schedule keeps beyond the memory model, learned the first time one is checked).
"""

from __future__ import annotations

import dataclasses

from .._shard._target import compile_device
from ._body import scan_memories
from ._calibrate import Prepared
from ._memo import Knowledge
from ._milp import Option, Solution, materialised
from ._options import Choice, alone_key
from ._perlayer import shared_extra
from ._phases import contribution as phase_contribution

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


def check_alone(
    prep: Prepared, know: Knowledge, solution: Solution, choice: Choice
) -> tuple[float, bool]:
    """The step's peak predicted for ``choice`` from each of its scans compiled alone (before
    the memory outside the scans is known: add ``know.margin``), and whether a schedule got
    its first charge (the solution should then be solved again).

    Each scan is compiled alone at its own length (see `remat._calibrate.ScanFit`); what a
    `remat.Nested` or `remat.Binomial` one keeps beyond the model is charged to its option
    from then on. Without scan fits (a
    program calibrated on compiled steps) the model's own prediction is returned.
    """
    if not prep.scan_fits:
        return prep.base + choice.model_bytes, False
    fits = _fits(prep)
    baseline = prep.baseline
    total = float(baseline.argument_bytes + baseline.output_bytes - baseline.alias_bytes)
    recharged = False
    compile_alone(prep, know, [(solution, choice)])
    for o in solution.options:
        cand = prep.cands[o]
        info = prep.infos[cand.scan]
        fit = fits[cand.scan]
        scan_choice = choice.choices[info.position]
        stored, sliced, transient = scan_terms(prep, solution, o)
        key = alone_key(o, scan_choice)
        contribution = know.alone[key]
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
