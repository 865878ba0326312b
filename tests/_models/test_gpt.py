"""The demo GPT: a real causal decoder whose layers reach the program as one scan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._models._gpt import GPT_NAMES, make_gpt

TINY = dict(layers=2, d_model=16, seq=8, batch=2, heads=2, vocab=32)


@pytest.fixture(scope="module")
def tiny():
    return make_gpt(**TINY)


def _scan_eqns(jaxpr):
    """Every scan equation in ``jaxpr``, including those inside sub-jaxprs (jit, ...)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    found += _scan_eqns(sub)
    return found


def test_loss_is_finite_and_near_uniform(tiny):
    loss_fn, (params, tokens) = tiny
    loss = float(loss_fn(params, tokens))
    assert np.isfinite(loss)
    # At initialisation the predictions are close to uniform over the vocabulary.
    assert abs(loss - np.log(TINY["vocab"])) < 1.5


def test_gradient_has_the_shape_of_params_and_layers_are_stacked(tiny):
    loss_fn, (params, tokens) = tiny
    grads = jax.jit(jax.grad(loss_fn))(params, tokens)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    for g, p in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(params), strict=True
    ):
        assert g.shape == p.shape and g.dtype == p.dtype
        assert bool(jnp.all(jnp.isfinite(g)))
    for leaf in jax.tree_util.tree_leaves(params["blocks"]):
        assert leaf.shape[0] == TINY["layers"]
    # every layer's parameters get a gradient
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads["blocks"]))


def test_the_layer_stack_is_exactly_one_scan_with_all_names(tiny):
    loss_fn, (params, tokens) = tiny
    jaxpr = jax.make_jaxpr(loss_fn)(params, tokens).jaxpr
    scans = _scan_eqns(jaxpr)
    assert len(scans) == 1
    assert scans[0].params["length"] == TINY["layers"]
    body = str(scans[0].params["jaxpr"])
    for name in GPT_NAMES:
        assert f"name={name}" in body


def test_attention_is_causal(tiny):
    _, (params, tokens) = tiny
    from remat._models._gpt import GPT

    model = GPT(**{k: TINY[k] for k in ("layers", "d_model", "heads", "vocab", "seq")})
    x = tokens[:, :-1]
    y = x.at[:, -1].set((x[:, -1] + 1) % TINY["vocab"])  # change only the last token
    apply = jax.jit(model.apply)
    lx = apply({"params": params}, x)
    ly = apply({"params": params}, y)
    np.testing.assert_allclose(lx[:, :-1], ly[:, :-1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(lx[:, -1], ly[:, -1])


def test_bad_heads_is_a_value_error():
    with pytest.raises(ValueError, match="make_gpt"):
        make_gpt(d_model=10, heads=3)
