"""``donate_argnums`` with every schedule: a donated training step whose loss runs its scan
per step, `remat.Nested` or `remat.Binomial` (with a typed dropout key in the carry), and the
optimizer's donated step that `remat.measure(..., optimizer=tx)` compiles."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import remat
from conftest import assert_tree_allclose

SCHEDULES = ["per_step", remat.Nested(2), remat.Binomial(2)]


def loss(ws, x, key):
    def layer(c, w):
        h, k = c
        k, sub = jax.random.split(k)
        h = jnp.tanh(h @ w)
        return (h * jax.random.bernoulli(sub, 0.8, h.shape), k), None

    (h, _), _ = jax.lax.scan(layer, (x, key), ws)
    return jnp.mean(h**2)


def step(fn, ws, x, key):
    value, grads = jax.value_and_grad(fn)(ws, x, key)
    return ws - 0.1 * grads, value


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_donated_step_under_every_schedule(schedule):
    fn = remat.apply(loss, remat.Strategy(schedule=schedule))
    ws0, x, key = jnp.ones((6, 8, 8)) * 0.2, jnp.ones((4, 8)), jax.random.key(0)
    donated = jax.jit(lambda *a: step(fn, *a), donate_argnums=(0, 2))
    plain = jax.jit(lambda *a: step(loss, *a))
    ws, want_ws = jnp.copy(ws0), ws0
    for i in range(2):
        want_ws, want = plain(want_ws, x, jax.random.key(i))
        ws, got = donated(ws, x, jax.random.key(i))
    assert_tree_allclose((ws, got), (want_ws, want))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        m = remat.measure(
            loss,
            ws,
            x,
            key,
            strategy=remat.Strategy(schedule=schedule),
            optimizer=optax.sgd(0.1),
            repeats=1,
        )
    assert m.alias_bytes >= ws.size * 4
