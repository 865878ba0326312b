"""Where the rounds look for candidates on the scans alone, before compiling the step.

The integer program's memory model is linear and XLA's memory is not quite: cheaper
candidates the model puts a little over the budget are checked alone (`cheaper_candidate`),
and when nothing fits the model, single values saved on top of its least-memory choice are
(`smaller_candidate`). Calibration points compete with the solver's choices
(`calibration_rival`, `calibration_point`).
"""

from __future__ import annotations

from ._alone import check_alone, compile_alone, compiled_alone
from ._calibrate import Prepared
from ._levels import bounded, nothing_cheaper
from ._line import guess
from ._memo import Knowledge, Known, best_known, choice_key, cost, per_layer, step_flops
from ._milp import Solution, solve
from ._options import Choice, fixed_solution
from ._spread import checked as checked_alone
from ._spread import error_spread

# Candidates checked alone per round before one is compiled whole.
CHECKS = 4
# A candidate found over the budget (or a ceiling) tightens the model by its excess and this
# fraction of the budget more (`_rounds`, `_dearer`).
STEP_BACK = 0.002
# Budgets above the real one at which cheaper candidates are looked for (`cheaper_candidate`).
RELAX = (0.0, 0.04, 0.08)
# A cheaper candidate predicted at most this far over the budget is still verified: the margin
# was measured on another plan, and a calibration point (e.g. every step recomputed) can sit
# exactly at the budget.
BAND = 0.02
# Above a candidate found over the budget, the next one searched recomputes at least this
# fraction of the step's FLOPs more (`cheaper_candidate`).
FLOOR_STEP = 1e-3
# A per-layer candidate priced from its sibling mixes (`_priced`) this far over or under the
# budget is not compiled alone: on the models measured the price is within 20 KB of the
# compile (within 8 bytes on the vs_torch models' first plans at 40% and 25%, the same set
# in every layer included), in budgets of 30-90 MB: 0.2% of 30 MB is three times that.
SURE = 0.002
# Values tried saved, one at a time, when the least memory the model knows does not fit
# (`smaller_candidate`).
PROBES = 8


def cheaper_candidate(prep, know, budget_bytes, options, tight, excluded, reference,
                       band=BAND, seen=None, above=None, missed=None, spread=0.0,
                       solved=False):  # fmt: skip
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
    and one that does not bounds the search from below (what recomputes less keeps more) and
    steps the model back by its excess over the budget, at every level after it (measured at
    Llama-3-70B shapes: four candidates in a row, each the model's next tier up, were each
    predicted about 1% less than the one before and all over).
    (A per-layer candidate over the budget bounds nothing: see the comment where ``above``
    is set; ``above`` may start as the recompute FLOPs of a uniform candidate the rounds
    found over.) One predicted at most ``band`` over the budget counts as fitting (the memory outside
    the scans is known only once a plan is verified). Each candidate checked alone and
    predicted over is appended to ``missed`` (a list, if given) as ``(solution, choice,
    scan-alone prediction)``; ``spread`` is how far the memory outside the scans has differed
    between the points measured: the model steps back only by an excess beyond it, and beyond
    how far the model's error has differed between the candidates checked alone
    (`_spread.error_spread`: those ``know`` measured, ``missed``, ``seen`` and this search's),
    so that a candidate the model errs on less than on the one over is still checked; the
    first candidate of a FLOPs tier over by less than that error spread leaves its tier open
    (another save set of the same FLOPs, recomputing other values that cost FLOPs, may fit:
    at Llama-3-70B shapes saving the query projection's output or the out projection's
    costs the same bytes and FLOPs, and their steps differ by 2.09 GiB), a second closes
    it. Without
    ``missed`` (the per-layer search), a per-layer candidate that two mixes of its save sets
    checked before price more than `SURE` from the budget is not compiled (`_priced`).
    With ``solved`` (``reference`` is the fewest FLOPs a solve found at the budget, with
    ``excluded`` less its last, the candidate solved), the first level is not solved again
    where it cannot find anything cheaper (`_levels`); a per-layer search rules out the
    levels below the model's error on ``seen`` with one solve where it can
    (`_above_nothing`).
    """
    if reference <= prep.baseline.flops * (1 + 1e-9):
        return None  # nothing recomputes less than nothing
    margin = know.margin or 0.0
    levels = set(RELAX)
    error = 0.0
    if seen is not None:
        choice, alone = seen
        error = (prep.base + choice.model_bytes - alone + tight) / budget_bytes
        if error > 0:
            levels |= {error + r for r in RELAX}
    excluded = list(excluded)
    pairs = checked_alone(know, missed or []) + ([] if seen is None else [seen])
    opened = None  # the recompute FLOPs of a tier left open by a candidate over
    costly: list[Solution] = []  # the candidates that left a tier open (``exclude_costly``)
    checks = 0
    found = None
    back = 0.0  # bytes the model is stepped back by the candidates found over
    # ``above``: recompute FLOPs of the cheapest candidate found over the budget.
    levels = sorted(levels)
    if missed is None:  # per-layer: the levels below the model's error on ``seen`` at once?
        levels = _above_nothing(prep, budget_bytes, options, levels, error, reference,
                                prep.base + margin + tight, excluded, above_floor(prep, above))  # fmt: skip
    ahead = None  # (level, its solve) made while a per-layer check compiled (`_ahead`)
    # Once a floor is set, the levels left may be ended by one solve at the highest
    # (`_levels`): where three or more are left, and once per state of the search.
    bound, probed = bounded(prep, options), None
    for k, relax in enumerate(levels):
        if k == 0 and relax == 0.0 and solved and bound:
            continue  # the solve that found ``reference``, less that candidate
        state = (len(excluded), back, above, reference)
        if (
            bound
            and above is not None
            and checks < CHECKS
            and len(levels) - k > 2
            and state != probed
        ):
            probed = state
            if nothing_cheaper(prep, budget_bytes * (1 + levels[-1]), options,
                               prep.base + margin + tight + back, excluded,
                               above_floor(prep, above), reference):  # fmt: skip
                break
        while checks < CHECKS:
            floor = above_floor(prep, above)
            if ahead is not None and ahead[0] == relax:
                solution = ahead[1]  # solved as it would be now, after the check before
            else:
                solution = solve(prep.nodes, budget_bytes * (1 + relax), options=options,
                                 fixed_bytes=prep.base + margin + tight + back,
                                 exclude=excluded, exclude_costly=costly, **prep.weights,
                                 min_flops=floor)  # fmt: skip
            ahead = None
            if solution is None:
                break
            choice = prep.decode(solution)
            if step_flops(prep, choice) >= reference * (1 - 1e-9):
                break  # nothing cheaper at this budget
            excluded.append(solution)
            if choice_key(choice) in know.measured:
                continue
            checks += 1
            # A per-layer candidate its sibling mixes price surely over or under: no compile.
            alone = None if missed is not None else _priced(
                prep, know, solution, choice, budget_bytes * (1 + band) - margin)  # fmt: skip
            if alone is None and missed is not None:  # a uniform candidate surely over
                limit = budget_bytes * (1 + band) - margin + spread  # by the line, no compile
                alone = guess(prep, know, solution, choice, pairs, limit, budget_bytes)
            if alone is None:
                if missed is None and checks < CHECKS:  # per-layer: the next level's beside
                    ahead = _ahead(prep, know, budget_bytes, options, levels, relax,
                                   prep.base + margin + tight + back, excluded, floor,
                                   costly, (solution, choice),
                                   budget_bytes * (1 + band) - margin, reference)  # fmt: skip
                alone, _ = check_alone(prep, know, solution, choice)
            if alone + margin <= budget_bytes * (1 + band):
                found = solution, choice, alone
                reference = step_flops(prep, choice)
                break  # something cheaper still, higher up?
            pairs.append((choice, alone))
            if missed is not None:
                missed.append((solution, choice, alone))
            excess = alone + margin - spread - budget_bytes * (1 + band)
            erred = error_spread(prep, pairs)
            tier = solution.recompute_flops
            if not per_layer(choice) and (excess > erred or _same_tier(prep, tier, opened)):
                # A per-layer candidate over the budget bounds nothing: its program keeps
                # more than a uniform plan's (two loops, each with its own working set), so
                # a uniform plan that recomputes less may still fit. The first one of its
                # tier over by less than the model's error has differed leaves the tier
                # open (`opened`): another save set of the same FLOPs, on which the model
                # errs more, may fit; a second closes it. The second recomputes other
                # costly values (`_milp.solve`'s ``exclude_costly``): one that differs only
                # in values recomputed for free would compile alike.
                above = tier
                # ... and steps the model back by its excess beyond ``spread`` and the model's
                # error spread: the next candidate the model puts less than that under this
                # one would be over too.
                back += max(0.0, excess - erred)
            elif not per_layer(choice):
                opened = tier
                costly.append(solution)  # the next of its tier saves other costly values
    return found


def _above_nothing(prep, budget_bytes, options, levels, error, reference, fixed, excluded,
                   floor) -> list[float]:  # fmt: skip
    """``levels`` less those below the model's error ``error`` (on the candidate the search
    starts from) where one solve at the highest of them, two or more, finds no per-layer
    candidate cheaper than ``reference``: what fits a budget fits every larger one, and a
    per-layer candidate's objective is its FLOPs (the uniform options a per-layer search
    charges more, `_first.per_layer_first`, are what it returns only where no mix fits, so
    only a per-layer answer, or none, rules the levels below out). On the vs_torch GPT at
    25% the model puts the uniform candidate a per-layer search must beat 14% over what its
    scans alone keep, and no mix below that level is cheaper: one solve instead of three."""
    below = [r for r in levels if r < error]
    if len(below) < 2:
        return levels
    solution = solve(prep.nodes, budget_bytes * (1 + below[-1]), options=options,
                     fixed_bytes=fixed, exclude=excluded, **prep.weights,
                     min_flops=floor)  # fmt: skip
    if solution is not None:
        choice = prep.decode(solution)
        if not per_layer(choice) or step_flops(prep, choice) < reference * (1 - 1e-9):
            return levels
    return [r for r in levels if r > below[-1]]


def _same_tier(prep: Prepared, flops: float, other: float | None) -> bool:
    """Whether recompute FLOPs ``flops`` and ``other`` are one tier (`FLOOR_STEP`)."""
    return other is not None and abs(flops - other) < FLOOR_STEP * prep.baseline.flops


def _priced_now(prep, know, solution, choice, limit) -> bool:
    """Whether `_priced` prices ``choice`` now (so that no compile of it is needed), leaving
    ``know``'s charges as they were (it is priced again, and charged, in its turn)."""
    charged = dict(know.option_extra)
    priced = _priced(prep, know, solution, choice, limit) is not None
    _put_back(know, charged)
    return priced


def _put_back(know: Knowledge, charged: dict) -> None:
    """Restores ``know``'s charges per option (`Knowledge.option_extra`) to ``charged``."""
    know.option_extra.clear()
    know.option_extra.update(charged)


def _ahead(prep, know, budget_bytes, options, levels, relax, fixed, excluded, floor, costly,
           pair, limit, reference):  # fmt: skip
    """The solve `cheaper_candidate` makes after ``pair`` (a per-layer ``(solution, choice)``
    about to be checked alone, already in ``excluded``), made now, and its candidate compiled
    alone beside ``pair`` (`compile_alone`: one lowers while the other compiles, and both
    compile at once) when it is a per-layer candidate not yet compiled, cheaper than what it
    must beat, nor priced without a compile (`_priced`, against ``limit``).

    Where a level follows ``relax`` (of ``levels``), that is the solve at the next level for
    one cheaper than ``pair`` (taken where ``pair`` fits); at the last level, the solve at
    ``relax`` again for one cheaper than ``reference`` (taken where ``pair`` is over: a
    per-layer candidate over moves neither the floor nor the model, so the search solves
    just that). On the vs_torch GPT at 25% the last level's two mixes, both over, compile
    together. Returns ``(level, solution or None)`` for the loop to take at that level, or
    None where nothing would compile beside ``pair`` (compiled alone already) or ``pair`` is
    a uniform candidate at the last level."""
    if compiled_alone(prep, know, *pair):
        return None  # nothing to compile beside
    later = [r for r in levels if r > relax]
    if later:
        level, beat = later[0], step_flops(prep, pair[1])
    elif per_layer(pair[1]):
        level, beat = relax, reference
    else:
        return None
    solution = solve(prep.nodes, budget_bytes * (1 + level), options=options,
                     fixed_bytes=fixed, exclude=excluded, exclude_costly=costly,
                     **prep.weights, min_flops=floor)  # fmt: skip
    pairs = [pair]
    if solution is not None:
        choice = prep.decode(solution)
        if (
            per_layer(choice)
            and choice_key(choice) not in know.measured
            and step_flops(prep, choice) < beat * (1 - 1e-9)
            and not _priced_now(prep, know, solution, choice, limit)
        ):
            pairs.append((solution, choice))
    compile_alone(prep, know, pairs)
    return level, solution


def _priced(prep, know, solution, choice, limit) -> float | None:
    """The scan-alone peak of per-layer ``choice`` priced without a compile from the programs
    of its save sets compiled alone (`_alone.check_alone`'s ``priced``; its option then
    charged from that price, as a check would), where that is more than `SURE` over or under
    ``limit`` (the scan-alone peak that fits), or the least it can keep (`_twolines`) is more
    than `SURE` over; else None (and nothing charged)."""
    if not per_layer(choice):
        return None
    charged = dict(know.option_extra)
    priced = check_alone(prep, know, solution, choice, priced=True)
    if priced is not None and abs(priced[0] - limit) > SURE * abs(limit):
        return priced[0]
    _put_back(know, charged)  # compiled alone next, and charged from that
    # The least it can keep (`_twolines`) clearly over: no compile, and nothing charged.
    least = check_alone(prep, know, solution, choice, priced=True, least=True)
    if least is not None and least[0] - limit > SURE * abs(limit):
        return least[0]
    return None


def above_floor(prep: Prepared, above: float | None) -> float | None:
    """The fewest recompute FLOPs a solve may choose above a candidate found over the budget
    that recomputes ``above`` (None: no bound): cheaper tiers differ by at least a matmul,
    and HiGHS's tolerance is relative (`FLOOR_STEP`). Candidates of one tier that differ in
    values that cost no FLOPs to recompute (a type conversion, the carry) differ little in
    compiled memory where the linear model sees their bytes: a candidate over the budget
    rules out its tier."""
    return None if above is None else above + FLOOR_STEP * prep.baseline.flops


def smaller_candidate(prep, know, solution, choice):
    """A plan of one ``per_step`` scan whose scans, compiled alone, predict less memory than
    ``choice`` (the least memory the model knows, which does not fit): ``(solution, choice,
    scan-alone prediction)``, or None.

    The linear model ranks the smallest plans worst: saving one value that cuts a layer in
    two (a MaxText decoder's ``out_proj``) lets the backward pass recompute each part on its
    own, and the compiled peak falls below that of recomputing everything, where the model
    sees only the bytes saved (measured: 5.52 against 5.84 MiB). So each value the program
    names itself (`checkpoint_name`), else each matmul output, is tried saved on top of
    ``choice`` (at most `PROBES`, smallest first), each checked alone (compiled together).
    """
    if not one_per_step_scan(prep, solution):
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
    tried = []
    for i in probes:
        probe_solution = fixed_solution(prep.cands, prep.offsets, [o], save=base | {i})
        probe = prep.decode(probe_solution)
        tried.append((probe_solution, probe))
    compile_alone(prep, know, [(solution, choice), *tried])  # at once, not one at a time
    best, (least, _) = None, check_alone(prep, know, solution, choice)
    for probe_solution, probe in tried:
        alone, _ = check_alone(prep, know, probe_solution, probe)
        if alone < least:
            best, least = (probe_solution, probe, alone), alone
    return best


def one_per_step_scan(prep: Prepared, solution: Solution) -> bool:
    options = solution.options
    return (
        bool(prep.scan_fits) and len(options) == 1 and prep.cands[options[0]].schedule == "per_step"
    )


def band_for(know: Knowledge, calibrated: bool, fits: bool) -> float:
    """How far over the budget a cheaper candidate checked alone may be predicted and still
    be verified: `BAND` in a program's first plan, before the memory outside the scans is
    measured, or once a plan that fits is compiled (a candidate over the budget then costs a
    compile, not the plan); none in a program planned before (it compiles the step once)."""
    if calibrated:
        return 0.0
    return BAND if know.margin is None or fits else 0.0


def seen_in(known: Known) -> tuple[Choice, float] | None:
    return None if known.alone is None else (known.choice, known.alone)


def calibration_rival(prep, know, choice, budget_bytes):
    """A calibration point not yet compiled that costs fewer FLOPs than ``choice`` and
    whose scans, compiled alone, predict a fit; the cheapest such (or None). The linear model
    cannot tell such a point from a choice a few bytes away, and its prediction is the
    scan-alone one, not the model's. Before a plan is verified the memory outside the scans
    is the un-checkpointed step's (`Prepared.margin`), not this point's: one predicted at
    most `BAND` over the budget is taken (a point such as every step recomputed can sit
    exactly at the budget)."""
    margin = know.margin or 0.0
    limit = budget_bytes * (1 + (0.0 if know.measured else BAND))
    rivals = [
        (c.flops, p, c)
        for c, p in prep.calibration
        if choice_key(c) not in know.measured
        and c.flops < choice.flops
        and p + margin <= limit
        and choice_key(c) != choice_key(choice)
    ]
    return min(rivals, key=lambda r: r[:2])[2] if rivals else None


def cheaper_point(prep: Prepared, know: Knowledge, budget_bytes: int) -> Choice | None:
    """A calibration point not yet compiled, predicted to fit, that costs fewer FLOPs than the
    best plan compiled so far as measured (a `remat.Binomial` schedule's measured FLOPs can
    exceed the model's and those of recomputing every step); the cheapest such, or None.

    The memory outside the scans is the un-checkpointed step's where known (a point saves per
    step, as that step does; a verified `remat.Binomial` plan's margin is not a per-step
    point's), else the verified plans'."""
    best = best_known(prep, know, budget_bytes)
    if best is None:
        return None
    margin = prep.margin if prep.margin is not None else know.margin or 0.0
    reference = cost(prep, best) * (1 - 1e-9)
    points = [
        (c.flops, p, c)
        for c, p in prep.calibration
        if choice_key(c) not in know.measured
        and step_flops(prep, c) < reference
        and p + margin <= budget_bytes
    ]
    return min(points, key=lambda r: r[:2])[2] if points else None


def calibration_point(prep: Prepared, know: Knowledge, budget_bytes: int) -> Choice | None:
    """The cheapest calibration point predicted to fit (else the smallest) not yet compiled."""
    points = [(c, p) for c, p in prep.calibration if choice_key(c) not in know.measured]
    if not points:
        return None
    fits = [cp for cp in points if cp[1] <= budget_bytes]
    if fits:
        return min(fits, key=lambda cp: (cp[0].flops, cp[1]))[0]
    return min(points, key=lambda cp: cp[1])[0]
