"""An infeasible re-plan settled from what the planner knows (`_plan._settled`): once a plan of
the program is compiled, a budget under the least memory the planner knows, by more than the
memory outside the scans has differed between the compiled points, is answered without
compiling the step, with the smallest peak compiled before and the least predicted."""

from __future__ import annotations

import pytest

import remat
from conftest import mlp_stack
from remat._core._budget import format_bytes, read_budget
from remat._plan._calibrate import prepare
from remat._plan._compile import STEP, peak_of, tally
from remat._plan._memo import Knowledge, margins
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
    # what is known: the least-memory plan is checked on its scans alone, not compiled.
    know = Knowledge(prep)
    plan = plan_prepared(prep, read_budget("90%"), knowledge=know)
    assert plan.scans[0].names  # not the least-memory plan
    settled, steps = infeasible(prep, know, budget)
    assert steps == 0
    compiled = [peak_of(k.measured) for k in know.measured.values()]
    assert settled.smallest_peak_bytes == min(compiled) <= plan.measured_peak_bytes
    shown = margins(prep, know)
    # The least predicted: at most what the fresh planner compiled, less the margins' spread
    # (what the prediction allows for), and over the budget.
    spread = max(shown) - min(shown)
    assert budget < settled.predicted_peak_bytes <= fresh.smallest_peak_bytes + spread
    assert str(settled.predicted_peak_bytes) in str(settled)
    assert "nothing more was compiled" in str(settled)
    # the advice names both: the least compiled fits; the least predicted is where to try
    assert settled.predicted_peak_bytes < settled.smallest_peak_bytes
    assert f"Raise the budget to {format_bytes(settled.smallest_peak_bytes)} (a compiled" in str(
        settled
    )
    assert f"try down to {format_bytes(settled.predicted_peak_bytes)}" in str(settled)

    # Just under the smallest peak the fresh planner compiled, nothing is settled: the rounds
    # compile as before (the least-memory plan is predicted within the spread of the budget).
    near, steps = infeasible(prep, know, fresh.smallest_peak_bytes - 1)
    assert near.predicted_peak_bytes is None and steps >= 1
