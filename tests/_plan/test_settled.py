"""An infeasible re-plan settled from what the planner knows (`_plan._settled`): once a plan of
the program is compiled, a budget under the least memory the planner knows, by more than the
memory outside the scans has differed between the compiled points, is answered without
compiling the step but the one predicted to reach the least memory: the floor quoted is the
least the planner reaches."""

from __future__ import annotations

import pytest

import remat
from conftest import mlp_stack
from remat._core._budget import format_bytes, read_budget
from remat._plan._calibrate import prepare
from remat._plan._compile import STEP, peak_of, tally
from remat._plan._memo import Knowledge
from remat._plan._rounds import plan_prepared


@pytest.fixture(scope="module")
def prepared():
    loss, args = mlp_stack(layers=8, d=32, batch=256)
    return prepare(loss, args, 0, False)


def infeasible(prep, know, budget):
    steps = tally()[0].get(STEP, 0)
    with pytest.raises(remat.InfeasibleBudget) as err:
        plan_prepared(prep, read_budget(budget), knowledge=know)
    return err.value, tally()[0].get(STEP, 0) - steps


def test_an_infeasible_replan_compiles_no_step_where_the_known_settle_it(prepared):
    prep = prepared
    base = prep.baseline
    floor = base.argument_bytes + base.output_bytes - base.alias_bytes
    budget = floor + (peak_of(base) - floor) // 50  # far under any plan, above the floor

    # A fresh planner knows the memory outside the scans only from the un-checkpointed step:
    # it compiles the least-memory plan (and `full`) to say how small a peak it reached.
    fresh, steps = infeasible(prep, Knowledge(prep), budget)
    assert steps >= 1 and fresh.predicted_peak_bytes is None

    # After a plan that saves values (at 90% of the peak), the same budget is settled from
    # what is known: the least-memory plan is checked on its scans alone, and only the
    # candidate predicted to reach the least memory is compiled (`compile_least`), so the
    # floor quoted is the least the planner reaches, not the 90% plan's peak.
    know = Knowledge(prep)
    plan = plan_prepared(prep, read_budget("90%"), knowledge=know)
    assert plan.scans[0].names  # not the least-memory plan
    settled, steps = infeasible(prep, know, budget)
    assert steps == 1
    compiled = [peak_of(k.measured) for k in know.measured.values()]
    assert settled.smallest_peak_bytes == min(compiled) < plan.measured_peak_bytes
    assert settled.smallest_peak_bytes <= fresh.smallest_peak_bytes
    assert settled.predicted_peak_bytes is None  # the least predicted is compiled
    assert f"Raise the budget to at least {format_bytes(settled.smallest_peak_bytes)}" in str(
        settled
    )
    # Asked again, nothing more is compiled.
    again, steps = infeasible(prep, know, budget)
    assert steps == 0 and again.smallest_peak_bytes == settled.smallest_peak_bytes

    # Just under the least reached, the rounds find the least-memory candidate compiled and
    # over: nothing more is compiled.
    near, steps = infeasible(prep, know, settled.smallest_peak_bytes - 1)
    assert steps == 0 and near.smallest_peak_bytes == settled.smallest_peak_bytes


def test_the_floor_counts_what_any_plan_of_the_program_compiled(prepared, monkeypatch):
    # `per_layer` is part of the memo key: a per-layer plan's knowledge is another entry, but
    # what a uniform plan compiled is a peak the program reaches too (`_memo.siblings`, of
    # which the floor `InfeasibleBudget` quotes is the least compiled).
    from remat._plan import _memo

    monkeypatch.setattr(_memo, "_MEMORY", type(_memo._MEMORY)())
    uniform, mixed, other = Knowledge(prepared), Knowledge(prepared), Knowledge(prepared)
    _memo.remember(_memo.key_of("p", 0, True, None, ("cpu", 1)), uniform)
    _memo.remember(_memo.key_of("p", 0, True, None, ("cpu", 1), per_layer=True), mixed)
    _memo.remember(_memo.key_of("q", 0, True, None, ("cpu", 1)), other)
    assert _memo.siblings(mixed) == [mixed, uniform]
    assert _memo.siblings(other) == [other]
