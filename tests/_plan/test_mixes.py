"""The per-layer options found on a thread beside the uniform rounds (`remat._plan._mixes`):
an error there reaches the caller with its own message and is not remembered, no thread
outlives the plan that started it however the plan ends, and the plan does not depend on
when the thread ends."""

from __future__ import annotations

import threading

import pytest

import remat
from conftest import mlp_stack
from remat._plan import _mixes, _rounds
from remat._plan._memo import forget

BUDGET = "60%"


@pytest.fixture(scope="module")
def stack():
    return mlp_stack(layers=4, d=16, batch=64)


@pytest.fixture(autouse=True)
def fresh():
    forget()
    yield
    forget()


def _running() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("remat-mixes")]


def _slow(monkeypatch, seconds: float = 1.0):
    """The per-layer options found as before, ``seconds`` later (the thread still runs while
    the rounds begin)."""
    real = _mixes.period_candidates

    def find(*args, **kwargs):
        threading.Event().wait(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(_mixes, "period_candidates", find)


def _signature(p):
    return p.scans, p.measured_peak_bytes, p.measured.flops, p.rounds, p.stats.step_compiles


def test_an_error_on_the_thread_reaches_the_caller_and_is_not_remembered(stack, monkeypatch):
    loss, args = stack

    def broken(*_args, **_kwargs):
        raise ValueError("a front of no points: layer 3's integer program")

    monkeypatch.setattr(_mixes, "period_candidates", broken)
    with pytest.raises(ValueError, match="a front of no points: layer 3's") as raised:
        remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    assert raised.value.__context__ is None and not _running()
    monkeypatch.undo()
    # The program's knowledge was not kept with the failed options: found again, they plan.
    again = remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    _slow(monkeypatch)  # the same plan when the thread ends after the rounds began
    forget()
    late = remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    assert _signature(late) == _signature(again)


def _interrupted(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("ends", ["infeasible", "interrupted"])
def test_a_plan_that_raises_leaves_no_thread_running(stack, monkeypatch, ends):
    """The plan raises before it needs the per-layer options (a budget under the arguments
    and outputs; an interrupt as the rounds begin): the thread is waited for, and the
    program's knowledge, kept, plans the next budget."""
    loss, args = stack
    _slow(monkeypatch)
    if ends == "infeasible":
        with pytest.raises(
            remat.InfeasibleBudget, match=r"cannot fit budget 2048 .*arguments and outputs alone"
        ):
            remat.plan(loss, *args, budget=2048, per_layer=True, verbose=False)
    else:
        monkeypatch.setattr(_rounds, "check_relative", _interrupted)
        with pytest.raises(KeyboardInterrupt):
            remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    assert not _running()
    monkeypatch.undo()
    p = remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    assert p.measured_peak_bytes <= p.budget_bytes


def test_plan_budgets_leaves_no_thread_running(stack, monkeypatch):
    loss, args = stack
    _slow(monkeypatch)
    (refused,) = remat.plan_budgets(loss, *args, budgets=[2048], per_layer=True, verbose=False)
    assert isinstance(refused, remat.InfeasibleBudget) and not _running()


def test_a_program_without_per_layer_options_plans_as_uniform(stack, monkeypatch):
    """Where the thread finds no per-layer option, the per-layer searches do not run (they
    would search the uniform options again) and the plan is the uniform one, with its
    compiles."""
    loss, args = stack
    searched = []
    for name in ("_per_layer", "smaller_as_cheap"):
        real = getattr(_rounds, name)
        monkeypatch.setattr(
            _rounds, name, lambda *a, real=real, **k: searched.append(a) or real(*a, **k)
        )
    monkeypatch.setattr(_mixes, "period_candidates", lambda *_a, **_k: [])
    mixed = remat.plan(loss, *args, budget=BUDGET, per_layer=True, verbose=False)
    assert searched == []
    forget()
    uniform = remat.plan(loss, *args, budget=BUDGET, verbose=False)
    assert _signature(mixed) == _signature(uniform)
