"""Training steps as people write them, through every entry point: PRNG keys (raw
`jax.random.PRNGKey` and typed `jax.random.key`) in arguments, scan carries and scanned inputs.

Every checkpointed step is compared with the plain step at the same key: the dropout masks are
values of the program, so the recomputation draws the same masks and the gradients are equal.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose

L, B, D = 4, 8, 16
KEYS = {"raw": jax.random.PRNGKey, "typed": jax.random.key}
SCHEDULES = {
    "per_step": "full",
    "nested": remat.Strategy(schedule=remat.Nested(2)),
    "binomial": remat.Strategy(schedule=remat.Binomial(2)),
}


def dropout_in_carry(ws, x, key):
    """The key travels in the carry and is split at every layer."""

    def layer(c, w):
        h, k = c
        k, sub = jax.random.split(k)
        h = jnp.tanh(h @ w)
        return (h * jax.random.bernoulli(sub, 0.5, h.shape) * 2.0, k), None

    (h, _), _ = jax.lax.scan(layer, (x, key), ws)
    return jnp.sum(h**2)


def dropout_in_xs(ws, x, key):
    """One key per layer, scanned over with the weights."""

    def layer(h, wk):
        w, k = wk
        h = jnp.tanh(h @ w)
        return h * jax.random.bernoulli(k, 0.5, h.shape) * 2.0, None

    h, _ = jax.lax.scan(layer, x, (ws, jax.random.split(key, ws.shape[0])))
    return jnp.sum(h**2)


def dropout_in_params(params, x):
    """The key is a leaf of the differentiated argument: it gets no gradient."""
    return dropout_in_xs(params["w"], x, params["key"])


@functools.cache
def weights():
    kw, kx = jax.random.split(jax.random.key(1))
    return jax.random.normal(kw, (L, D, D)) / D**0.5, jax.random.normal(kx, (B, D))


@pytest.mark.parametrize(
    "loss, kind, schedule",
    [
        (dropout_in_carry, "typed", "binomial"),
        (dropout_in_carry, "raw", "binomial"),
        (dropout_in_carry, "typed", "nested"),
        (dropout_in_xs, "typed", "per_step"),
        (dropout_in_xs, "raw", "binomial"),
    ],
)
def test_keys_through_every_schedule(loss, kind, schedule):
    ws, x = weights()
    key = KEYS[kind](3)
    want = jax.value_and_grad(loss)(ws, x, key)
    got = jax.jit(jax.value_and_grad(remat.apply(loss, SCHEDULES[schedule])))(ws, x, key)
    assert_tree_allclose(got, want)
    # the masks depend on the key: another key gives another loss
    other = jax.value_and_grad(loss)(ws, x, KEYS[kind](4))
    assert not jnp.allclose(other[0], want[0])


@pytest.mark.parametrize("kind", KEYS)
def test_keys_through_remat_scan_binomial(kind):
    ws, x = weights()

    def loss(ws, x, key, schedule):
        def layer(c, w):
            h, k = c
            k, sub = jax.random.split(k)
            return (jnp.tanh(h @ w) * jax.random.uniform(sub, h.shape), k), k

        (h, k), keys = remat.scan(layer, (x, key), ws, schedule=schedule)
        assert k.dtype == key.dtype and keys.dtype == key.dtype
        return jnp.sum(h**2)

    key = KEYS[kind](0)
    want = jax.grad(loss)(ws, x, key, "none")
    for schedule in ("per_step", remat.Nested(2), remat.Binomial(2)):
        assert_tree_allclose(jax.grad(loss)(ws, x, key, schedule), want)


def test_keys_through_measure_compare_list_scans_and_lint():
    ws, x = weights()
    key = jax.random.key(0)
    m = remat.measure(dropout_in_carry, ws, x, key, strategy="full", repeats=0)
    plain = remat.measure(dropout_in_carry, ws, x, key, repeats=0)
    assert m.flops > plain.flops
    assert m.residual_bytes < plain.residual_bytes
    report = remat.compare(dropout_in_xs, ws, x, key, strategies=["full"], repeats=0)
    assert report.labels == ("none", "full")
    assert [s.length for s in remat.list_scans(dropout_in_xs, ws, x, key)] == [L]
    assert isinstance(remat.lint(dropout_in_xs, ws, x, key, measure=False), list)


@pytest.mark.parametrize("kind", KEYS)
def test_keys_in_the_differentiated_argument(kind):
    ws, x = weights()
    params = {"w": ws, "key": KEYS[kind](0)}
    m = remat.measure(dropout_in_params, params, x, strategy="full", repeats=0)
    assert m.peak_bytes > 0
    want = jax.grad(dropout_in_params, allow_int=True)(params, x)
    got = jax.grad(remat.apply(dropout_in_params, "full"), allow_int=True)(params, x)
    assert_tree_allclose(got["w"], want["w"])


def test_keys_through_plan():
    ws = jnp.ones((8, 32, 32)) / 32
    x, key = jnp.ones((64, 32)), jax.random.key(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        plan = remat.plan(dropout_in_carry, ws, x, key, budget=0.8, schedules=False)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert_tree_allclose(
        jax.value_and_grad(plan.fn)(ws, x, key), jax.value_and_grad(dropout_in_carry)(ws, x, key)
    )


@pytest.mark.parametrize("kind", KEYS)
def test_linen_dropout_with_rngs(kind):
    """`nn.scan` over `nn.Dropout` blocks, the key passed as ``rngs={"dropout": key}``."""
    from flax import linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            h = nn.Dense(D)(h)
            return nn.Dropout(0.5, deterministic=False)(jnp.tanh(h)), None

    Stack = nn.scan(
        Block,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        length=L,
    )
    model = Stack()
    _, x = weights()
    params = model.init(jax.random.key(0), x, None)["params"]

    def loss(params, x, key):
        h, _ = model.apply({"params": params}, x, None, rngs={"dropout": key})
        return jnp.mean(h**2)

    key = KEYS[kind](7)
    want = jax.value_and_grad(loss)(params, x, key)
    strategy = SCHEDULES["binomial" if kind == "typed" else "per_step"]
    got = jax.value_and_grad(remat.apply(loss, strategy))(params, x, key)
    assert_tree_allclose(got, want)
    if kind == "raw":
        m = remat.measure(loss, params, x, key, strategy="full", repeats=0)
        assert m.flops > remat.measure(loss, params, x, key, repeats=0).flops
