"""The search for cheaper candidates on the scans alone (`_search.cheaper_candidate`): a
candidate found over the budget rules out its FLOPs tier and steps the model back by its
excess, so that the next candidate checked recomputes more and is predicted smaller."""

from __future__ import annotations

import itertools

import pytest

from conftest import mlp_stack
from remat._plan import _search
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
    monkeypatch.setattr(_rounds, "_ample", lambda *a: False)  # every candidate checked alone
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
