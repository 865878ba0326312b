"""`remat.plan` on models whose layers run in a Python loop: rolled, planned, measured."""

from __future__ import annotations

from pathlib import Path

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


### Layers in a Python loop beside the program's own scans

DATA = Path(__file__).parent.parent / "data"
XS = XM[:256]  # fewer rows: one round of planning


def mlp(p, x):
    return x + jnp.tanh(x @ p["up"]) @ p["down"]


def beside_scans(params, x):
    """A `lax.scan` over two stacked layers (scan 0), four more in a Python loop, and a loss
    chunked with `lax.map` (scan 1): what the plan file in tests/data was made for."""
    with jax.named_scope("stack"):
        x, _ = jax.lax.scan(lambda h, p: (mlp(p, h), None), x, params["stack"])
    for p in params["loop"]:
        x = mlp(p, x)
    return jax.lax.map(lambda h: jnp.sum(jnp.tanh(h) ** 2), x.reshape(4, -1, W)).sum() / len(x)


def beside_params():
    ks = jax.random.split(jax.random.key(3), 6)

    def one(k, n=()):
        a, b = jax.random.split(k)
        return {"up": jax.random.normal(a, (*n, W, 4 * W)) / W**0.5,
                "down": jax.random.normal(b, (*n, 4 * W, W)) / (2 * W)}  # fmt: skip

    return {"stack": one(ks[0], (2,)), "loop": [one(k) for k in ks[2:]]}


def test_layers_beside_scans_plan_below_what_their_scans_alone_reach():
    """Checkpointing every scan of the program as written (`full`, without rolling) is the
    least its own scans reach; with the loop rolled beside them a plan fits below it."""
    params = beside_params()
    alone = remat.measure(beside_scans, params, XS, strategy="full", roll=False, repeats=0)
    plan = remat.plan(beside_scans, params, XS, budget="50%", schedules=False)
    assert plan.budget_bytes < alone.peak_bytes
    assert_plan(plan, beside_scans, params, XS)
    assert {s.position for s in plan.scans} <= {0, 1, 2}
    assert [(s.position, s.name) for s in remat.list_scans(beside_scans, params, XS)] == [
        (0, "stack"), (1, ""), (2, "rolled_4_layers")
    ]  # fmt: skip


def test_a_plan_file_made_before_rolling_beside_scans_applies_to_the_same_scans():
    """A plan of the program as written (made when remat rolled only programs without scans)
    loads, and applies to scans 0 and 1 as it did: the loop is not rolled for it."""
    params = beside_params()
    path = DATA / "plan_scans_beside_loop.json"
    plan = remat.load_plan(path, beside_scans, params, XS)
    assert not plan.rolled and [s.position for s in plan.scans] == [0, 1]
    planned = remat.apply(beside_scans, path)
    eqns = jax.make_jaxpr(planned)(params, XS).eqns
    assert [e.params["length"] for e in eqns if e.primitive.name == "scan"] == [2, 4]
    want = jax.jit(jax.value_and_grad(beside_scans))(params, XS)
    assert_tree_allclose(jax.jit(jax.value_and_grad(planned))(params, XS), want, scale=10.0)


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
