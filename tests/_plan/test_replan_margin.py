"""The memory outside the scans a re-plan starts from (`_memo.start_margin`).

A verified plan shows how much the step keeps beside its scans: its compiled peak minus its
scans' prediction compiled alone. A plan whose scans alone overestimate the step shows less
than the un-checkpointed step does, even a negative amount (a per-layer plan of the
`benchmarks/vs_torch.py` GPT: -3.79 MiB); predicting the next budget's candidates with it put
one under what it compiled to. Here a plan's scans-alone prediction is made too large by hand,
so that it shows a negative margin: the re-plan still predicts no less than the step compiles.
"""

from __future__ import annotations

import dataclasses

import pytest

import remat
from conftest import mlp_stack
from remat._plan import _memo
from remat._plan._compile import peak_of


@pytest.fixture(scope="module")
def stack():
    return mlp_stack(layers=8, d=32, batch=256)


def test_a_replan_after_a_negative_margin_predicts_no_less_than_it_compiles(stack):
    loss, args = stack
    _memo.forget()
    first = remat.plan(loss, *args, budget=0.6, verbose=False)
    (know,) = _memo._MEMORY.values()
    prep = know.prepared
    shown = _memo.margins(prep, know)
    assert len(shown) >= 2  # the un-checkpointed step's and the plan's
    # The plan's scans alone, overestimated by a fifth of its peak: it shows a negative margin.
    over = first.measured_peak_bytes // 5
    for key, known in list(know.measured.items()):
        if known.alone is not None:
            know.measured[key] = dataclasses.replace(known, alone=peak_of(known.measured) + over)
    know.margin = -float(over)  # as the plan's verification learnt it
    before = set(know.measured)
    assert min(_memo.margins(prep, know)) == -over

    again = remat.plan(loss, *args, budget=0.35, verbose=False)
    # The re-plan starts where a fresh plan does: from the un-checkpointed step's margin.
    compiled = [k for key, k in know.measured.items() if key not in before]
    assert compiled  # the re-plan compiled a candidate of its own
    for k in compiled:
        assert k.predicted == int(k.alone + prep.margin)
    # ... which fits, predicted to within 0.1% of the budget, not a fifth of the peak under.
    assert again.measured_peak_bytes <= again.budget_bytes
    assert abs(again.predicted_peak_bytes - again.measured_peak_bytes) < 0.001 * again.budget_bytes
    assert _memo.start_margin(prep, know) == pytest.approx(prep.margin)
    _memo.forget()


def test_the_margin_learnt_is_never_below_the_unchecked_steps(stack):
    """`Knowledge.learn` floors what a plan shows at the un-checkpointed step's margin, and a
    plan at a new budget starts from the least margin shown, not the last one."""
    loss, args = stack
    _memo.forget()
    remat.plan(loss, *args, budget=0.6, verbose=False)
    (know,) = _memo._MEMORY.values()
    prep = know.prepared
    know.learn(prep.margin - 1000.0)
    assert know.margin == prep.margin
    know.learn(prep.margin + 1000.0)
    assert know.margin == prep.margin + 1000.0
    least = min(
        peak_of(k.measured) - k.alone for k in know.measured.values() if k.alone is not None
    )
    know.restart()
    assert know.margin == max(prep.margin, least)
    _memo.forget()
