"""The planner's solve-and-measure rounds, for one budget.

A round solves the integer program, checks the candidate on each of its scans compiled alone
(cheap: `_alone.check_alone`), and, once that predicts a fit, looks for cheaper candidates
the linear model put a little over the budget (`_search.cheaper_candidate`, also checked
alone); the cheapest predicted to fit is compiled whole and measured, and while it compiles,
what the rounds will likely check next is compiled alone (`look_ahead`). A candidate
checked alone and predicted over the budget rules out the candidates that recompute as little
(`_search.above_floor`); a candidate the model puts far under the budget is compiled without
that check (`ample`) until one compiled measures over. When nothing fits the
model, values saved one at a time are tried first (`_search.smaller_candidate`). The first
verified plan of a program also measures what the scan-alone programs do not see (the memory
outside the scans); a second round runs only when the plan was over the budget, or, for the
first plan of a program, when the corrected model offers a cheaper plan. A program planned
before knows that memory, and its first candidate that fits ends the rounds (one compile of
the step). Then every plan compiled for the program so far competes
(`_memo.Knowledge.measured`): the one with the fewest FLOPs that fits is returned, the
smaller peak among equals.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax

from .._core._budget import Budget
from .._measure._refusal import refusal_of
from ._ahead import ample, look_ahead
from ._alone import charged_options, check_alone, solution_of
from ._baseline import REFUSED, budget_within, check_offloaded, check_relative, refused
from ._calibrate import Prepared
from ._calls import near_miss
from ._compile import STEP, compile_measure, peak_of, tally
from ._dearer import below_own_recomputation, dearer
from ._first import InPlace, per_layer_first
from ._line import guess
from ._memo import (
    Knowledge,
    Known,
    best_known,
    choice_key,
    cost,
    reported_margin,
    saved_of,
    siblings,
    step_flops,
)
from ._milp import Solution, solve
from ._mixes import completed, finding
from ._named import describe, try_given, try_named
from ._named import wanted as named_wanted
from ._nested import nested_scans
from ._options import Choice
from ._perlayer import uniform_of
from ._result import InfeasibleBudget, Plan, PlanStats
from ._saved import smaller_as_cheap, within_saved
from ._search import (
    CHECKS,
    STEP_BACK,
    above_floor,
    band_for,
    calibration_point,
    calibration_rival,
    cheaper_candidate,
    cheaper_point,
    one_per_step_scan,
    seen_in,
    smaller_candidate,
)
from ._settled import check_least, compile_least, surely_over
from ._spread import checked as checked_alone
from ._spread import error_spread, within_spread
from ._spread import spread as memory_spread

# Rounds that compile the whole step, when a plan that fits is known by then.
ROUNDS = 2
# Per-layer candidates compiled whole after the uniform rounds, at most (`_per_layer`).
PER_LAYER_ROUNDS = 2


def plan_prepared(
    prep: Prepared,
    budget: Budget,
    max_rounds: int = 4,
    device_memory: int | None = None,
    knowledge: Knowledge | None = None,
    progress: Any = None,
    since: tuple[Any, ...] | None = None,
    strategies: tuple[str, ...] = (),
    saved: Budget | None = None,
) -> Plan:
    """Solves, checks, compiles and measures for one budget (see `plan` and the module
    docstring); ``knowledge`` is what is known about the program (`_memo`), updated here;
    ``since`` is ``(tally(), perf_counter())`` when the plan began, if before this call;
    ``strategies`` are compiled beside the plan's candidates (`_named.try_given`); ``saved``
    caps the bytes the step saves (`_saved.within_saved`; a fraction is of the
    un-checkpointed step's)."""
    say = progress or (lambda _: None)
    know = knowledge if knowledge is not None else Knowledge(prep)
    (counts0, seconds0), clock = since or (tally(), time.perf_counter())
    check_relative(budget.spec, budget.fraction, prep.refusal)
    budget_bytes = budget.to_bytes(peak_of(prep.baseline), device_memory)
    budget_bytes = budget_within(budget.spec, budget_bytes, prep.limit)
    base = prep.baseline
    floor = base.argument_bytes + base.output_bytes - base.alias_bytes
    if budget_bytes < floor:  # the peak is temporaries + this (`_measure._peak`)
        raise InfeasibleBudget(budget.spec, budget_bytes, floor, peak_of(base),
                               bool(prep.written), floor=floor)  # fmt: skip
    # Uniform plans first, verified; per-layer ones then compete only against the best of
    # them (`_per_layer`), or against the rounds' first candidate, compiled in its place
    # (`_first.instead`), so a per-layer plan is never dearer than the uniform plan.
    # (Per-layer options still being found, `_mixes`, are completed where first needed.)
    uniform = uniform_of(prep)
    mixed = finding(prep) or uniform is not prep
    first = InPlace(prep, know, budget_bytes, say, _verify)
    rounds, solve_seconds, settled = _uniform_rounds(uniform, know, budget_bytes, max_rounds, say,
                                                     first if mixed else None)  # fmt: skip
    # A plan the compiler made dearer than the model (its own recomputation): compiled
    # candidates under it compete by their compiled FLOPs (`_dearer`).
    rounds += below_own_recomputation(uniform, know, budget_bytes, say, _verify)
    prep = completed(prep, know)
    mixed = uniform_of(prep) is not prep  # none found: the uniform plans alone, as asked

    def verify(key, choice):  # a step compiled beside the rounds' own
        _verify(prep, know, key, choice, know.margin or 0.0)

    def verify_alone(key, choice, alone):  # a step whose scans were compiled alone
        _verify(prep, know, key, choice, know.margin or 0.0, alone=alone)

    if mixed:
        if not first.replaced:  # else that search ran before the rounds' first step compile
            rounds += _per_layer(prep, know, budget_bytes, say)
        rounds += smaller_as_cheap(prep, know, budget_bytes, say, verify, solved=first.solved)
    cap = None if saved is None else saved.to_bytes(saved_of(prep.baseline))
    if cap is not None:
        rounds += within_saved(prep, know, budget_bytes, cap, say, verify)
    if strategies:  # never dearer than a strategy the caller gives
        say("compiling the given strategies")
        try_given(prep, know, budget_bytes, strategies, verify, cap)
    best = best_known(prep, know, budget_bytes, cap)
    # Never worse than a named strategy.
    if first.wanted(settled is None and named_wanted(prep, know, best, budget_bytes), best):
        say("checking the named strategies")
        try_named(prep, know, budget_bytes, best, verify_alone, first.seen)
        best = best_known(prep, know, budget_bytes, cap)
    if near_miss(prep, know, budget_bytes, say, verify):
        best = best_known(prep, know, budget_bytes, cap)
    if best is None and cap is None:  # the floor quoted is the least reached
        steps = compile_least(prep, know, budget_bytes, verify_alone)
        if steps is not None:  # the least predicted is compiled: no prediction to quote
            rounds, settled = rounds + steps, None
            best = best_known(prep, know, budget_bytes, cap)
    counts, seconds = tally()
    stats = PlanStats(
        step_compiles=counts.get(STEP, 0) - counts0.get(STEP, 0),
        scan_compiles=sum(counts.values()) - sum(counts0.values())
        - (counts.get(STEP, 0) - counts0.get(STEP, 0)),
        compile_seconds=sum(seconds.values()) - sum(seconds0.values()),
        seconds=time.perf_counter() - clock,
    )  # fmt: skip
    if best is None and cap is not None and best_known(prep, know, budget_bytes) is not None:
        least = min((k for k in know.measured.values()
                     if peak_of(k.measured) <= budget_bytes and k.measured.peak_source != REFUSED),
                    key=lambda k: saved_of(k.measured))  # fmt: skip
        raise InfeasibleBudget(budget.spec, budget_bytes, peak_of(least.measured),
                               peak_of(prep.baseline),
                               saved=(saved.spec, cap, saved_of(least.measured)))  # fmt: skip
    if best is None:
        # Any plan of the program compiled so far, per-layer or not (`_memo.siblings`).
        compiled = [(k, prep if other is know else other.prepared) for other in siblings(know)
                    for k in other.measured.values() if k.measured.peak_source != REFUSED]  # fmt: skip
        least, owner = min(compiled, key=lambda p: peak_of(p[0].measured), default=(None, prep))
        smallest_peak = prep.smallest if least is None else peak_of(least.measured)
        raise InfeasibleBudget(
            budget.spec, budget_bytes, smallest_peak, peak_of(prep.baseline), bool(prep.written),
            strategy=None if least is None else describe(owner, least.choice),
            predicted=settled, nested=nested_scans(prep.infos),
        )  # fmt: skip
    return Plan(
        fn=_rewrite(prep, best.choice),
        scans=best.choice.scans,
        budget_bytes=budget_bytes,
        predicted_peak_bytes=best.predicted,
        measured=best.measured,
        baseline_peak_bytes=peak_of(prep.baseline),
        baseline_flops=prep.baseline.flops,
        solve_seconds=prep.model_seconds + solve_seconds,
        rounds=rounds,
        fingerprint=prep.fingerprint,
        argnums=prep.argnums,
        stats=stats,
        scan_fingerprint=prep.scan_fingerprints[0],
        scan_structure=prep.scan_fingerprints[1],
        written=prep.written,
    )


def _uniform_rounds(
    prep, know, budget_bytes, max_rounds, say, first=None
) -> tuple[int, float, int | None]:
    """The rounds of the module docstring with ``prep``'s options (uniform ones: see
    `uniform_of`); every plan compiled is recorded in ``know``. ``first(solution, choice,
    alone)`` is called before the first step compile (`_first.instead`): when it returns
    True, a plan that beats that candidate was compiled and fits, and the rounds end.
    Returns the rounds run, the seconds spent solving, and the least peak predicted where
    that settles the budget as infeasible without a compile (`_settled.surely_over`), else
    None."""
    solve_seconds = 0.0
    rounds = 0
    tight = 0.0
    checks = 0
    # The next candidate, and whether cheaper ones are still to be looked for from it.
    pending: tuple[Solution, bool] | None = None
    fallback: Solution | None = None  # a candidate predicted to fit, not compiled
    excluded: list[Solution] = []
    # Once a plan of the program is verified, its memory outside the scans is known and the
    # scan-alone checks predict the step: a candidate that fits ends the rounds.
    calibrated = know.margin is not None
    searched = False  # cheaper candidates looked for (`cheaper_candidate`)
    probed = False  # smaller candidates looked for (`smaller_candidate`)
    # The most recompute FLOPs of a candidate checked alone and predicted over the budget:
    # what recomputes as little keeps as much, so no solve looks below it (`above_floor`).
    above: float | None = None
    # Candidates checked alone and predicted over the budget (`_spread.within_spread`).
    missed: list[tuple[Solution, Choice, float]] = []
    first_margin = know.margin  # the memory outside the scans the rounds begin with
    overshot = False  # a compiled candidate measured over the budget (`ample`)
    while rounds < max_rounds:
        margin = know.margin or 0.0
        say(f"solving (round {rounds + 1})")
        start = time.perf_counter()
        options = charged_options(prep, know)
        weights = prep.weights
        if pending is not None:
            solution, search_again = pending
        else:
            solution = solve(prep.nodes, budget_bytes, options=options,
                             fixed_bytes=prep.base + margin + tight, exclude=excluded,
                             min_flops=above_floor(prep, above), **weights)  # fmt: skip
        # A cheaper candidate found on the scans alone is compiled as it is.
        looked = pending is not None and not search_again
        fresh, pending = pending is None, None  # ``solution`` the fewest FLOPs that fit?
        smallest = solution is None
        if smallest:  # nothing fits the model: the least memory it knows
            solution = solve(prep.nodes, budget_bytes, options=options, minimize="memory",
                             **weights)  # fmt: skip
        solve_seconds += time.perf_counter() - start
        if solution is None:  # the solver gave up (time limit): a calibration point
            choice = calibration_point(prep, know, budget_bytes)
            if choice is None:
                break
            solution = solution_of(prep, choice)
        else:
            choice = prep.decode(solution)
        rival = calibration_rival(prep, know, choice, budget_bytes)
        if rival is not None:  # a calibration point as cheap, predicted to fit: take it
            choice, solution = rival, solution_of(prep, rival)
        if smallest and not probed and one_per_step_scan(prep, solution):
            probed = True
            say("looking for a smaller plan on the scans alone")
            smaller = smaller_candidate(prep, know, solution, choice)
            if smaller is not None:
                solution, choice, alone = smaller
                # One that fits is a candidate like any other (cheaper ones are looked for).
                smallest = alone + margin > budget_bytes
        key = choice_key(choice)
        known = know.measured.get(key)
        if known is not None and peak_of(known.measured) > budget_bytes and checks < CHECKS:
            checks += 1  # compiled before and over: exclude it without a round
            excluded.append(solution)
            continue
        if known is None and not overshot and ample(prep, know, solution, choice, budget_bytes,
                                                    margin + tight):  # fmt: skip
            # Far under the budget by the model: checked alone while the step compiles (the
            # check gives the memory outside the scans, not the decision).
            if first is not None and first(solution, choice, None):
                rounds += 1
                break
            first = None
            say(f"verifying round {rounds + 1}: compiling the step")
            beside = functools.partial(check_alone, prep, know, solution, choice)
            _verify(prep, know, key, choice, margin, beside=beside)
        elif known is None:
            say(f"checking a candidate on its scans alone (round {rounds + 1})")
            check = (functools.partial(check_least, budget_bytes=budget_bytes)
                     if smallest and not looked else check_alone)  # `_settled`  # fmt: skip
            alone, recharged = None, False
            if not smallest and not looked and checks < CHECKS:  # surely over: no compile
                limit = budget_bytes - margin + memory_spread(prep, know, first_margin)
                alone = guess(prep, know, solution, choice, checked_alone(know, missed), limit,
                              budget_bytes)  # fmt: skip
            if alone is None:
                alone, recharged = check(prep, know, solution, choice)
            predicted = int(alone + margin)
            if recharged and checks < CHECKS and not looked:
                checks += 1
                continue  # a schedule's first charge: solve again with it
            if predicted > budget_bytes and not smallest and not looked:
                if checks < CHECKS:  # exclude it, and step the model back by its excess
                    checks += 1
                    excluded.append(solution)
                    missed.append((solution, choice, alone))
                    # The excess is sure past the spreads of the memory outside the scans and
                    # of the model's error (`_spread`).
                    spread = memory_spread(prep, know, first_margin)
                    spread += error_spread(prep, checked_alone(know, missed))
                    tight += max(0.0, predicted - spread - budget_bytes)
                    tight += STEP_BACK * budget_bytes
                    above = max(above or 0.0, solution.recompute_flops)
                    continue
                if best_known(prep, know, budget_bytes) is not None:
                    break  # predicted over, and a plan that fits is known: no round for it
            if smallest and not looked:  # nothing fits the model: settled without a compile?
                settled = surely_over(prep, know, budget_bytes, alone)
                if settled is not None:
                    return rounds, solve_seconds, settled
            if not smallest and not looked:  # the step is compiled once per candidate
                searched = True
                say("looking for a cheaper plan on the scans alone")
                found = cheaper_candidate(prep, know, budget_bytes, options, tight,
                                           [*excluded, solution],
                                           step_flops(prep, choice),
                                           band_for(know, calibrated, False),
                                           (choice, alone), above, missed,
                                           memory_spread(prep, know, first_margin),
                                           solved=fresh and rival is None)  # fmt: skip
                if found is not None:
                    fallback = solution  # verified next if ``found`` is over
                    solution, choice, alone = found
                    key = choice_key(choice)
            if first is not None and first(solution, choice, alone):
                rounds += 1
                break
            first = None
            say(f"verifying round {rounds + 1}: compiling the step")
            after = rounds + 1 < min(ROUNDS, max_rounds) and not (calibrated and searched)
            ahead = functools.partial(look_ahead, prep, know, budget_bytes, options, tight,
                                      [*excluded, solution], above, after, choice,
                                      alone + margin, checked_alone(know, missed))  # fmt: skip
            _verify(prep, know, key, choice, margin, alone=alone, ahead=ahead)
        rounds += 1
        checks = 0
        known = know.measured[key]
        over = peak_of(known.measured) - budget_bytes
        if known.measured.peak_source == REFUSED:
            over = max(over, 1)
        # A candidate the model put far under the budget measured over it: the model is off
        # for this program, and the next ones are checked alone before a compile (else the
        # solver offers its equals, values that cost no FLOPs to recompute saved or not, and
        # each is compiled over the budget in turn).
        overshot = overshot or over > 0
        if over <= 0:
            fallback = None
            point = cheaper_point(prep, know, budget_bytes) if rounds < max_rounds else None
            if point is not None:  # the plan measured dearer than a point predicted to fit
                pending = (solution_of(prep, point), False)
                continue
            if rounds >= min(ROUNDS, max_rounds) or (calibrated and searched):
                break  # with the memory outside the scans known, the candidate was the best
            searched = True
            say("looking for a cheaper plan on the scans alone")
            best = best_known(prep, know, budget_bytes)
            found = cheaper_candidate(prep, know, budget_bytes, options, tight, excluded,
                                       cost(prep, best), band_for(know, calibrated, True),
                                       seen_in(best), above, missed,
                                       memory_spread(prep, know, first_margin))  # fmt: skip
            if found is None:
                break
            pending = (found[0], False)
        elif fallback is not None:
            # A cheaper candidate was over: the one it replaced, looking again from there with
            # the memory outside the scans now measured (it may be no solver's choice: a
            # smaller candidate is found by trying values saved, `smaller_candidate`).
            pending, fallback = (fallback, True), None
        elif rounds >= ROUNDS and best_known(prep, know, budget_bytes) is not None:
            break
        elif smallest:
            break  # the least memory the model knows is over: nothing smaller to try
    rounds += within_spread(prep, know, budget_bytes, missed, first_margin, say, _verify)
    return rounds, solve_seconds, None


def _per_layer(prep: Prepared, know: Knowledge, budget_bytes: int, say: Any) -> int:
    """Per-layer candidates against the best plan the uniform rounds verified: the cheapest
    that its scans, compiled alone, predict to fit with fewer FLOPs (`cheaper_candidate`,
    over all options) is compiled whole, at most `PER_LAYER_ROUNDS` times until one fits.
    None is looked for when no uniform plan fits: the mixes lie between the uniform plans'
    memory levels. Returns the rounds run (steps compiled)."""
    rounds = 0
    excluded: list[Solution] = []
    while rounds < PER_LAYER_ROUNDS:
        best = best_known(prep, know, budget_bytes)
        if best is None:
            break
        say("looking for a cheaper per-layer plan on the scans alone")
        found = cheaper_candidate(prep, know, budget_bytes, per_layer_first(prep, know), 0.0,
                                  excluded, cost(prep, best), band_for(know, True, True),
                                  seen_in(best))  # fmt: skip
        if found is None:
            break
        solution, choice, alone = found
        excluded.append(solution)
        say(f"verifying a per-layer plan (round {rounds + 1}): compiling the step")
        _verify(prep, know, choice_key(choice), choice, know.margin or 0.0, alone=alone)
        rounds += 1
        if best_known(prep, know, budget_bytes) is not best:
            break  # it fits: the cheapest found
    return rounds


def _verify(prep, know, key, choice, margin, alone=None, beside=None, ahead=None) -> None:
    """Compiles and measures the step with ``choice`` and records it in ``know`` under
    ``key``, with its prediction (the scan-alone ``alone``, or what ``beside``, run while
    the step compiles, returns, plus ``margin``) and the memory outside the scans it shows,
    unless the compiler recomputed in it of its own accord (`_dearer.dearer`: its peak is
    then the compiler's, not the save set's). The prediction recorded carries the memory
    outside the scans `_memo.reported_margin` gives before the compile (for a uniform plan,
    the middle of the range measured; ``margin`` is the one the rounds decided with).
    ``ahead`` (`look_ahead`) also runs while the step compiles. Without ``alone`` or
    ``beside`` (a strategy the caller gives) the prediction is the model's, and the memory
    outside the scans is left as it was."""

    # The margin the prediction carries, as known before the compile (`reported_margin`).
    reported = reported_margin(prep, know, choice, margin)

    def meanwhile():
        out = beside() if beside is not None else None
        if ahead is not None:
            ahead()
        return out

    try:
        measured = compile_measure(
            _rewrite(prep, choice), prep.args, prep.argnums, "plan", prep.baseline,
            meanwhile=meanwhile if beside is not None or ahead is not None else None,
        )  # fmt: skip
    except jax.errors.JaxRuntimeError as err:  # over the device's memory: never a plan
        refusal = refusal_of(err)
        if refusal is None:
            raise
        if beside is not None:
            alone, _ = beside()
        measured = refused(prep.baseline, refusal, step_flops(prep, choice))
        if refusal.asked_bytes is not None and alone is not None:  # corrects the model
            know.margin = refusal.asked_bytes - alone
        know.measured[key] = Known(choice, measured, _predicted(prep, choice, alone, reported),
                                   alone)  # fmt: skip
        return
    if beside is not None:
        measured, (alone, _) = measured
    elif ahead is not None:
        measured, _ = measured
    check_offloaded(choice, measured)
    known = Known(choice, measured, _predicted(prep, choice, alone, reported), alone)
    if alone is not None and dearer(prep, known):  # its peak is the compiler's own recomputation's
        known = dataclasses.replace(known, alone=None)
    elif alone is not None:
        know.margin = peak_of(measured) - alone
    know.measured[key] = known


def _predicted(prep: Prepared, choice: Choice, alone: float | None, margin: float) -> int:
    """The peak predicted for ``choice``: its scans alone (``alone``), else the model's,
    with the memory outside the scans (``margin``)."""
    return int((prep.base + choice.model_bytes if alone is None else alone) + margin)


def _rewrite(prep: Prepared, choice: Choice):
    from .._trace._tag import rewrite

    return rewrite(prep.fn, choice.choices)
