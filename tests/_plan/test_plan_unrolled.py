"""`remat.plan` on models whose layers run in a Python loop: rolled, planned, measured."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import remat
from conftest import assert_tree_allclose

SEQ, W = 128, 16  # activations dominate: (SEQ, SEQ) attention and (SEQ, 4W) MLP per layer


def norm(h, g):
    mu = h.mean(-1, keepdims=True)
    return (h - mu) * jax.lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def block(p, x, mask):
    q, k, v = jnp.split(norm(x, p["g1"]) @ p["qkv"], 3, axis=-1)
    a = jax.nn.softmax(jnp.where(mask, q @ k.T / W**0.5, -1e9), axis=-1)
    x = x + (a @ v) @ p["o"]
    return x + jax.nn.gelu(norm(x, p["g2"]) @ p["up"]) @ p["down"]


def layer_params(key):
    ks = jax.random.split(key, 4)
    return {
        "g1": jnp.ones(W),
        "qkv": jax.random.normal(ks[0], (W, 3 * W)) / W**0.5,
        "o": jax.random.normal(ks[1], (W, W)) / W**0.5,
        "g2": jnp.ones(W),
        "up": jax.random.normal(ks[2], (W, 4 * W)) / W**0.5,
        "down": jax.random.normal(ks[3], (4 * W, W)) / (2 * W),
    }


def transformer(layers, x):
    mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
    for p in layers:
        x = block(p, x, mask)
    return jnp.mean(x**2)


X = jax.random.normal(jax.random.key(1), (SEQ, W))
XM = jax.random.normal(jax.random.key(2), (1024, W))  # rows for the MLPs: activations dominate


def as_written(loss, params, *args):
    """The step as written: its measured peak, and its value and gradients."""
    peak = remat.measure(loss, params, *args, repeats=0).peak_bytes
    return peak, jax.jit(jax.value_and_grad(loss))(params, *args)


def assert_plan(plan, loss, params, *args, written=None):
    """``written``: `as_written`'s result, when several plans of one program share it."""
    peak, want = written or as_written(loss, params, *args)
    assert plan.rolled and plan.scans
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.baseline_peak_bytes == peak
    assert_tree_allclose(jax.jit(jax.value_and_grad(plan.fn))(params, *args), want, scale=10.0)


@pytest.mark.slow  # linen and nnx loops below, Equinox in test_eqx.py, run by default
def test_plain_jax_transformer_at_50_and_35_percent():
    layers = [layer_params(k) for k in jax.random.split(jax.random.key(0), 8)]
    half, third = remat.plan_budgets(transformer, layers, X, budgets=[0.5, 0.35])
    written = as_written(transformer, layers, X)
    for plan in (half, third):
        assert isinstance(plan, remat.Plan), plan
        assert_plan(plan, transformer, layers, X, written=written)
    assert third.measured_peak_bytes <= 0.35 * third.baseline_peak_bytes + 1
    # the explanation says the layers were rolled, and how to run the plan on the loop
    text = half.explain()
    assert "rolled into scans" in text and "remat.apply(loss_fn, plan)" in text
    assert ("In your own scan" in text) is False


def test_fits_as_written_keeps_it_as_written():
    layers = [layer_params(k) for k in jax.random.split(jax.random.key(0), 3)]
    plan = remat.plan(transformer, layers, X, budget=1.0, schedules=False)
    assert not plan.rolled and plan.scans == () and plan.fn is transformer
    assert plan.measured.flops == plan.baseline_flops  # nothing recomputed


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * W)(nn.LayerNorm()(x))
        return x + nn.Dense(W)(jnp.tanh(h))


class LinenLoop(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(6):
            x = LinenBlock()(x)
        return jnp.mean(x**2)


def test_linen_compact_loop_at_50_percent():
    model = LinenLoop()
    params = model.init(jax.random.key(0), XM)
    plan = remat.plan(model.apply, params, XM, budget="50%", schedules=False)
    assert_plan(plan, model.apply, params, XM)


class NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(W, 4 * W, rngs=rngs)
        self.down = nnx.Linear(4 * W, W, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jnp.tanh(self.up(x)))


class NnxLoop(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.data([NnxBlock(rngs) for _ in range(6)])  # a plain Python list

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return jnp.mean(x**2)


def test_nnx_plain_list_at_50_percent():
    graphdef, state = nnx.split(NnxLoop(nnx.Rngs(0)))

    def loss(state, x):
        return nnx.merge(graphdef, state)(x)

    plan = remat.plan(loss, state, XM, budget="50%", schedules=False)
    assert_plan(plan, loss, state, XM)


def test_no_repetition_says_why():
    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w) ** 2)

    with pytest.raises(ValueError, match="no repeated layers to roll into one: no repeated"):
        remat.plan(loss, jnp.eye(W), X, budget=0.5)


def test_no_roll_plans_only_the_programs_own_scans():
    layers = [layer_params(k) for k in jax.random.split(jax.random.key(0), 2)]
    with pytest.raises(ValueError, match="found no `scan`"):
        remat.plan(transformer, layers, X, budget=0.5, roll=False)


def test_a_second_plan_of_a_loop_reuses_what_the_first_learned(monkeypatch):
    """Planned again at another budget in one process, a loop of layers is not calibrated
    again, and the first plan's compiled points compete: it is never dearer than a plan
    already compiled that fits."""
    from remat._plan import _memo, _unrolled

    calls = []
    prepare = _unrolled.prepare
    monkeypatch.setattr(_unrolled, "prepare", lambda *a, **k: calls.append(1) or prepare(*a, **k))
    _memo.forget()
    layers = [layer_params(k) for k in jax.random.split(jax.random.key(0), 4)]
    first = remat.plan(transformer, layers, X, budget=0.5, schedules=False, verbose=False)
    second = remat.plan(transformer, layers, X, budget=0.6, schedules=False, verbose=False)
    assert len(calls) == 1
    assert second.rolled and second.flops_ratio <= first.flops_ratio
