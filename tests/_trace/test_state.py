"""Model state is never lost: nnx modules with `nnx.BatchNorm` and `nnx.Dropout` trained under
`remat.apply` with `nnx.value_and_grad` and `nnx.Optimizer`, nnx split state returned as aux,
and linen ``mutable=["batch_stats"]``: after several steps the parameters and every piece of
state (batch statistics, RNG counts and keys, optimizer moments) equal the plain steps'."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import remat
from conftest import assert_tree_allclose

L, B, D = 3, 4, 8
STEPS = 3


def _plain(state):
    """Keys as their key data, so that states compare with `assert_tree_allclose`."""
    is_key = lambda a: jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)  # noqa: E731
    return jax.tree_util.tree_map(lambda a: jax.random.key_data(a) if is_key(a) else a, state)


def nnx_model():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(D, D, rngs=rngs)
            self.norm = nnx.BatchNorm(D, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, h):
            return self.drop(self.norm(jnp.tanh(self.linear(h))))

    class Model(nnx.Module):
        def __init__(self, rngs):
            @nnx.split_rngs(splits=L)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return Block(rngs)

            self.blocks = make(rngs)

        def __call__(self, x):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def run(h, block):
                return block(h)

            return run(x, self.blocks)

    return Model(nnx.Rngs(0, dropout=1))


def nnx_loss(model, x):
    return jnp.mean(model(x) ** 2)


X = jax.random.normal(jax.random.key(1), (B, D))


@pytest.mark.parametrize("strategy", ["full", remat.Strategy(schedule=remat.Binomial(2)), "plan"])
def test_nnx_module_trains_with_its_state(strategy):
    from flax import nnx

    if strategy == "plan":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", remat.RematWarning)
            fn = remat.plan(nnx_loss, nnx_model(), X, budget=0.9, schedules=False).fn
    else:
        fn = remat.apply(nnx_loss, strategy)

    def train(loss):
        model = nnx_model()
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, x):
            value, grads = nnx.value_and_grad(loss)(model, x)
            optimizer.update(model, grads)
            return value

        losses = [step(model, optimizer, X) for _ in range(STEPS)]
        return losses, _plain(nnx.state(model)), _plain(nnx.state(optimizer))

    want, got = train(nnx_loss), train(fn)
    assert_tree_allclose(got, want, scale=10)
    # the state did change: batch statistics moved and the dropout stream advanced
    stats = got[1]["blocks"]["norm"]["mean"]
    assert float(jnp.abs(stats[...]).max()) > 0
    assert int(got[1]["blocks"]["drop"]["rngs"]["count"][...].max()) == STEPS


def test_nnx_module_called_eagerly_keeps_its_state():
    model, plain = nnx_model(), nnx_model()
    remat.apply(nnx_loss, "full")(model, X)
    nnx_loss(plain, X)
    from flax import nnx

    assert_tree_allclose(_plain(nnx.state(model)), _plain(nnx.state(plain)))


def test_nnx_split_state_returned_as_aux():
    from flax import nnx

    graphdef, params, rest = nnx.split(nnx_model(), nnx.Param, ...)

    def loss(params, rest, x):
        model = nnx.merge(graphdef, params, rest)
        value = nnx_loss(model, x)
        return value, nnx.state(model, nnx.Not(nnx.Param))

    def train(fn):
        p, r = params, rest
        # `rest` (batch statistics, RNG counts) is traced with the parameters, so that nnx
        # lets the loss change it; its gradients are dropped.
        step = jax.jit(jax.value_and_grad(fn, (0, 1), has_aux=True, allow_int=True))
        for _ in range(STEPS):
            (value, r), (grads, _) = step(p, r, X)
            p = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads)
        return value, _plain(p), _plain(r)

    assert_tree_allclose(train(remat.apply(loss, "full", has_aux=True)), train(loss), scale=10)


def test_linen_batch_stats_returned_as_aux():
    from flax import linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            h = nn.BatchNorm(use_running_average=False)(jnp.tanh(nn.Dense(D)(h)))
            return h, None

    model = nn.scan(
        Block,
        variable_axes={"params": 0, "batch_stats": 0},
        split_rngs={"params": True},
        length=L,
    )()
    variables = model.init(jax.random.key(0), X, None)

    def loss(params, stats, x):
        (h, _), updates = model.apply(
            {"params": params, "batch_stats": stats}, x, None, mutable=["batch_stats"]
        )
        return jnp.mean(h**2), updates["batch_stats"]

    def train(fn):
        p, s = variables["params"], variables["batch_stats"]
        step = jax.jit(jax.value_and_grad(fn, has_aux=True))
        for _ in range(STEPS):
            (value, s), grads = step(p, s, X)
            p = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads)
        return value, p, s

    assert_tree_allclose(train(remat.apply(loss, "full", has_aux=True)), train(loss), scale=10)


def test_in_place_changes_to_arguments_are_refused():
    def loss(state, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, state["w"])
        state["steps"] = state["steps"] + 1  # lost under tracing: refused, by name
        return jnp.sum(h)

    state = {"w": jnp.ones((L, D, D)) * 0.1, "steps": jnp.zeros((), jnp.int32)}
    with pytest.raises(ValueError, match=r"loss` changed its argument args\[0\]\['steps'\]"):
        remat.apply(loss, "full")(state, X)
