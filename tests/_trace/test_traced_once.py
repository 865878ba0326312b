"""`traced_once`: one trace of a function at one input structure, shared within a block
(what `remat.plan` runs in), counted by the Python calls of the loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import remat
from conftest import mlp_stack
from remat._plan._memo import forget
from remat._trace._tag import planned_scans
from remat._trace._traced import traced_once


def counted(fn):
    calls = []

    def loss(*args):
        calls.append(1)
        return fn(*args)

    return loss, calls


def test_a_block_traces_each_function_at_each_structure_once():
    inner, (params, x) = mlp_stack(layers=3, d=4, batch=8)
    loss, calls = counted(inner)
    with traced_once():
        first = planned_scans(loss, params, x)
        assert planned_scans(loss, params, x) == first and len(calls) == 1
        planned_scans(loss, params, x[:4])  # another shape: traced again
        assert len(calls) == 2
    planned_scans(loss, params, x)  # outside the block: traced as before
    assert len(calls) == 3


def test_a_plan_traces_the_loss_four_times_whatever_its_rounds():
    """The input check (`jax.eval_shape`), one trace shared by the scans' listing, models,
    shardings and every rewrite the rounds compile, the baseline's lowering and its
    residuals; before, each stage and each verified plan traced the loss again."""
    inner, args = mlp_stack(layers=4, d=8, batch=64, seed=5)
    loss, calls = counted(inner)
    forget()
    plan = remat.plan(loss, *args, budget="60%", verbose=False)
    assert plan.stats.step_compiles >= 2  # the baseline and at least one verified plan
    assert len(calls) == 4
    assert jnp.allclose(jax.grad(plan.fn)(*args)[0], jax.grad(inner)(*args)[0], rtol=1e-5)
