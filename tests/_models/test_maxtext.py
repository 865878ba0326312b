"""The MaxText-style decoder at the options the scale benchmark uses: grouped-query attention,
bf16 compute on float32 master weights, and its arguments as shapes alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from remat._models._maxtext import decoder_shapes, make_decoder
from remat._plan._result import fingerprint
from remat._trace._jaxpr_walk import subjaxprs

SIZES = dict(layers=2, d_model=32, heads=4, kv_heads=2, mlp_dim=64, seq=8, batch=2, vocab=16,
             dtype=jnp.bfloat16)  # fmt: skip


def test_shapes_are_those_of_the_arrays_and_trace_to_the_same_program():
    loss, args = make_decoder(None, SIZES)
    same, specs = decoder_shapes(None, SIZES)
    spec = lambda a: (a.shape, a.dtype)  # noqa: E731
    assert jax.tree.map(spec, args) == jax.tree.map(spec, specs)
    assert fingerprint(loss, *args) == fingerprint(same, *specs)
    # GQA: 2 key/value heads of 8 dims for 4 query heads; weights stay float32.
    layer = args[0]["layers"]
    assert layer["key"]["kernel"].shape == (2, 32, 2, 8)
    assert layer["query"]["kernel"].shape == (2, 32, 4, 8)
    assert {leaf.dtype for leaf in jax.tree.leaves(args[0])} == {jnp.dtype(jnp.float32)}


def test_bf16_compute_gives_a_float32_loss_and_float32_gradients():
    loss, (params, tokens) = make_decoder(None, SIZES)
    jaxpr = jax.make_jaxpr(loss)(params, tokens)
    assert "bf16" in str(jaxpr)  # the layers compute in bfloat16
    value, grads = jax.jit(jax.value_and_grad(loss))(params, tokens)
    assert value.dtype == jnp.float32 and bool(jnp.isfinite(value))
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_activation_sharding_constrains_the_layers():
    """``activations=``: the embedding, each layer's input and output (inside the scan) and
    the logits are constrained to that sharding, as MaxText's logical axis rules shard the
    batch; without it the jaxpr has no constraint."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def constraints(jaxpr):
        count = 0
        for eqn in jaxpr.eqns:
            count += eqn.primitive.name == "sharding_constraint"
            for _, _, sub in subjaxprs(eqn):
                count += constraints(sub)
        return count

    for activations, want in ((None, 0), (sharding, 4)):
        loss, (params, tokens) = decoder_shapes(None, {**SIZES, "activations": activations})
        assert constraints(jax.make_jaxpr(loss)(params, tokens).jaxpr) == want
