"""The public names: what `import remat` and `remat.recipes` offer, and plan files that load."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import remat
from remat import recipes

DATA = Path(__file__).resolve().parent / "data"

PUBLIC = [
    "Action",
    "Binomial",
    "Finding",
    "InfeasibleBudget",
    "LiveValue",
    "Machine",
    "Measurement",
    "MemoryView",
    "Nested",
    "Plan",
    "RematWarning",
    "Report",
    "Residual",
    "STRATEGY_NAMES",
    "ScanInfo",
    "Strategy",
    "Target",
    "Timing",
    "apply",
    "compare",
    "lint",
    "list_scans",
    "load_plan",
    "measure",
    "memory",
    "parse_target",
    "per_device_bytes",
    "plan",
    "plan_budgets",
    "plot_memory",
    "recipes",
    "revolve_cost",
    "revolve_schedule",
    "rewrite_scans",
    "scan",
]
RECIPES = [
    "checkpoint_forward",
    "checkpointed_block_grad",
    "grad_checkpointed_stack",
    "nn_checkpoint_forward",
    "nn_remat_policy",
]


def test_public_names():
    assert sorted(remat.__all__) == sorted(set(PUBLIC) - {"recipes"})
    assert sorted(n for n in dir(remat) if not n.startswith("_")) == PUBLIC
    assert all(getattr(remat, n) is not None for n in remat.__all__)


def test_recipe_names():
    assert sorted(recipes.__all__) == RECIPES
    assert all(callable(getattr(recipes, n)) for n in RECIPES)


def test_console_script_entry_point():
    from remat._cli import main

    assert callable(main)


def loss(ws, x):
    """The function the plan files in tests/data were made for (with `ARGS`)."""
    x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
    return (x**2).sum()


ARGS = (jnp.ones((64, 8, 8)) * 0.1, jnp.ones((64, 8)))


@pytest.mark.parametrize(
    ("name", "schedule"),
    [("plan_v1_nested.json", remat.Nested(2)), ("plan_v1_binomial.json", remat.Binomial(8))],
)
def test_plan_files_of_format_1_still_load(name, schedule):
    """Plans written by version 0.1.0 (format 1) load, and the loaded plan computes `loss`."""
    p = remat.load_plan(DATA / name, loss, *ARGS)
    assert [s.schedule for s in p.scans] == [schedule]
    assert p.scans[0].names == ("remat_s0_e0",)
    assert p.measured is not None and p.measured_peak_bytes <= p.budget_bytes
    assert bool(jnp.allclose(p.fn(*ARGS), loss(*ARGS)))
    got, want = jax.grad(p.fn)(*ARGS), jax.grad(loss)(*ARGS)
    assert bool(jnp.allclose(got, want, rtol=1e-5, atol=1e-6))


def test_a_plan_given_as_a_strategy_says_what_to_pass_instead():
    """`strategy=plan` names the two forms that measure the planned program; nothing compiles."""
    p = remat.load_plan(DATA / "plan_v1_nested.json", loss, *ARGS)
    for call in (
        lambda: remat.measure(loss, *ARGS, strategy=p, repeats=0),
        lambda: remat.compare(loss, *ARGS, strategies=["full", p], repeats=0),
    ):
        with pytest.raises(ValueError, match=r"got a `remat\.Plan` as its strategy") as err:
            call()
        assert "`plan.fn`" in str(err.value) and "remat.apply(fn, plan)" in str(err.value)
        assert "ScanPlan(" not in str(err.value)  # not the plan's whole repr
    with pytest.raises(ValueError, match=r"got strategy 'xxxx.*\.\.\. \(str\), which is not"):
        remat.measure(loss, *ARGS, strategy="x" * 500, repeats=0)


def test_public_exceptions_and_warnings_print_their_public_names():
    import traceback

    classes = [getattr(remat, n) for n in remat.__all__ if isinstance(getattr(remat, n), type)]
    raised = [c for c in classes if issubclass(c, BaseException)]
    assert {c.__name__ for c in raised} == {"InfeasibleBudget", "RematWarning"}
    for c in raised:
        assert c.__module__ == "remat", c
    err = remat.InfeasibleBudget("1KiB", 1024, 2048, 4096)
    (line,) = traceback.format_exception_only(err)
    assert line.startswith("remat.InfeasibleBudget: `remat.plan` cannot fit budget")


def test_infeasible_budget_where_checkpointing_raises_the_peak_says_so():
    """The least peak compiled above the program's own: no budget under 100% is met, so
    the error does not ask for a budget above the program's peak."""
    err = remat.InfeasibleBudget("70%", 984_292, 1_452_044, 1_406_132)
    assert "103% of the un-checkpointed peak" in str(err)
    assert "does not lower this peak" in str(err) and "Raise the budget" not in str(err)
