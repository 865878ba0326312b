"""A plan never exceeds its budget, judged by the compiled program itself.

For each architecture and budget fraction, the plan's compiled peak is computed here from XLA's
memory analysis (``temp + argument + output - alias``, without remat's helpers) and must be at
most the budget; `Plan.measured_peak_bytes` must equal it; the gradients must equal the
program's; and a budget is called infeasible only when checkpointing every step by hand
(``"full"``) does not fit it either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose

FRACTIONS = (0.9, 0.7, 0.5, 0.35)


def _compiled_peak(fn, *args) -> int:
    stats = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis()
    return (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
    )


def mlp_with_norm_and_bias():
    """12 scanned MLP blocks with layer norm and bias: temporaries dominate."""
    k = jax.random.split(jax.random.key(0), 4)
    layers, d, h = 12, 32, 128
    params = {
        "w1": jax.random.normal(k[0], (layers, d, h)) * 0.1,
        "b1": jnp.zeros((layers, h)),
        "w2": jax.random.normal(k[1], (layers, h, d)) * 0.1,
        "b2": jnp.zeros((layers, d)),
    }
    x = jax.random.normal(k[2], (128, d))

    def loss(params, x):
        def block(y, p):
            mu = y.mean(-1, keepdims=True)
            z = (y - mu) / jnp.sqrt(((y - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
            z = jax.nn.gelu(z @ p["w1"] + p["b1"])
            return y + z @ p["w2"] + p["b2"], None

        y, _ = jax.lax.scan(block, x, params)
        return jnp.mean(y**2)

    return loss, (params, x)


def attention_stack():
    """6 scanned self-attention blocks: the (heads, seq, seq) scores dominate."""
    k = jax.random.split(jax.random.key(1), 3)
    layers, seq, d = 6, 64, 32
    params = {"qkv": jax.random.normal(k[0], (layers, d, 3 * d)) * 0.1,
              "o": jax.random.normal(k[1], (layers, d, d)) * 0.1}  # fmt: skip
    x = jax.random.normal(k[2], (4, seq, d))

    def loss(params, x):
        def block(y, p):
            q, kk, v = jnp.split(y @ p["qkv"], 3, axis=-1)
            att = jax.nn.softmax(q @ kk.transpose(0, 2, 1) / jnp.sqrt(d), axis=-1)
            return y + (att @ v) @ p["o"], None

        y, _ = jax.lax.scan(block, x, params)
        return jnp.mean(y**2)

    return loss, (params, x)


def gru_like_recurrence():
    """A 256-step gated recurrence with shared weights: the per-step carries dominate."""
    k = jax.random.split(jax.random.key(2), 3)
    d = 32
    params = {"wz": jax.random.normal(k[0], (d, d)) * 0.1,
              "wh": jax.random.normal(k[1], (d, d)) * 0.1}  # fmt: skip
    xs = jax.random.normal(k[2], (256, 16, d))

    def loss(params, xs):
        def step(h, x):
            z = jax.nn.sigmoid((h + x) @ params["wz"])
            return (1 - z) * h + z * jnp.tanh((h * x) @ params["wh"]), None

        h, _ = jax.lax.scan(step, jnp.zeros((16, d)), xs)
        return jnp.mean(h**2)

    return loss, (params, xs)


def output_dominated_stack():
    """Wide tanh layers, small batch: the gradients outweigh the temporaries."""
    ws = jnp.full((8, 256, 256), 0.01)
    x = jnp.ones((8, 256))

    def loss(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return jnp.sum(y**2)

    return loss, (ws, x)


ARCHITECTURES = {
    "mlp": mlp_with_norm_and_bias,
    "attention": attention_stack,
    "gru": gru_like_recurrence,
    "outputs": output_dominated_stack,
}


def _check(plan_or_error, loss, args, budget_fraction, baseline, full_peak, reference):
    budget = int(budget_fraction * baseline)
    if isinstance(plan_or_error, remat.InfeasibleBudget):
        # Infeasible only where checkpointing every step by hand does not fit either, and only
        # when the smallest peak reached is really above the budget.
        assert full_peak > budget, (budget_fraction, full_peak, budget)
        assert plan_or_error.smallest_peak_bytes > plan_or_error.budget_bytes
        return
    plan = plan_or_error
    compiled = _compiled_peak(plan.fn, *args)
    assert compiled <= plan.budget_bytes, (budget_fraction, compiled, plan.budget_bytes)
    assert plan.measured_peak_bytes == compiled
    assert_tree_allclose(jax.grad(plan.fn)(*args), reference, scale=10.0)


# The normal suite sweeps the budgets of two architectures (each plan compiles the step several
# times); the `slow` sweep runs every fraction on every architecture.
QUICK = [("outputs", FRACTIONS), ("mlp", (0.35,))]
FULL = [pytest.param(name, FRACTIONS, marks=pytest.mark.slow) for name in sorted(ARCHITECTURES)]


@pytest.mark.parametrize(("name", "fractions"), QUICK + FULL)
def test_plan_budgets_never_exceed_the_budget(name, fractions):
    loss, args = ARCHITECTURES[name]()
    baseline = _compiled_peak(loss, *args)
    full_peak = _compiled_peak(remat.apply(loss, "full"), *args)
    reference = jax.grad(loss)(*args)
    results = remat.plan_budgets(loss, *args, budgets=fractions, schedules=False)
    for fraction, result in zip(fractions, results, strict=True):
        _check(result, loss, args, fraction, baseline, full_peak, reference)


@pytest.mark.parametrize("name", ["outputs", pytest.param("mlp", marks=pytest.mark.slow)])
def test_plan_with_schedules_fits(name):
    loss, args = ARCHITECTURES[name]()
    baseline = _compiled_peak(loss, *args)
    full_peak = _compiled_peak(remat.apply(loss, "full"), *args)
    reference = jax.grad(loss)(*args)
    try:
        result = remat.plan(loss, *args, budget=0.5)
    except remat.InfeasibleBudget as err:
        result = err
    _check(result, loss, args, 0.5, baseline, full_peak, reference)
