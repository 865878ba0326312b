"""A plan is never worse than a named strategy: on a program with two stacks (an unrolled
encoder and decoder with cross-attention and dropout), at the budget where ``full`` on both
just fits, the plan fits with no more FLOPs; below it, `InfeasibleBudget` names the smallest
point measured and its strategy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose
from remat._core._budget import read_budget
from remat._plan import _rounds
from remat._plan._calibrate import prepare
from remat._plan._memo import Knowledge
from remat._plan._named import COMPILES
from remat._plan._rounds import plan_prepared
from remat._trace._roll_rewrite import roll_unscanned

# Two full plans of the program (the first with the named candidates off, to show the
# model's own failure), about 150 s of CPU: behind the `slow` marker.
pytestmark = pytest.mark.slow

# (layers, d_model, heads, batch, source length, target length)
SIZES = (4, 32, 4, 2, 32, 24)


def encoder_decoder(layers, d, heads, batch, src, tgt, vocab=64, rate=0.1):
    """Post-norm encoder and decoder layers in Python loops (two stacks when rolled), the
    decoder with causal self-attention and cross-attention; dropout on the encoder's and the
    cross-attention's probabilities and on residual branches."""
    keys = iter(jax.random.split(jax.random.key(0), 128))

    def dense(i, o):
        return jax.random.normal(next(keys), (i, o)) * i**-0.5

    def attention():
        return {n: dense(d, d) for n in "qkvo"}

    def mlp():
        return {"w1": dense(d, 4 * d), "w2": dense(4 * d, d)}

    params = {
        "embed": dense(vocab, d),
        "encoder": [{"attn": attention(), "mlp": mlp()} for _ in range(layers)],
        "decoder": [
            {"self": attention(), "cross": attention(), "mlp": mlp()} for _ in range(layers)
        ],
    }

    def norm(x):
        x = x - x.mean(-1, keepdims=True)
        return x * jax.lax.rsqrt((x**2).mean(-1, keepdims=True) + 1e-5)

    def drop(key, x):
        return jnp.where(jax.random.bernoulli(key, 1 - rate, x.shape), x / (1 - rate), 0)

    def mha(p, x, kv, key=None, causal=False):
        (b, s, _), t = x.shape, kv.shape[1]
        q = (x @ p["q"]).reshape(b, s, heads, -1)
        k = (kv @ p["k"]).reshape(b, t, heads, -1)
        v = (kv @ p["v"]).reshape(b, t, heads, -1)
        w = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(q.shape[-1])
        if causal:
            w = jnp.where(jnp.tril(jnp.ones((s, t), bool)), w, -1e9)
        probs = jax.nn.softmax(w, -1)
        probs = probs if key is None else drop(key, probs)
        return jnp.einsum("bhst,bthd->bshd", probs, v).reshape(b, s, -1) @ p["o"]

    def ff(p, x):
        return jax.nn.gelu(x @ p["w1"]) @ p["w2"]

    def loss(params, src_ids, tgt_ids, key):
        keys = jax.random.split(key, 2 * layers)
        h = params["embed"][src_ids]
        for p, k in zip(params["encoder"], keys[:layers], strict=True):
            h = norm(
                h + drop(jax.random.fold_in(k, 0), mha(p["attn"], h, h, jax.random.fold_in(k, 1)))
            )
            h = norm(h + ff(p["mlp"], h))
        y = params["embed"][tgt_ids]
        for p, k in zip(params["decoder"], keys[layers:], strict=True):
            y = norm(y + drop(jax.random.fold_in(k, 0), mha(p["self"], y, y, causal=True)))
            y = norm(y + mha(p["cross"], y, h, jax.random.fold_in(k, 2)))
            y = norm(y + drop(jax.random.fold_in(k, 3), ff(p["mlp"], y)))
        return -jnp.mean(jax.nn.log_softmax(y @ params["embed"].T)[..., 0])

    k1, k2 = jax.random.split(next(keys))
    src_ids = jax.random.randint(k1, (batch, src), 0, vocab)
    tgt_ids = jax.random.randint(k2, (batch, tgt), 0, vocab)
    return loss, (params, src_ids, tgt_ids, jax.random.key(1))


@pytest.fixture(scope="module")
def two_stacks():
    """The rolled program's preparation and what the planner learns about it, shared by the
    tests (as `remat.plan` shares it between the budgets of one unrolled program)."""
    loss, args = encoder_decoder(*SIZES)
    rolled = roll_unscanned(loss)
    assert len(remat.list_scans(rolled, *args)) == 2  # the encoder's and the decoder's
    full = remat.measure(loss, *args, strategy="full", repeats=0)
    know = Knowledge(prepare(rolled, args, 0, True))
    return loss, args, full, know


def test_at_the_budget_where_full_just_fits(two_stacks, monkeypatch):
    loss, args, full, know = two_stacks
    budget = read_budget(full.peak_bytes)
    with monkeypatch.context() as m:  # the model's own candidates only: over the budget
        m.setattr(_rounds, "named_wanted", lambda *a: False)
        with pytest.raises(remat.InfeasibleBudget) as info:
            plan_prepared(know.prepared, budget, knowledge=know)
    assert info.value.smallest_peak_bytes > full.peak_bytes
    p = plan_prepared(know.prepared, budget, knowledge=know)
    assert p.measured_peak_bytes <= full.peak_bytes
    assert p.measured.flops <= full.flops
    assert p.stats.step_compiles <= 1 + COMPILES  # a round, and the named candidates
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args), scale=10)


def test_infeasible_names_the_smallest_point_measured_and_its_strategy(two_stacks):
    *_, full, know = two_stacks
    base = know.prepared.baseline
    floor = base.argument_bytes + base.output_bytes - base.alias_bytes
    # above the step's own arguments and outputs (below them nothing is compiled), far below
    # `full`'s peak: every candidate is measured over it
    budget = floor + (full.peak_bytes - floor) // 8
    with pytest.raises(remat.InfeasibleBudget) as info:
        plan_prepared(know.prepared, read_budget(budget), knowledge=know)
    err = info.value
    assert err.smallest_peak_bytes <= full.peak_bytes  # never worse than a named strategy
    assert err.strategy is not None and f"measured with {err.strategy}" in str(err)
