"""The planner's solve-and-measure rounds: solve the MILP, compile and measure the plan, and
tighten the model by what the compiled program showed, with each calibrated memory model."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .._core._budget import Budget
from .._core._schedule import Schedule
from .._measure._measurement import Measurement
from .._trace._tag import rewrite
from ._calibrate import Prepared
from ._compile import compile_measure, peak_of
from ._milp import Option, solve
from ._options import decode
from ._result import InfeasibleBudget, Plan

# Among equally cheap measured plans (one per calibrated fit), `plan` prefers one whose
# prediction was within this fraction of its measured peak: a plan the model explains. On the
# MLP-Mixer at 25% one fit's rounds end with a plan predicted 12% high (its rounds were
# corrected by an optimistic first round) and the other's with an equally cheap plan predicted
# within 8%, 0.25 MiB (1%) larger; the second is kept.
ACCURATE = 0.10


def plan_prepared(
    prep: Prepared, budget: Budget, max_rounds: int = 4, device_memory: int | None = None
) -> Plan:
    """Solves, rewrites and measures for one budget (see `plan`), with each calibrated memory
    model (`Prepared.fits`), and keeps the plan with the fewest measured FLOPs; among equally
    cheap plans, one whose model predicted its peak within 10% (see `ACCURATE`), then the
    smallest peak."""
    budget_bytes = budget.to_bytes(peak_of(prep.baseline), device_memory)
    plans: list[Plan] = []
    errors: list[InfeasibleBudget] = []
    for f, (base, stored, slice_weight, weight) in enumerate(prep.fits):
        options = prep.options
        if prep.option_extra:
            options = tuple(
                charge(o, extra, stored, weight)
                for o, extra in zip(prep.options, prep.option_extra[f], strict=True)
            )
        variant = dataclasses.replace(
            prep, base=base, stored=stored, slice=slice_weight, weight=weight, options=options
        )
        try:
            plans.append(_plan_one(variant, budget, budget_bytes, max_rounds))
        except InfeasibleBudget as err:
            errors.append(err)
    if not plans:
        raise min(errors, key=lambda e: e.smallest_peak_bytes)
    best = min(plans, key=lambda p: (p.measured.flops, _inaccurate(p), p.measured_peak_bytes))
    return dataclasses.replace(
        best,
        solve_seconds=prep.model_seconds + sum(p.solve_seconds - prep.model_seconds for p in plans),
        rounds=sum(p.rounds for p in plans),
    )


def charge(option: Option, extra: float, stored: float, weight: float) -> Option:
    """``option`` charged ``extra`` bytes of memory (see `option_offsets`), as the MILP counts
    them: ``stored * bytes + weight * transient``. A negative charge (the option keeps less
    than the fit predicts) takes the option's bytes down to zero and the rest off its
    transient, so that options whose bytes would all be clamped to zero stay ranked.

    Example:
      >>> from remat._plan._milp import Option
      >>> from remat._plan._rounds import charge
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), 6.0, stored=2.0, weight=1.0)
      Option(group=0, bytes=13.0, flops=0.0, transient=40.0)
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), -30.0, stored=2.0, weight=0.5)
      Option(group=0, bytes=0.0, flops=0.0, transient=20.0)
    """
    if not stored:
        return option
    bytes_ = option.bytes + extra / stored
    if bytes_ >= 0 or not weight:
        return dataclasses.replace(option, bytes=max(bytes_, 0.0))
    transient = max(option.transient + bytes_ * stored / weight, 0.0)
    return dataclasses.replace(option, bytes=0.0, transient=transient)


def _inaccurate(p: Plan) -> bool:
    """Whether the model's prediction missed the plan's measured peak by more than `ACCURATE`."""
    measured = p.measured_peak_bytes or 1
    return abs(p.predicted_peak_bytes - measured) > ACCURATE * measured


def _plan_one(prep: Prepared, budget: Budget, budget_bytes: int, max_rounds: int = 4) -> Plan:
    """`plan_prepared` with the memory model ``prep`` has."""
    baseline_peak = peak_of(prep.baseline)
    fn, args, argnums = prep.fn, prep.args, prep.argnums
    weights = dict(
        transient_weight=prep.weight,
        stored_weight=prep.stored,
        slice_weight=prep.slice,
    )
    solve_seconds = prep.model_seconds
    margin = 0.0
    smallest = prep.smallest
    measured_by_choice: dict[Any, Measurement] = {}
    best: tuple[Any, ...] | None = None
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        clock = time.perf_counter()
        solution = solve(
            prep.nodes, budget_bytes, options=prep.options, fixed_bytes=prep.base + margin,
            **weights,
        )  # fmt: skip
        last = solution is None
        if last:
            if best is not None:
                break
            solution = solve(prep.nodes, budget_bytes, options=prep.options,
                             minimize="memory", **weights)  # fmt: skip
            if solution is None:  # the solver gave up (time limit)
                break
        choice = decode(
            solution, prep.cands, prep.offsets, prep.models, prep.weight, prep.stored, prep.slice,
        )  # fmt: skip
        solve_seconds += time.perf_counter() - clock
        key = tuple(
            sorted(
                (k, v.names, v.offload, _schedule_key(v.schedule))
                for k, v in choice.choices.items()
            )
        )
        seen = key in measured_by_choice
        if not seen:
            planned = rewrite(fn, choice.choices)
            measured = compile_measure(planned, args, argnums, "plan", prep.baseline)
            measured_by_choice[key] = measured
        measured = measured_by_choice[key]
        peak = peak_of(measured)
        smallest = min(smallest, peak)
        # The model's prediction for this choice, corrected by the rounds measured before it.
        predicted = int(prep.base + margin + choice.model_bytes)
        error = peak - predicted  # > 0: the model was optimistic
        if peak <= budget_bytes:
            candidate = (choice.flops, peak, rounds, choice, measured, predicted)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
            if error >= -0.02 * budget_bytes or seen:
                break  # the model was not pessimistic enough to leave a cheaper plan out
        elif last:
            break
        # Correct the model by what the compiled program showed: tighten when it was
        # optimistic (at least 1% of the budget), loosen when it was pessimistic.
        margin += max(error, 0.01 * budget_bytes) if peak > budget_bytes else error
    if best is None:
        # The model found nothing, but a calibration point (every needed value saved, or
        # nothing saved) was measured to fit: fall back to the cheaper of those.
        fits = [(c, p) for c, p in prep.calibration if p <= budget_bytes]
        if not fits:
            raise InfeasibleBudget(
                budget.spec, budget_bytes, smallest, baseline_peak, bool(prep.written)
            )
        choice, peak = min(fits, key=lambda cp: (cp[0].flops, cp[1]))
        planned = rewrite(fn, choice.choices)
        measured = compile_measure(planned, args, argnums, "plan", prep.baseline)
        model = (
            prep.stored * choice.stored
            + prep.slice * choice.sliced
            + prep.weight * choice.transient
        )
        best = (choice.flops, peak, rounds, choice, measured, int(prep.base + model))
    _, _, _, choice, measured, predicted = best
    return Plan(
        fn=rewrite(fn, choice.choices),
        scans=choice.scans,
        budget_bytes=budget_bytes,
        predicted_peak_bytes=predicted,
        measured=measured,
        baseline_peak_bytes=baseline_peak,
        baseline_flops=prep.baseline.flops,
        solve_seconds=solve_seconds,
        rounds=rounds,
        fingerprint=prep.fingerprint,
        argnums=argnums,
        scan_fingerprint=prep.scan_fingerprints[0],
        scan_structure=prep.scan_fingerprints[1],
        written=prep.written,
    )


def _schedule_key(schedule: Schedule) -> str:
    return repr(schedule)
