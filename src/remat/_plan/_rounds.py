"""The planner's solve-and-measure rounds, for one budget.

A round solves the integer program, checks the candidate on each of its scans compiled alone
(cheap: `check_alone`), and, once that predicts a fit, looks for cheaper candidates the linear
model put a little over the budget (`_cheaper_candidate`, also checked alone); the cheapest
predicted to fit is compiled whole and measured. The first verified plan of a program also
measures what the scan-alone programs do not see (the memory outside the scans); a second
round runs only when the plan was over the budget, or, for the first plan of a program, when
the corrected model offers a cheaper plan. A program planned before knows that memory, and
its first candidate that fits ends the rounds (one compile of the step). Then every plan compiled for the
program so far competes (`_memo.Knowledge.measured`): the one with the fewest FLOPs that fits
is returned, the smaller peak among equals.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from .._core._budget import Budget
from ._body import scan_memories
from ._calibrate import Prepared
from ._compile import STEP, compile_measure, peak_of, tally
from ._memo import Knowledge, Known
from ._milp import Option, Solution, materialised, solve
from ._options import Choice, decode, fixed_solution
from ._result import InfeasibleBudget, Plan, PlanStats

# Rounds that compile the whole step, when a plan that fits is known by then.
ROUNDS = 2
# Candidates checked alone per round before one is compiled whole.
CHECKS = 4
# A candidate predicted over the budget tightens the model by its excess and this much more.
STEP_BACK = 0.002
# Budgets above the real one at which cheaper candidates are looked for (`_cheaper_candidate`).
RELAX = (0.0, 0.04, 0.08)
# A cheaper candidate predicted at most this far over the budget is still verified: the margin
# was measured on another plan, and a calibration point (e.g. every step recomputed) can sit
# exactly at the budget.
BAND = 0.02
# Above a candidate found over the budget, the next one searched recomputes at least this
# fraction of the step's FLOPs more (`_cheaper_candidate`).
FLOOR_STEP = 1e-3
# Values tried saved, one at a time, when the least memory the model knows does not fit
# (`_smaller_candidate`).
PROBES = 8
# A candidate the model puts this far under the budget is compiled whole at once, and checked
# on its scans alone beside that compile (`_ample`): the model's error on the programs
# measured is within 6%.
SLACK = 0.10


def plan_prepared(
    prep: Prepared,
    budget: Budget,
    max_rounds: int = 4,
    device_memory: int | None = None,
    knowledge: Knowledge | None = None,
    progress: Any = None,
    since: tuple[Any, ...] | None = None,
) -> Plan:
    """Solves, checks, compiles and measures for one budget (see `plan` and the module
    docstring); ``knowledge`` is what is known about the program (`_memo`), updated here;
    ``since`` is ``(tally(), perf_counter())`` when the plan began, if before this call."""
    say = progress or (lambda _: None)
    know = knowledge if knowledge is not None else Knowledge(prep)
    (counts0, seconds0), clock = since or (tally(), time.perf_counter())
    budget_bytes = budget.to_bytes(peak_of(prep.baseline), device_memory)
    solve_seconds = 0.0
    rounds = 0
    tight = 0.0
    checks = 0
    pending: tuple[Solution, Choice] | None = None
    fallback: tuple[Solution, Choice] | None = None  # a candidate predicted to fit, not compiled
    excluded: list[Solution] = []
    # Once a plan of the program is verified, its memory outside the scans is known and the
    # scan-alone checks predict the step: a candidate that fits ends the rounds.
    calibrated = know.margin is not None
    searched = False  # cheaper candidates looked for (`_cheaper_candidate`)
    probed = False  # smaller candidates looked for (`_smaller_candidate`)
    while rounds < max_rounds:
        margin = know.margin or 0.0
        say(f"solving (round {rounds + 1})")
        start = time.perf_counter()
        options = _charged(prep, know)
        weights = dict(transient_weight=prep.weight, stored_weight=prep.stored,
                       slice_weight=prep.slice)  # fmt: skip
        if pending is not None:
            solution, _ = pending
        else:
            solution = solve(prep.nodes, budget_bytes, options=options,
                             fixed_bytes=prep.base + margin + tight, exclude=excluded,
                             **weights)  # fmt: skip
        looked = pending is not None  # a cheaper candidate, found on the scans alone
        pending = None
        smallest = solution is None
        if smallest:  # nothing fits the model: the least memory it knows
            solution = solve(prep.nodes, budget_bytes, options=options, minimize="memory",
                             **weights)  # fmt: skip
        solve_seconds += time.perf_counter() - start
        if solution is None:  # the solver gave up (time limit): a calibration point
            choice = _calibration_point(prep, know, budget_bytes)
            if choice is None:
                break
            solution = _solution_of(prep, choice)
        else:
            choice = decode(solution, prep.cands, prep.offsets, prep.models, prep.weight,
                            prep.stored, prep.slice)  # fmt: skip
        rival = _calibration_rival(prep, know, choice, budget_bytes)
        if rival is not None:  # a calibration point as cheap, predicted to fit: take it
            choice, solution = rival, _solution_of(prep, rival)
        if smallest and not probed and _one_per_step_scan(prep, solution):
            probed = True
            say("looking for a smaller plan on the scans alone")
            smaller = _smaller_candidate(prep, know, solution, choice)
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
        if known is None and _ample(prep, know, solution, choice, budget_bytes, margin + tight):
            # Far under the budget by the model: checked alone while the step compiles (the
            # check gives the memory outside the scans, not the decision).
            say(f"verifying round {rounds + 1}: compiling the step")
            beside = functools.partial(check_alone, prep, know, solution, choice)
            measured, (alone, _) = compile_measure(
                _rewrite(prep, choice), prep.args, prep.argnums, "plan", prep.baseline,
                meanwhile=beside,
            )  # fmt: skip
            predicted = int(alone + margin)
            know.margin = peak_of(measured) - alone
            know.measured[key] = Known(choice, measured, predicted, alone)
        elif known is None:
            say(f"checking a candidate on its scans alone (round {rounds + 1})")
            alone, recharged = check_alone(prep, know, solution, choice)
            predicted = int(alone + margin)
            if recharged and checks < CHECKS and not looked:
                checks += 1
                continue  # a schedule's first charge: solve again with it
            if predicted > budget_bytes and not smallest and not looked:
                if checks < CHECKS:  # exclude it, and step the model back by its excess
                    checks += 1
                    excluded.append(solution)
                    tight += predicted - budget_bytes + STEP_BACK * budget_bytes
                    continue
                if _best(prep, know, budget_bytes) is not None:
                    break  # predicted over, and a plan that fits is known: no round for it
            if not smallest and not looked:  # the step is compiled once per candidate
                searched = True
                say("looking for a cheaper plan on the scans alone")
                found = _cheaper_candidate(prep, know, budget_bytes, options, tight,
                                           [*excluded, solution],
                                           prep.baseline.flops + choice.flops,
                                           _band(know, calibrated, False),
                                           (choice, alone))  # fmt: skip
                if found is not None:
                    fallback = (solution, choice)  # verified next if ``found`` is over
                    solution, choice, alone = found
                    key, predicted = choice_key(choice), int(alone + margin)
            looked = False
            say(f"verifying round {rounds + 1}: compiling the step")
            measured = compile_measure(
                _rewrite(prep, choice), prep.args, prep.argnums, "plan", prep.baseline
            )
            know.margin = peak_of(measured) - alone
            know.measured[key] = Known(choice, measured, predicted, alone)
        else:
            predicted = know.measured[key].predicted
        rounds += 1
        checks = 0
        known = know.measured[key]
        over = peak_of(known.measured) - budget_bytes
        if over <= 0:
            fallback = None
            if rounds >= min(ROUNDS, max_rounds) or (calibrated and searched):
                break  # with the memory outside the scans known, the candidate was the best
            searched = True
            say("looking for a cheaper plan on the scans alone")
            best = _best(prep, know, budget_bytes)
            found = _cheaper_candidate(prep, know, budget_bytes, options, tight, excluded,
                                       cost(prep, best), _band(know, calibrated, True),
                                       _seen(best))  # fmt: skip
            if found is None:
                break
            pending = found[:2]
        elif fallback is not None:  # a cheaper candidate was over: the one it replaced
            pending, fallback = fallback, None
        elif rounds >= ROUNDS and _best(prep, know, budget_bytes) is not None:
            break
        elif smallest:
            break  # the least memory the model knows is over: nothing smaller to try
    best = _best(prep, know, budget_bytes)
    counts, seconds = tally()
    stats = PlanStats(
        step_compiles=counts.get(STEP, 0) - counts0.get(STEP, 0),
        scan_compiles=sum(counts.values()) - sum(counts0.values())
        - (counts.get(STEP, 0) - counts0.get(STEP, 0)),
        compile_seconds=sum(seconds.values()) - sum(seconds0.values()),
        seconds=time.perf_counter() - clock,
    )  # fmt: skip
    if best is None:
        peaks = [peak_of(k.measured) for k in know.measured.values()]
        smallest_peak = min(peaks) if peaks else prep.smallest
        raise InfeasibleBudget(
            budget.spec, budget_bytes, smallest_peak, peak_of(prep.baseline), bool(prep.written)
        )
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


def _ample(prep, know, solution, choice, budget_bytes, fixed) -> bool:
    """Whether ``choice`` is so far under the budget by the model (`SLACK`) that checking it
    alone cannot change the decision to compile it: every scan ``per_step`` (a schedule's
    first check may charge it more), nothing cheaper to look for (it recomputes nothing),
    and the scan-alone programs it needs not yet compiled."""
    if not prep.scan_fits or choice.flops > 0:
        return False
    if any(prep.cands[o].schedule != "per_step" for o in solution.options):
        return False
    return prep.base + fixed + choice.model_bytes <= (1 - SLACK) * budget_bytes


def _calibration_point(prep: Prepared, know: Knowledge, budget_bytes: int) -> Choice | None:
    """The cheapest calibration point predicted to fit (else the smallest) not yet compiled."""
    points = [(c, p) for c, p in prep.calibration if choice_key(c) not in know.measured]
    if not points:
        return None
    fits = [cp for cp in points if cp[1] <= budget_bytes]
    if fits:
        return min(fits, key=lambda cp: (cp[0].flops, cp[1]))[0]
    return min(points, key=lambda cp: cp[1])[0]


def _solution_of(prep: Prepared, choice: Choice) -> Solution:
    """A `Solution` with ``choice``'s per-step options and saved values (for `check_alone`)."""
    options, saved = [], set()
    for o, cand in enumerate(prep.cands):
        scan_choice = choice.choices.get(prep.models[cand.scan].index)
        if scan_choice is None or repr(scan_choice.schedule) != repr(cand.schedule):
            continue
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


def _rewrite(prep: Prepared, choice: Choice):
    from .._trace._tag import rewrite

    return rewrite(prep.fn, choice.choices)


def choice_key(choice: Choice) -> tuple[Any, ...]:
    """A hashable identity of a choice: per scan, its names, offloaded names and schedule."""
    return tuple(
        sorted((k, v.names, v.offload, repr(v.schedule)) for k, v in choice.choices.items())
    )


def cost(prep: Prepared, known: Known) -> float:
    """A compiled point's FLOPs: measured, but never below the model's (the backward loop of a
    `remat.Binomial` schedule has no static trip count, so its measured FLOPs are a lower
    bound)."""
    return max(known.measured.flops, prep.baseline.flops + known.choice.flops)


def _best(prep: Prepared, know: Knowledge, budget_bytes: int) -> Known | None:
    """The compiled point with the fewest FLOPs that fits, the smallest peak among equals."""
    fits = [k for k in know.measured.values() if peak_of(k.measured) <= budget_bytes]
    if not fits:
        return None
    return min(fits, key=lambda k: (cost(prep, k), peak_of(k.measured)))


def _cheaper_candidate(prep, know, budget_bytes, options, tight, excluded, reference,
                       band=BAND, seen=None):  # fmt: skip
    """The cheapest plan found with fewer FLOPs than ``reference`` that its scans, compiled
    alone, predict to fit (with the memory outside the scans that the verified plans
    showed): ``(solution, choice, scan-alone prediction)``, or None.

    The integer program's memory is linear in the saved and transient bytes, and XLA's is
    not quite (on a MaxText-style decoder it put MaxText's ``minimal`` preset 13% over its
    compiled peak). So the program is solved above the budget, excluding each candidate
    already compiled or checked, and the cheaper ones are checked alone (a cheap compile
    each, at most `CHECKS`): at `RELAX` above the budget, and, where ``seen`` (a `Choice`
    and its scan-alone prediction) shows the model overestimating, at that error plus
    `RELAX`. The FLOPs searched narrow as it goes: a candidate that fits is the one to beat,
    and one that does not bounds the search from below (what recomputes less keeps more).
    One predicted at most ``band`` over the budget counts as fitting (the memory outside
    the scans is known only once a plan is verified).
    """
    if reference <= prep.baseline.flops * (1 + 1e-9):
        return None  # nothing recomputes less than nothing
    margin = know.margin or 0.0
    levels = set(RELAX)
    if seen is not None:
        choice, alone = seen
        error = (prep.base + choice.model_bytes - alone + tight) / budget_bytes
        if error > 0:
            levels |= {error + r for r in RELAX}
    excluded = list(excluded)
    checks = 0
    found = None
    above = None  # recompute FLOPs of the cheapest candidate found over the budget
    for relax in sorted(levels):
        while checks < CHECKS:
            # Cheaper tiers differ by at least a matmul; HiGHS's tolerance is relative.
            floor = None if above is None else above + FLOOR_STEP * prep.baseline.flops
            solution = solve(prep.nodes, budget_bytes * (1 + relax), options=options,
                             fixed_bytes=prep.base + margin + tight, exclude=excluded,
                             transient_weight=prep.weight, stored_weight=prep.stored,
                             slice_weight=prep.slice, min_flops=floor)  # fmt: skip
            if solution is None:
                break
            choice = decode(solution, prep.cands, prep.offsets, prep.models, prep.weight,
                            prep.stored, prep.slice)  # fmt: skip
            if prep.baseline.flops + choice.flops >= reference * (1 - 1e-9):
                break  # nothing cheaper at this budget
            excluded.append(solution)
            if choice_key(choice) in know.measured:
                continue
            checks += 1
            alone, _ = check_alone(prep, know, solution, choice)
            if alone + margin <= budget_bytes * (1 + band):
                found = solution, choice, alone
                reference = prep.baseline.flops + choice.flops
                break  # something cheaper still, higher up?
            above = solution.recompute_flops
    return found


def _smaller_candidate(prep, know, solution, choice):
    """A plan of one ``per_step`` scan whose scans, compiled alone, predict less memory than
    ``choice`` (the least memory the model knows, which does not fit): ``(solution, choice,
    scan-alone prediction)``, or None.

    The linear model ranks the smallest plans worst: saving one value that cuts a layer in
    two (a MaxText decoder's ``out_proj``) lets the backward pass recompute each part on its
    own, and the compiled peak falls below that of recomputing everything, where the model
    sees only the bytes saved (measured: 5.52 against 5.84 MiB). So each value the program
    names itself (`checkpoint_name`), else each matmul output, is tried saved on top of
    ``choice`` (at most `PROBES`, smallest first), each checked alone.
    """
    if not _one_per_step_scan(prep, solution):
        return None
    (o,) = solution.options
    cand = prep.cands[o]
    values = prep.models[cand.scan].values
    block = range(prep.offsets[o], prep.offsets[o] + len(cand.nodes))
    base = frozenset(i - prep.offsets[o] for i in block if i in solution.saved)
    named = [i for i, v in enumerate(values) if v.user_name and v.primitive == "name"]
    matmuls = [i for i, v in enumerate(values) if v.flops > 0]
    probes = [i for i in (named or matmuls) if cand.nodes[i].saveable and i not in base]
    probes = sorted(probes, key=lambda i: (values[i].bytes, i))[:PROBES]
    best, (least, _) = None, check_alone(prep, know, solution, choice)
    for i in probes:
        probe_solution = fixed_solution(prep.cands, prep.offsets, [o], save=base | {i})
        probe = decode(probe_solution, prep.cands, prep.offsets, prep.models, prep.weight,
                       prep.stored, prep.slice)  # fmt: skip
        alone, _ = check_alone(prep, know, probe_solution, probe)
        if alone < least:
            best, least = (probe_solution, probe, alone), alone
    return best


def _one_per_step_scan(prep: Prepared, solution: Solution) -> bool:
    options = solution.options
    return (
        bool(prep.scan_fits) and len(options) == 1 and prep.cands[options[0]].schedule == "per_step"
    )


def _band(know: Knowledge, calibrated: bool, fits: bool) -> float:
    """How far over the budget a cheaper candidate checked alone may be predicted and still
    be verified: `BAND` in a program's first plan, before the memory outside the scans is
    measured, or once a plan that fits is compiled (a candidate over the budget then costs a
    compile, not the plan); none in a program planned before (it compiles the step once)."""
    if calibrated:
        return 0.0
    return BAND if know.margin is None or fits else 0.0


def _seen(known: Known) -> tuple[Choice, float] | None:
    return None if known.alone is None else (known.choice, known.alone)


def _calibration_rival(prep, know, choice, budget_bytes):
    """A calibration point not yet compiled that costs fewer FLOPs than ``choice`` and
    whose scans, compiled alone, predict a fit; the cheapest such (or None). The linear model
    cannot tell such a point from a choice a few bytes away, and its prediction is the
    scan-alone one, not the model's."""
    margin = know.margin or 0.0
    rivals = [
        (c.flops, p, c)
        for c, p in prep.calibration
        if choice_key(c) not in know.measured
        and c.flops < choice.flops
        and p + margin <= budget_bytes
        and choice_key(c) != choice_key(choice)
    ]
    return min(rivals, key=lambda r: r[:2])[2] if rivals else None


def _charged(prep: Prepared, know: Knowledge) -> tuple[Option, ...]:
    return tuple(
        charge(option, know.option_extra.get(o, 0.0), prep.stored, prep.weight)
        for o, option in enumerate(prep.options)
    )


def scan_terms(prep: Prepared, solution: Solution, o: int) -> tuple[float, float, float]:
    """``(stored, sliced, transient)`` of option ``o``'s scan in ``solution``, unweighted, as
    the integer program counts them (the option's own bytes and transient included)."""
    cand = prep.cands[o]
    block = range(prep.offsets[o], prep.offsets[o] + len(cand.nodes))
    nodes = prep.nodes
    saved = [i for i in block if i in solution.saved]
    stored = sum(nodes[i].bytes * nodes[i].multiplicity for i in saved) + cand.option.bytes
    sliced = sum(nodes[i].bytes for i in saved if nodes[i].multiplicity > 1)
    live = materialised(nodes, frozenset(i for i in block if i in solution.recomputed))
    transient = max(sum(nodes[i].bytes for i in live if nodes[i].needed), cand.option.transient)
    return float(stored), float(sliced), float(transient)


def check_alone(
    prep: Prepared, know: Knowledge, solution: Solution, choice: Choice
) -> tuple[float, bool]:
    """The step's peak predicted for ``choice`` from each of its scans compiled alone (before
    the memory outside the scans is known: add ``know.margin``), and whether a schedule got
    its first charge (the solution should then be solved again).

    A ``per_step`` scan is compiled at 2 steps and extrapolated to its length by its fit (see
    `remat._calibrate.ScanFit`); a `remat.Nested` or `remat.Binomial` one at its length, and
    what it keeps beyond the model is charged to its option from then on. Without scan fits (a
    program calibrated on compiled steps) the model's own prediction is returned.
    """
    if not prep.scan_fits:
        return prep.base + choice.model_bytes, False
    fits = {prep.cands[o].scan: f for o, f in zip(_per_step(prep), prep.scan_fits, strict=True)}
    baseline = prep.baseline
    total = float(baseline.argument_bytes + baseline.output_bytes - baseline.alias_bytes)
    recharged = False
    missing = []  # scans not yet compiled alone with this choice: compiled together
    for o in solution.options:
        cand = prep.cands[o]
        info = prep.infos[cand.scan]
        fit = fits[cand.scan]
        scan_choice = choice.choices[info.position]
        key = (o, scan_choice.names, scan_choice.offload, repr(scan_choice.schedule))
        if key not in know.alone:
            length = fit.at if cand.schedule == "per_step" else fit.length
            missing.append((key, o, fit, length, (info, scan_choice, length)))
    temps = scan_memories([m[-1] for m in missing])
    for (key, o, fit, length, _), memory in zip(missing, temps, strict=True):
        if prep.cands[o].schedule == "per_step":
            sliced = scan_terms(prep, solution, o)[1]
            know.alone[key] = fit.at_length(memory.temp_bytes, length, sliced)
        else:
            know.alone[key] = float(memory.temp_bytes)
    for o in solution.options:
        cand = prep.cands[o]
        info = prep.infos[cand.scan]
        fit = fits[cand.scan]
        scan_choice = choice.choices[info.position]
        stored, sliced, transient = scan_terms(prep, solution, o)
        key = (o, scan_choice.names, scan_choice.offload, repr(scan_choice.schedule))
        contribution = know.alone[key]
        if cand.schedule != "per_step" and o not in know.option_extra:
            model = (fit.fixed + prep.stored * stored + prep.slice * sliced
                     + prep.weight * transient)  # fmt: skip
            know.option_extra[o] = contribution - model
            recharged = True
        total += contribution
    return total, recharged


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
      >>> from remat._plan._rounds import charge
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), 6.0, stored=2.0, weight=1.0)
      Option(group=0, bytes=13.0, flops=0.0, transient=40.0)
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), -30.0, stored=2.0, weight=0.5)
      Option(group=0, bytes=0.0, flops=0.0, transient=20.0)
    """
    if not stored or not extra:
        return option
    bytes_ = option.bytes + extra / stored
    if bytes_ >= 0 or not weight:
        return dataclasses.replace(option, bytes=max(bytes_, 0.0))
    transient = max(option.transient + bytes_ * stored / weight, 0.0)
    return dataclasses.replace(option, bytes=0.0, transient=transient)
