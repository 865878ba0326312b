"""The search for cheaper candidates on the scans alone (`_search.cheaper_candidate`): a
candidate found over the budget rules out its FLOPs tier and steps the model back by its
excess beyond how far the model's error has differed between the candidates checked
(`_spread.error_spread`), so that the next candidate checked recomputes more and is predicted
smaller, and one the model errs on less is still checked."""

from __future__ import annotations

import itertools
from types import SimpleNamespace as N

import pytest

from conftest import mlp_stack
from remat._plan import _line, _search
from remat._plan._calibrate import prepare
from remat._plan._compile import peak_of
from remat._plan._memo import Knowledge

EXCESS = 4096.0  # bytes over the budget each candidate is reported at


@pytest.fixture(scope="module")
def prepared():
    loss, args = mlp_stack()
    return prepare(loss, args, 0, False)


def test_a_candidate_over_the_budget_rules_out_its_tier_and_steps_the_model_back(
    prepared, monkeypatch
):
    prep = prepared
    know = Knowledge(prep)
    budget = peak_of(prep.baseline)  # every candidate fits the model: only the checks decide
    margin = know.margin or 0.0
    checked, fixed = [], []

    def check_alone(prep_, know_, solution, choice):  # every candidate just over the budget
        checked.append(solution.recompute_flops)
        return budget * (1 + _search.BAND) + EXCESS - margin, False

    def solve(*args, **kwargs):  # with the number of candidates found over before it
        fixed.append((len(checked), kwargs["fixed_bytes"]))
        return real_solve(*args, **kwargs)

    real_solve = _search.solve
    monkeypatch.setattr(_search, "check_alone", check_alone)
    monkeypatch.setattr(_search, "solve", solve)
    monkeypatch.setattr(_search, "error_spread", lambda *_: 0.0)  # the model errs alike
    found = _search.cheaper_candidate(
        prep, know, budget, prep.options, 0.0, [], reference=10 * prep.baseline.flops
    )
    assert found is None
    assert len(checked) >= 3
    # Each candidate checked recomputes more than the one before (its tier is ruled out) ...
    step = _search.FLOOR_STEP * prep.baseline.flops
    assert all(b >= a + step for a, b in itertools.pairwise(checked))
    # ... and each solve carries the excesses of the candidates found over before it.
    assert [f for _, f in fixed] == pytest.approx(
        [prep.base + margin + n * EXCESS for n, _ in fixed]
    )
    assert fixed[-1][0] == len(checked)


def _candidate(name, flops, model, costly=None):
    """A fake candidate saving ``name``: ``flops`` recomputed, ``model`` bytes by the model;
    ``costly`` names the values that cost FLOPs it recomputes (default: its own)."""
    scan = N(names=(name,), offload=(), schedule="per_step", pattern=(), kept_calls=False)
    choice = N(choices={0: scan}, flops=flops, model_bytes=model)
    return N(recompute_flops=flops, choice=choice, costly=costly or name)


def _search_fake(monkeypatch, cands, alone, seen_alone, missed=None, guessed=None):
    """`cheaper_candidate` at a budget of 1000 bytes over the fake ``cands`` (the cheapest
    that the model puts within a level is solved for), each checked alone at ``alone[name]``,
    from a plan of 30 FLOPs the model puts at 990 and its scans alone at ``seen_alone``;
    ``missed`` and ``guessed`` (`Knowledge.guessed`) are filled in where given.
    Returns what it found and the names checked, in order."""
    plan = _candidate("plan", 30.0, 990.0)
    prep = N(baseline=N(flops=100.0, num_devices=1), base=0.0, nodes=(), weights={},
             decode=lambda solution: solution.choice)  # fmt: skip
    checked = []

    def solve(nodes, budget, fixed_bytes, exclude, min_flops, options, exclude_costly=()):
        fits = [c for c in cands  # the cheapest that fits
                if all(c is not e for e in exclude)
                and all(c.costly != e.costly for e in exclude_costly)
                and (min_flops is None or c.recompute_flops >= min_flops)
                and c.choice.model_bytes + fixed_bytes <= budget]  # fmt: skip
        return min(fits, key=lambda c: c.recompute_flops, default=None)

    def check_alone(prep_, know_, solution, choice):
        checked.append(choice.choices[0].names[0])
        return alone[checked[-1]], False

    monkeypatch.setattr(_search, "solve", solve)
    monkeypatch.setattr(_search, "check_alone", check_alone)
    monkeypatch.setattr(_search, "bounded", lambda *_: False)  # no integer program (`_levels`)
    monkeypatch.setattr(_line, "compiled_alone", lambda *_: False)
    know = N(margin=0.0, measured={}, guessed=set() if guessed is None else guessed)
    found = _search.cheaper_candidate(prep, know, 1000, None, 0.0, [plan], reference=130.0,
                                      band=0.0, seen=(plan.choice, seen_alone),
                                      missed=[] if missed is None else missed)  # fmt: skip
    return found, checked


@pytest.mark.parametrize("alike", [False, True])
def test_a_candidate_the_model_errs_on_less_is_checked_past_one_found_over(monkeypatch, alike):
    """Budget 1000 bytes, nothing outside the scans. The plan found (``seen``) recomputes 30
    FLOPs; A (10 FLOPs) is put 1035 by the model and 1100 by its scans alone (the model 65
    under), P (20 FLOPs) 1045 by the model and 995 alone (it fits). A, checked first at 4%
    above the budget, is over by 100. Where the model erred by 0 on the plan found, the
    errors differ by 65: the model steps back by 100 - 65 = 35, and at 8% above the budget
    P (1045 + 35 <= 1080) is checked and found. Where it erred by 65 on the plan found too
    (``alike``), the model steps back by the whole 100 and P is never checked."""
    a, p = _candidate("a", 10.0, 1035.0), _candidate("p", 20.0, 1045.0)
    found, checked = _search_fake(monkeypatch, [a, p], {"a": 1100.0, "p": 995.0},
                                  990.0 + (65.0 if alike else 0.0))  # fmt: skip
    if alike:
        assert found is None and checked == ["a"]
    else:
        assert found == (p, p.choice, 995.0) and checked == ["a", "p"]


def test_a_candidate_over_by_less_than_the_model_has_erred_leaves_its_tier_open(monkeypatch):
    """As above, but the model erred by -150 on the plan found, so A, over by 100, is within
    the errors' spread (215): its tier stays open, and T, another save set of A's 10 FLOPs
    that the model puts at 1036 and that fits alone, is checked next and found (with A's
    tier closed, the next is P, dearer). A second candidate over in a tier closes it: A2,
    of the same FLOPs and over too, leaves the search to P. The second of a tier recomputes
    other costly values than the first: A3, which recomputes A's (it saves a free alias of
    what A saves), is not solved for, and T is found after A."""
    a, p = _candidate("a", 10.0, 1035.0), _candidate("p", 20.0, 1045.0)
    t, a2 = _candidate("t", 10.0, 1036.0), _candidate("a2", 10.0, 1035.5)
    found, checked = _search_fake(monkeypatch, [a, t, p], {"a": 1100.0, "t": 990.0, "p": 995.0},
                                  840.0)  # fmt: skip
    assert found == (t, t.choice, 990.0) and checked == ["a", "t"]
    found, checked = _search_fake(
        monkeypatch, [a, a2, t, p], {"a": 1100.0, "a2": 1100.0, "t": 990.0, "p": 995.0}, 840.0
    )
    assert found == (p, p.choice, 995.0) and checked == ["a", "a2", "p"]
    a3 = _candidate("a3", 10.0, 1035.2, costly="a")
    found, checked = _search_fake(
        monkeypatch, [a, a3, t, p], {"a": 1100.0, "a3": 1100.0, "t": 990.0, "p": 995.0}, 840.0
    )
    assert found == (t, t.choice, 990.0) and checked == ["a", "t"]


def test_candidates_the_line_of_those_checked_puts_far_over_are_not_compiled(monkeypatch):
    """`_line.guess`: every candidate's scans alone lie on ``alone = 2 * model - 990``
    (the model weighs saved bytes half as XLA does). From the plan found (990 by the model
    and alone, budget 1000) the search checks A, B, D and E in turn (C is of B's tier),
    each over the budget. Once the line has `_line.POINTS` points (the plan found, A, B),
    the candidates between them that it puts more than `_line.FLOOR` over (D, E: 4-5%) are
    not compiled: the search visits the same candidates, finds the same (none), and misses
    each at the bytes a compile gives, and `Knowledge.guessed` keeps them off the line."""
    model = {"a": 1035.0, "b": 1030.0, "c": 1025.0, "d": 1020.0, "e": 1015.0}
    cands = [_candidate(name, 10.0 + k, x) for k, (name, x) in enumerate(model.items())]
    alone = {name: 2 * x - 990.0 for name, x in model.items()}
    runs = {}
    for line in (False, True):
        if not line:
            monkeypatch.setattr(_search, "guess", lambda *_: None)
        else:
            monkeypatch.setattr(_search, "guess", _line.guess)
        missed, guessed = [], set()
        found, checked = _search_fake(monkeypatch, cands, alone, 990.0, missed, guessed)
        runs[line] = found, checked, [(c.choices[0].names[0], a) for _, c, a in missed], guessed
    (found, checked, missed, _), (found_, checked_, missed_, guessed) = runs[False], runs[True]
    assert found is None and found_ is None
    assert [m[0] for m in missed] == [m[0] for m in missed_] == checked
    assert [a for _, a in missed_] == pytest.approx([alone[n] for n, _ in missed])
    skipped = [n for n in checked if n not in checked_]
    assert checked_ == [n for n in checked if n not in skipped] and skipped
    assert checked == ["a", "b", "d", "e"] and skipped == ["d", "e"]
    assert {k[0][1][0] for k in guessed} == {"d", "e"}


def test_a_guessed_candidate_is_no_point_of_the_line():
    """The line is fitted on candidates compiled alone: one guessed from it (in
    ``guessed``) is left out, so a guess never confirms the line it came from; with it
    left out, two points are too few."""
    from remat._plan._line import surely_over
    from remat._plan._memo import choice_key

    pairs = [(_candidate(n, 0.0, x).choice, 2 * x) for n, x in (("a", 400.0), ("b", 420.0))]
    far = (_candidate("c", 0.0, 480.0).choice, 960.0)
    prep = N(base=0.0)
    new = _candidate("d", 0.0, 460.0).choice
    assert surely_over(prep, [*pairs, far], set(), new, 900.0, 1000.0) == 920.0
    assert surely_over(prep, [*pairs, far], {choice_key(far[0])}, new, 900.0, 1000.0) is None


def test_the_rounds_look_above_the_tier_of_a_candidate_found_over(prepared, monkeypatch):
    from remat._core._budget import read_budget
    from remat._plan import _rounds

    prep = prepared
    know = Knowledge(prep)
    budget = peak_of(prep.baseline)
    checked, floors = [], []
    real_check, real_solve = _rounds.check_alone, _rounds.solve

    def check_alone(prep_, know_, solution, choice):  # the first candidate is over
        checked.append(solution.recompute_flops)
        if len(checked) == 1:
            return budget + EXCESS - (know_.margin or 0.0), False
        return real_check(prep_, know_, solution, choice)

    def solve(*args, **kwargs):
        floors.append(kwargs.get("min_flops"))
        return real_solve(*args, **kwargs)

    monkeypatch.setattr(_rounds, "check_alone", check_alone)
    monkeypatch.setattr(_rounds, "solve", solve)
    monkeypatch.setattr(_rounds, "ample", lambda *a: False)  # every candidate checked alone
    _rounds.plan_prepared(prep, read_budget(budget), knowledge=know)
    assert floors[0] is None
    assert floors[1] == _search.above_floor(prep, checked[0]) > checked[0]
    assert checked[1] >= floors[1]


def test_model_flops_are_shared_among_the_devices_as_measured_flops_are(prepared):
    """On a program over n devices a step's measured FLOPs are one device's and the cost
    model's recomputation is the whole program's: a candidate is priced at the baseline's
    FLOPs plus its recomputation / n. Priced at the whole recomputation, `full` looked dearer
    than a plan the compiler made dearer still (Llama-3-8B on a v5p-8: 292.1 TFLOP per chip
    chosen over `full`'s 287.8)."""
    import dataclasses

    from remat._plan._memo import Known, best_known, choice_key, cost, step_flops
    from remat._plan._named import named_choices

    devices = 4
    prep = dataclasses.replace(
        prepared, baseline=dataclasses.replace(prepared.baseline, num_devices=devices)
    )
    choices = {names[0]: choice for names, _, choice in named_choices(prep)}
    full, dots = choices["full"], choices["dots"]
    base = prep.baseline.flops
    assert full.flops > dots.flops >= 0
    assert step_flops(prep, full) == base + full.flops / devices  # hand-worked
    # `full` measured as the model says; the other plan measured 1% over `full`
    measured_full = base + full.flops / devices
    know = Knowledge(prep)
    for choice, flops in ((full, measured_full), (dots, 1.01 * measured_full)):
        m = dataclasses.replace(prep.baseline, flops=flops, peak_bytes=1)
        know.measured[choice_key(choice)] = Known(choice, m, 1)
    assert cost(prep, know.measured[choice_key(full)]) == pytest.approx(measured_full)
    assert best_known(prep, know, budget_bytes=2).choice is full


def test_one_solve_at_the_highest_level_ends_the_levels_left(prepared, monkeypatch):
    """Once a candidate found over the budget sets a floor, a solve at the highest level that
    finds nothing cheaper ends the search (`_levels`): the candidates that fit a budget fit
    every larger one. The same candidates are checked and the same found, with fewer solves."""
    from remat._plan import _levels

    prep = prepared
    budget = peak_of(prep.baseline)
    real_solve, real_bounded = _search.solve, _search.bounded
    first = real_solve(prep.nodes, budget, options=prep.options, fixed_bytes=prep.base,
                       **prep.weights)  # fmt: skip
    # Cheaper than the reference: only the candidate the first solve finds, and its tier.
    step = _search.FLOOR_STEP * prep.baseline.flops
    reference = prep.baseline.flops + first.recompute_flops + step / 2
    seen = (prep.decode(first), 0.0)  # the model overestimates: three levels more

    def run(probe):
        know, checked, solves = Knowledge(prep), [], []

        def check_alone(prep_, know_, solution, choice):  # each candidate over the budget
            checked.append(solution.recompute_flops)
            return budget * (1 + _search.BAND) + EXCESS - (know_.margin or 0.0), False

        def solve(*args, **kwargs):
            solves.append(args[1])
            return real_solve(*args, **kwargs)

        monkeypatch.setattr(_search, "check_alone", check_alone)
        monkeypatch.setattr(_search, "solve", solve)
        monkeypatch.setattr(_levels, "solve", solve)
        monkeypatch.setattr(_search, "bounded", real_bounded if probe else lambda *_: False)
        monkeypatch.setattr(_search, "error_spread", lambda *_: 0.0)  # one over closes a tier
        found = _search.cheaper_candidate(prep, know, budget, prep.options, 0.0, [],
                                          reference, seen=seen, missed=[])  # fmt: skip
        return found, checked, solves

    found, checked, solves = run(probe=True)
    found_, checked_, solves_ = run(probe=False)
    assert found is None and found_ is None
    assert checked == checked_ == [first.recompute_flops]
    # Without the probe: the level that checked it (twice: the floor's solve finds its
    # tier) and one solve per level left (five more); with it, one solve for all of those.
    levels = len(solves_) - 1
    assert levels == 6
    assert solves == [*solves_[:2], max(solves_)]


def test_a_twin_on_the_scans_alone_recomputes_other_costly_values():
    """`_spread.twin`: of the candidates checked alone, the one with A's FLOPs and scan-alone
    bytes that recomputes another costly value (B: the other matmul); not C, which recomputes
    A's matmul and differs from A in a value recomputed for free, nor D, of other bytes."""
    from remat._plan._spread import twin

    prep = N(baseline=N(flops=100.0, num_devices=1), nodes=[N(flops=0.0), N(flops=5.0),
                                                              N(flops=5.0)])  # fmt: skip

    def missed(name, recomputed, alone):
        cand = _candidate(name, 10.0, 0.0)
        return (N(recomputed=frozenset(recomputed)), cand.choice, alone)

    a, b = missed("a", {0, 1}, 100.0), missed("b", {0, 2}, 100.0)
    c, d = missed("c", {1}, 100.0), missed("d", {2}, 101.0)
    know = N(measured={})
    assert twin(prep, know, a, [a, c, d, b]) is b
    assert twin(prep, know, a, [a, c, d]) is None


def test_a_candidate_the_line_calls_over_is_missed_as_one_compiled_over(prepared, monkeypatch):
    """`_rounds` with `_line.guess`: a uniform candidate the line puts surely over is not
    compiled alone, and the rounds go on from it as from one compiled over (excluded, the
    model stepped back): they check the same candidates after it and return the same plan.
    Run twice on one program: once its first candidate is compiled alone and reported over,
    once the line calls it over at the same bytes."""
    from remat._core._budget import read_budget
    from remat._plan import _rounds

    prep = prepared
    budget = peak_of(prep.baseline)  # every candidate fits the model: only the checks decide
    real_check = _rounds.check_alone
    runs = []
    for by_line in (False, True):
        know = Knowledge(prep)
        checked, guessed = [], []
        over = budget + EXCESS - (know.margin or 0.0)

        def check_alone(prep_, know_, solution, choice, checked=checked, by_line=by_line,
                        over=over):  # fmt: skip
            checked.append(solution.recompute_flops)
            if len(checked) == 1 and not by_line:  # the first candidate is over
                return over, False
            return real_check(prep_, know_, solution, choice)

        def guess(prep_, know_, solution, choice, *rest, guessed=guessed, by_line=by_line,
                  over=over):  # fmt: skip
            if by_line and not guessed:  # the line calls the first candidate over
                guessed.append(solution.recompute_flops)
                return over
            return None

        monkeypatch.setattr(_rounds, "check_alone", check_alone)
        monkeypatch.setattr(_rounds, "guess", guess)
        monkeypatch.setattr(_rounds, "ample", lambda *a: False)  # every candidate checked alone
        p = _rounds.plan_prepared(prep, read_budget(budget), knowledge=know)
        runs.append((checked, guessed, p))
    (checked, _, plain), (checked_, guessed, lined) = runs
    assert len(checked) >= 2 and guessed == checked[:1]  # the same first candidate
    assert checked_ == checked[1:]  # not compiled alone; the same candidates after it
    assert lined.scans == plain.scans
    assert lined.measured.peak_bytes == plain.measured.peak_bytes
    assert lined.measured.flops == plain.measured.flops


def test_one_solve_rules_out_the_per_layer_levels_below_the_models_error(monkeypatch):
    """A per-layer search from a candidate the model puts over what its scans alone keep
    (levels below that error, then above it): one solve at the highest level below the error
    that finds nothing cheaper, or nothing, rules out every level below it, since what fits a
    budget fits every larger one; a cheaper answer there, or a uniform one (a per-layer
    search charges uniform options more, so it answers one only where no mix fits), rules
    out nothing, and fewer than two levels below the error are not probed."""
    solved = []
    answer = {}

    def solve(nodes, budget, **kw):
        solved.append(budget)
        return answer["solution"]

    monkeypatch.setattr(_search, "solve", solve)
    prep = N(nodes=[], weights={}, baseline=N(flops=100.0, num_devices=1),
             decode=lambda s: N(flops=s.flops, choices={0: N(pattern=s.pattern)}))  # fmt: skip
    levels = [0.0, 0.04, 0.08, 0.1, 0.14, 0.18]
    cases = [
        (N(flops=30.0, pattern=("a",)), [0.1, 0.14, 0.18]),  # as dear as the reference
        (None, [0.1, 0.14, 0.18]),  # nothing fits there
        (N(flops=20.0, pattern=("a",)), levels),  # a cheaper mix
        (N(flops=20.0, pattern=()), levels),  # a uniform candidate
    ]
    for solution, left in cases:
        answer["solution"], solved[:] = solution, []
        got = _search._above_nothing(prep, 1000, [], levels, 0.1, 130.0, 0.0, [], None)
        assert got == left and solved == [1080.0]
    answer["solution"], solved[:] = None, []
    assert _search._above_nothing(prep, 1000, [], levels, 0.03, 130.0, 0.0, [], None) == levels
    assert solved == []  # one level below the error: nothing to save


def test_a_per_layer_search_compiles_the_mix_it_checks_next_beside_the_one_it_checks(
    monkeypatch,
):
    """Each per-layer mix checked alone is compiled beside the one the search checks next
    (`_search._ahead`): the next level's where it fits, the same level's where it is over at
    the last level. The same mixes are checked and the same one found as one at a time, in
    fewer batches of compiles; a mix compiled already is checked with no compile beside."""
    from remat._trace._tag import ScanChoice

    # (level it needs, recompute FLOPs, fits): A fits at the first level; at the last, three
    # mixes as cheap are over.
    mixes = [(0.0, 30.0, True), (0.08, 20.0, False), (0.08, 20.0, False), (0.08, 20.0, False)]
    solutions = [N(index=k, recompute_flops=f) for k, (_, f, _) in enumerate(mixes)]
    choices = [N(flops=f, choices={0: ScanChoice(names=("a",), pattern=((), (f"m{k}",)))})
               for k, (_, f, _) in enumerate(mixes)]  # fmt: skip
    prep = N(nodes=[], weights={}, base=0.0, baseline=N(flops=100.0, num_devices=1),
             decode=lambda s: choices[s.index])  # fmt: skip
    budget, real_ahead = 1000, _search._ahead

    def solve(nodes, budget_, exclude=(), **_):
        return next((s for s, (level, _, _) in zip(solutions, mixes, strict=True)
                     if budget * (1 + level) <= budget_ and s not in exclude), None)  # fmt: skip

    def run(ahead):
        batches, compiled, checked = [], set(), []

        def compile_alone(prep_, know_, pairs):
            batch = [s.index for s, _ in pairs if s.index not in compiled]
            compiled.update(batch)
            batches.extend([batch] if batch else [])

        def check_alone(prep_, know_, solution, choice):
            compile_alone(prep_, know_, [(solution, choice)])
            checked.append(solution.index)
            return budget * (0.9 if mixes[solution.index][2] else 1.5), False

        monkeypatch.setattr(_search, "solve", solve)
        monkeypatch.setattr(_search, "bounded", lambda *_: False)
        monkeypatch.setattr(_search, "error_spread", lambda *_: 0.0)
        monkeypatch.setattr(_search, "_priced", lambda *_: None)
        monkeypatch.setattr(_search, "_priced_now", lambda *_: False)
        monkeypatch.setattr(_search, "compile_alone", compile_alone)
        monkeypatch.setattr(_search, "check_alone", check_alone)
        monkeypatch.setattr(_search, "compiled_alone", lambda p, k, s, c: s.index in compiled)
        monkeypatch.setattr(_search, "_ahead", real_ahead if ahead else lambda *_: None)
        know = N(margin=None, measured={}, option_extra={})
        found = _search.cheaper_candidate(prep, know, budget, [], 0.0, [], 140.0)
        return found[0].index, checked, batches

    assert run(ahead=False) == (0, [0, 1, 2, 3], [[0], [1], [2], [3]])
    # B is compiled beside C; C, compiled already, compiles nothing beside; D on its own.
    assert run(ahead=True) == (0, [0, 1, 2, 3], [[0], [1, 2], [3]])
    mixes[2] = (0.08, 20.0, True)  # C fits: the search ends there, and D is never compiled
    assert run(ahead=False) == (2, [0, 1, 2], [[0], [1], [2]])
    assert run(ahead=True) == (2, [0, 1, 2], [[0], [1, 2]])


def test_a_per_layer_candidates_error_does_not_keep_a_named_one_from_far_over():
    """`_named.far_over` judges a named candidate (one set in every layer) by the model's
    error on the uniform candidates compiled alone: a per-layer one's error is its mix's own
    charge (two loops), which would otherwise have the named candidate compiled alone."""
    from remat._plan._named import SAFETY, far_over

    prep, know = N(base=0.0, margin=None), N(margin=0.0, measured={})
    uniform = N(model_bytes=100.0, choices={0: N(pattern=())})
    mix = N(model_bytes=100.0, choices={0: N(pattern=(("a",), ("b",)))})
    named = N(model_bytes=100.0 + SAFETY * 10.0)  # over by 4x an error of 10
    assert far_over(prep, know, named, 100.0, [(uniform, 95.0), (mix, 80.0)])
    assert not far_over(prep, know, named, 100.0, [(uniform, 80.0)])  # a uniform error of 20
    assert not far_over(prep, know, named, 100.0, [(mix, 80.0)])  # no uniform error known
