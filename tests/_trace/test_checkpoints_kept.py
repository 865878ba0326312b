"""The program's own checkpoints are respected: `remat.apply` keeps them (and says so),
``override=True`` replaces them, and `remat.measure`/`remat.compare` warn with both compiled
peaks when a strategy is worse than the program as written.

Models of three kinds: linen (``nn.remat`` in ``nn.scan``, with ``save_only_these_names``),
nnx (``nnx.remat`` in ``nnx.scan``) and plain JAX (``jax.checkpoint`` in ``lax.scan``).
"""

from __future__ import annotations

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat
from conftest import assert_tree_allclose
from remat._measure._peak import peak_bytes
from remat._trace._checkpoints import checkpoint_names, checkpoint_sites

L, B, D, H = 4, 64, 32, 128
H1 = jax.checkpoint_policies.save_only_these_names("h1")


def step(fn):
    """``fn``'s value and gradient, compiled: the program `peak` reads (the persistent
    compilation cache holds it once), not run op by op."""
    return jax.jit(jax.value_and_grad(fn))


def peak(fn, *args):
    return peak_bytes(step(fn).lower(*args).compile())


@functools.cache
def linen_model():
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h1 = checkpoint_name(nn.gelu(nn.Dense(H)(x)), "h1")
            h2 = nn.gelu(nn.Dense(H)(h1))
            return x + nn.Dense(D)(h2), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = nn.remat(Block, policy=H1, prevent_cse=False)
            stack = nn.scan(
                block, variable_axes={"params": 0}, split_rngs={"params": True}, length=L
            )
            x, _ = stack()(x, None)
            return nn.Dense(1)(x)

    model = Model()
    x = jnp.ones((B, D))
    params = model.init(jax.random.key(0), x)

    def loss(params, x):
        return jnp.mean(model.apply(params, x) ** 2)

    return loss, params, x


def plain_layer(c, w):
    h1 = checkpoint_name(jnp.tanh(c @ w["w1"]), "h1")
    return c + jnp.tanh(h1 @ w["w2"]) @ w["w3"], None


@functools.cache
def plain_model():
    k = jax.random.split(jax.random.key(1), 3)
    ws = {
        "w1": jax.random.normal(k[0], (L, D, H)) * 0.1,
        "w2": jax.random.normal(k[1], (L, H, H)) * 0.1,
        "w3": jax.random.normal(k[2], (L, H, D)) * 0.1,
    }

    def loss(ws, x):
        step = jax.checkpoint(plain_layer, policy=H1, prevent_cse=False)
        return jnp.sum(jax.lax.scan(step, x, ws)[0] ** 2)

    return loss, ws, jnp.ones((B, D))


@functools.cache
def nnx_model():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(D, H, rngs=rngs)
            self.b = nnx.Linear(H, D, rngs=rngs)

        def __call__(self, h):
            return h + self.b(checkpoint_name(jnp.tanh(self.a(h)), "h1"))

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return Block(nnx.Rngs(key))

    graphdef, state = nnx.split(make(jax.random.split(jax.random.key(2), L)))

    def loss(state, x):
        blocks = nnx.merge(graphdef, state)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            return nnx.remat(lambda blk, h: blk(h), policy=H1, prevent_cse=False)(block, h)

        return jnp.sum(run(x, blocks) ** 2)

    return loss, state, jnp.ones((B, D))


MODELS = {"linen": linen_model, "plain": plain_model, "nnx": nnx_model}


@pytest.mark.parametrize("kind", MODELS)
def test_checkpoints_and_names_are_found(kind):
    loss, params, x = MODELS[kind]()
    jaxpr = jax.make_jaxpr(loss)(params, x).jaxpr
    sites = checkpoint_sites(jaxpr)
    assert [s.policy for s in sites] == ["save_only_these_names('h1')"]
    # the user's line, relative to the working directory as every source remat shows
    assert sites[0].source.startswith(os.path.relpath(__file__) + ":")
    assert checkpoint_names(jaxpr) == ("h1",)


@pytest.mark.parametrize("kind", MODELS)
def test_apply_keeps_the_programs_checkpoints_and_says_so(kind):
    loss, params, x = MODELS[kind]()
    with pytest.warns(remat.RematWarning, match=r"kept the program's own checkpoints.*h1"):
        kept = remat.apply(loss, "dots")
        assert_tree_allclose(step(kept)(params, x), step(loss)(params, x))
        # the program is left as written: the same compiled peak, never a worse one
        assert peak(kept, params, x) == peak(loss, params, x)


@pytest.mark.parametrize("kind", MODELS)
def test_override_replaces_them(kind):
    loss, params, x = MODELS[kind]()
    full = remat.apply(loss, "full", override=True)
    assert_tree_allclose(step(full)(params, x), step(loss)(params, x))
    # `full` saves only the carries: below the program's h1-saving checkpoint
    assert peak(full, params, x) < peak(loss, params, x)
    jaxpr = jax.make_jaxpr(full)(params, x).jaxpr
    assert [s.policy for s in checkpoint_sites(jaxpr)] == ["nothing_saveable"]  # remat's own


def test_measure_warns_with_both_figures_when_worse_than_as_written():
    loss, params, x = linen_model()
    written = peak(loss, params, x) / 2**20
    with pytest.warns(remat.RematWarning, match="raises the compiled peak") as record:
        m = remat.measure(loss, params, x, strategy="dots", override=True, repeats=0)
    assert m.peak_bytes / 2**20 > written
    (message,) = [str(w.message) for w in record if "raises the compiled peak" in str(w.message)]
    assert f"{written:.2f} MiB as written" in message
    assert f"to {m.peak_bytes / 2**20:.2f} MiB" in message
    assert "save_only_these_names('h1')" in message


def test_compare_warns_per_worse_strategy_and_not_for_better_ones():
    loss, params, x = plain_model()
    with pytest.warns(remat.RematWarning) as record:
        report = remat.compare(
            loss, params, x, strategies=["dots", "full"], override=True, repeats=0,
            progress=False,
        )  # fmt: skip
    peaks = {label: m.peak_bytes for label, m in report.rows}
    worse = [str(w.message) for w in record if "raises the compiled peak" in str(w.message)]
    expected = [s for s in ("dots", "full") if peaks[s] > peaks["none"]]
    assert len(worse) == len(expected)
    for label, message in zip(expected, worse, strict=True):
        assert f"strategy '{label}'" in message


def test_a_scan_inside_a_checkpoint_is_left_as_written():
    _, ws, x = plain_model()

    def outer(ws, x):
        run = jax.checkpoint(lambda ws, x: jax.lax.scan(plain_layer, x, ws)[0])
        return jnp.sum(run(ws, x) ** 2)

    with pytest.warns(remat.RematWarning, match="scan 0"):
        kept = remat.apply(outer, "full")
        assert peak(kept, ws, x) == peak(outer, ws, x)


def test_apply_rejects_a_non_bool_override():
    with pytest.raises(TypeError, match="override=1"):
        remat.apply(lambda x: x, "full", override=1)


def without_checkpoints(kind):
    """The model of ``kind``'s plain-JAX twin written without its checkpoint."""
    _, ws, x = plain_model()

    def loss(ws, x):
        return jnp.sum(jax.lax.scan(plain_layer, x, ws)[0] ** 2)

    return loss, ws, x


@pytest.mark.parametrize("kind", MODELS)
def test_override_with_none_removes_them(kind):
    loss, params, x = MODELS[kind]()
    plain = remat.apply(loss, "none", override=True)  # the program without its checkpoints
    assert_tree_allclose(step(plain)(params, x), step(loss)(params, x))
    assert checkpoint_sites(jax.make_jaxpr(plain)(params, x).jaxpr) == ()
    assert peak(plain, params, x) > peak(loss, params, x)  # h2 is kept at every step again
    if kind == "plain":  # the same compiled step as the model written without it
        twin, ws, x = without_checkpoints(kind)
        assert peak(plain, params, x) == peak(twin, ws, x)
    assert remat.apply(loss, "none") is loss  # kept: nothing to rewrite


def test_saves_nothing_compares_with_the_program_without_any_checkpoint():
    # A strategy on a program that checkpoints already: the user's scan is kept as written
    # and a second, small scan is checkpointed (more FLOPs, about the same peak). The twin
    # "without checkpoints" is the program without the user's checkpoint too, whose peak is
    # far higher, so the checkpoints do save memory: no "save no memory" warning.
    loss, ws, x = plain_model()

    def two(ws, x):
        tail = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x[:2, :], ws["w1"][..., :D])
        return loss(ws, x) + jnp.sum(tail[0])

    twin, _, _ = without_checkpoints("plain")
    assert peak(twin, ws, x) > 1.05 * peak(two, ws, x)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        m = remat.measure(two, ws, x, strategy="full", repeats=0)
    messages = [str(w.message) for w in record]
    assert m.scans_as_written == 1 and m.scans_applied == 1
    assert not [w for w in messages if "save no memory" in w], messages
