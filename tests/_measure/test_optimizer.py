"""The optimizer is part of the budget: ``optimizer=tx`` on `remat.measure`, `remat.compare` and
`remat.plan` measures the whole training step (value and gradient, ``tx.update``,
``optax.apply_updates``, parameters and optimizer state donated), and `Plan.step` runs it."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import remat
from conftest import assert_tree_allclose

L, B, D = 8, 64, 32


def loss(params, x, key):
    def layer(h, wk):
        w, k = wk
        h = jnp.tanh(h @ w)
        return h * jax.random.bernoulli(k, 0.9, h.shape) / 0.9, None

    keys = jax.random.split(key, params["w"].shape[0])
    h, _ = jax.lax.scan(layer, x, (params["w"], keys))
    return jnp.mean(h**2)


def args():
    kw, kx = jax.random.split(jax.random.key(0))
    params = {"w": jax.random.normal(kw, (L, D, D)) / D**0.5}
    return params, jax.random.normal(kx, (B, D)), jax.random.key(5)


def test_measure_the_whole_step():
    params, x, key = args()
    grad_only = remat.measure(loss, params, x, key, strategy="full", repeats=0)
    step = remat.measure(
        loss, params, x, key, strategy="full", optimizer=optax.adam(1e-3), repeats=1
    )
    w_bytes = L * D * D * 4
    # Adam's two moments are arguments; parameters and moments are donated (aliased)
    assert step.argument_bytes >= grad_only.argument_bytes + 2 * w_bytes
    assert step.alias_bytes >= 3 * w_bytes
    assert step.peak_bytes > grad_only.peak_bytes
    assert step.seconds is not None
    assert bool(jnp.all(jnp.isfinite(params["w"])))  # the caller's parameters are not donated
    report = remat.compare(
        loss, params, x, key, strategies=["full"], optimizer=optax.sgd(0.1), repeats=0
    )
    assert report.labels == ("none", "full")


def test_plan_step_equals_optax_step():
    params, x, key = args()
    tx = optax.adam(1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        plan = remat.plan(loss, params, x, key, budget=0.9, optimizer=tx, schedules=False)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    grad_only = remat.measure(loss, params, x, key, repeats=0)
    assert plan.baseline_peak_bytes > grad_only.peak_bytes  # the budget is the step's
    assert_tree_allclose(plan.fn(params, x, key), loss(params, x, key))  # fn stays the loss

    def optax_step(params, opt_state, x, key):
        value, grads = jax.value_and_grad(loss)(params, x, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    p1, s1 = params, tx.init(params)
    p2, s2 = jax.tree_util.tree_map(jnp.copy, params), tx.init(params)
    for _ in range(3):
        p1, s1, v1 = jax.jit(optax_step)(p1, s1, x, key)
        p2, s2, v2 = plan.step(p2, s2, x, key)
    assert_tree_allclose((p2, s2, v2), (p1, s1, v1), scale=10)
    assert plan.to_dict()["argnums"] == 0 and "optimizer" not in plan.to_dict()
    other = optax.sgd(0.1, momentum=0.9).init(p2)  # another optimizer's state
    with pytest.raises(ValueError, match=r"`Plan\.step` got an opt_state .*plan\.optimizer\.init"):
        plan.step(p2, other, x, key)


def test_optimizer_errors():
    params, x, key = args()
    with pytest.raises(ValueError, match=r"`remat\.measure` got optimizer=.*argnums"):
        remat.measure(loss, params, x, key, argnums=(0, 1), optimizer=optax.sgd(0.1))
    with pytest.raises(TypeError, match=r"`remat\.measure` got optimizer=.*GradientTransformation"):
        remat.measure(loss, params, x, key, optimizer="adam")
    plan = remat.plan(loss, params, x, key, budget=1.0, schedules=False)
    with pytest.raises(ValueError, match=r"`Plan\.step` needs the optimizer"):
        plan.step  # noqa: B018
