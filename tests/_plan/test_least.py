"""What a least-memory check leads to, compiled beside it (`_settled.check_least`): an
infeasible re-plan checks its least-memory choices alone, each running a schedule that its
check charges before the rounds solve again, then the named strategies (`surely_over`); the
least-memory choices solved for next (`_settled.next_least`) compiled in the first check's
batch on its idle workers and in the batch of the check after the first charge, and the named
ones far over the budget in neither, the same scans are compiled and the same answer given as
when each waits for its own check."""

from __future__ import annotations

import pytest

import remat
from conftest import mlp_stack
from remat._core._budget import read_budget
from remat._plan import _alone, _body, _rounds, _settled
from remat._plan._calibrate import prepare
from remat._plan._compile import peak_of
from remat._plan._memo import Knowledge
from remat._plan._named import named_choice
from remat._plan._rounds import plan_prepared


@pytest.fixture(scope="module")
def planned():
    """The stack prepared, and what a plan at 90% of its peak learnt."""
    loss, args = mlp_stack(layers=8, d=32, batch=256)
    prep = prepare(loss, args, 0, True)
    know = Knowledge(prep)
    plan_prepared(prep, read_budget("90%"), knowledge=know)
    return prep, know


def replan(planned, monkeypatch, beside: bool):
    """An infeasible budget after the plan at 90%: the error, the scans compiled alone by
    the re-plan (one list per batch) and what it learnt."""
    prep, learnt = planned
    know = Knowledge(prep, measured=dict(learnt.measured), alone=dict(learnt.alone),
                     option_extra=dict(learnt.option_extra), margin=learnt.margin)  # fmt: skip
    base = prep.baseline
    floor = base.argument_bytes + base.output_bytes - base.alias_bytes
    budget = floor + (peak_of(base) - floor) // 50
    batches = []
    original = _body.scan_memories

    def recorded(requests, *a, **k):
        batches.append([choice for _, choice, _ in requests])
        return original(requests, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(_alone, "scan_memories", recorded)
        if not beside:  # the named strategies compiled when `surely_over` asks for them
            m.setattr(_rounds, "check_least",
                      lambda *a, **_: _alone.check_alone(*a))  # fmt: skip
        with pytest.raises(remat.InfeasibleBudget) as err:
            plan_prepared(prep, read_budget(budget), knowledge=know)
    return err.value, [b for b in batches if b], know


def test_what_the_first_least_memory_check_leads_to_compiles_beside_it(planned, monkeypatch):
    monkeypatch.setattr(_settled, "WORKERS", 2, raising=False)
    together, batches, know = replan(planned, monkeypatch, beside=True)
    alone, one_by_one, know_one = replan(planned, monkeypatch, beside=False)
    # One after another: the least-memory choices, each Binomial charged by its own check.
    # Beside: the first check's batch fills the idle worker with the least-memory choice
    # after it (its schedule ruled out), and the check after the first charge compiles the
    # rest at once.
    assert len(one_by_one) == 3
    assert batches == [one_by_one[0] + one_by_one[1], one_by_one[2]]
    # ``dots``, which the model puts far over the budget, is in neither: it is not the least.
    _, dots = named_choice(planned[0], ("dots",))
    assert all(dots.choices[0] not in batch for batch in batches + one_by_one)
    # ... and the same answer, from the same scans' memory.
    assert (together.smallest_peak_bytes, together.predicted_peak_bytes) == (
        alone.smallest_peak_bytes,
        alone.predicted_peak_bytes,
    )
    assert together.predicted_peak_bytes is None  # settled: the least predicted, compiled
    assert know.alone == know_one.alone
    assert know.option_extra == know_one.option_extra
