"""The code around a scan run as segments (`remat._trace._ends`): the head that makes its
initial carry recomputed, the tail checkpointed; gradients equal, residuals read."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.ad_checkpoint import saved_residuals

import remat
from conftest import assert_tree_allclose
from remat._trace._ends import head_eqns
from remat._trace._tag import ScanChoice, rewrite

B, S, D, V, L = 2, 8, 16, 32, 4


def _loss(params, tokens):
    x = params["embed"][tokens[:, :-1]] + params["pos"]  # the head: a gather and an add

    def layer(h, w):
        w1, w2 = w
        return h + jnp.tanh(h @ w1) @ w2, None

    x, _ = jax.lax.scan(layer, x, (params["w1"], params["w2"]))
    mu = x.mean(-1, keepdims=True)  # the tail: a norm, tied logits, cross-entropy
    x = (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6)
    logp = jax.nn.log_softmax(x @ params["embed"].T, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


@pytest.fixture(scope="module")
def program():
    ks = jax.random.split(jax.random.key(0), 5)
    params = {
        "embed": jax.random.normal(ks[0], (V, D)),
        "pos": jax.random.normal(ks[1], (S, D)) / 4,
        "w1": jax.random.normal(ks[2], (L, D, 2 * D)) / 4,
        "w2": jax.random.normal(ks[3], (L, 2 * D, D)) / 6,
    }
    tokens = jax.random.randint(ks[4], (B, S + 1), 0, V)
    return params, tokens


def _outside(fn, params, tokens):
    """(shape, where) of each residual that is not an argument and not stacked by a scan."""
    return [(a.shape, w) for a, w in saved_residuals(fn, params, tokens)
            if "argument" not in w and a.shape[:1] != (L,) and a.shape[:1] != (L - 1,)]  # fmt: skip


def test_segments_recompute_the_head_and_checkpoint_the_tail(program):
    """Every layer saving its matmul output: the uniform plan keeps the head's output (the
    first layer's input) and the tail's norm and softmax values; as segments the head is
    recomputed (its output and the gather's indices are not kept) and the tail keeps its
    logits and its input, at the same matmul FLOPs; the gradients equal the program's."""
    params, tokens = program
    keep = ("remat_s0_e0",)
    uniform = rewrite(_loss, {0: ScanChoice(names=keep)})
    segments = rewrite(_loss, {0: ScanChoice(names=keep, pattern=(keep,) * L)})
    grads = jax.jit(jax.grad(segments))(params, tokens)  # one compile each, not op by op
    assert_tree_allclose(grads, jax.jit(jax.grad(_loss))(params, tokens))
    one = B * S * D * 4  # a (B, S, D) float32 value
    before = _outside(uniform, params, tokens)
    after = _outside(segments, params, tokens)
    assert (B, S, V) in [s for s, _ in before]  # the softmax's exp (or the logits)
    assert sum(1 for s, _ in before if s == (B, S, D)) >= 3  # the head's output, the norm's
    # After: the logits (a matmul output) and the scan's output (the tail's input).
    assert sorted(s for s, _ in after) == [(B, S, D), (B, S, V)], after
    m_uniform = remat.measure(uniform, params, tokens, repeats=0)
    m_segments = remat.measure(segments, params, tokens, repeats=0)
    assert m_segments.flops == m_uniform.flops  # elementwise work only is recomputed
    saved = sum(r.total_bytes for r in m_segments.residuals if r.primitive != "argument")
    saved0 = sum(r.total_bytes for r in m_uniform.residuals if r.primitive != "argument")
    assert saved0 - saved >= 3 * one, (saved0, saved)


def test_the_head_is_the_cheap_code_that_only_makes_the_carry():
    """A matmul before the scan, what reads it, or a value also used after the scan is not
    recomputed: only code from the arguments to the carry alone."""

    def f(w, ws, x):
        h = jnp.tanh(x @ w)  # a matmul, and what reads it: kept
        g = x * 2.0  # only the carry, from an argument: the head
        k = jnp.sin(x)  # also used after the scan
        (out, _), _ = jax.lax.scan(lambda c, v: ((c[0] @ v + k, c[1]), None), (g, h), ws)
        return (out * k).sum()

    closed = jax.make_jaxpr(f)(jnp.ones((4, 4)), jnp.ones((3, 4, 4)), jnp.ones((2, 4)))
    eqns = closed.jaxpr.eqns
    s = next(j for j, e in enumerate(eqns) if e.primitive.name == "scan")
    head = head_eqns(closed.jaxpr, s)
    names = sorted(eqns[j].primitive.name for j in head)
    assert names == ["mul"], [eqns[j].primitive.name for j in range(s)]


def test_a_tail_with_a_loop_is_left_as_written(program):
    """Checkpointing code that holds a loop would run that loop's forward pass again."""
    params, tokens = program

    def loss(params, tokens):
        x = params["embed"][tokens[:, :-1]]
        x, _ = jax.lax.scan(lambda h, w: (h + jnp.tanh(h @ w), None), x, params["w1"][..., :D])
        x, _ = jax.lax.scan(lambda h, w: (jnp.sin(h) * w, None), x, jnp.ones((3, D)))
        return jnp.mean(x**2)

    keep = ("remat_s0_e0",)
    segments = rewrite(loss, {0: ScanChoice(names=keep, pattern=(keep,) * L)})
    grads = jax.jit(jax.grad(segments))(params, tokens)  # one compile each, not op by op
    assert_tree_allclose(grads, jax.jit(jax.grad(loss))(params, tokens))
    plain = rewrite(loss, {0: ScanChoice(names=keep)})
    flops = remat.measure(segments, params, tokens, repeats=0).flops
    assert flops == remat.measure(plain, params, tokens, repeats=0).flops
