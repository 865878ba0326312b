"""A scan whose layer computes in complex numbers (a diagonal linear recurrence, as in LRU
and S4 layers): the strategies and plans that save values recompute its complex ones, which
`jax.checkpoint` cannot save, and give the plain gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

import remat
from remat._core._complex import RealSaves


def layer(h, p):
    w, lam = p
    z = h.astype(jnp.complex64) @ (w + 1j * w)  # a complex matmul
    z = z * jnp.exp(-jnp.abs(lam) + 1j * lam)
    return h + jnp.tanh(jnp.real(z) @ w), None


def loss(params, x):
    h, _ = jax.lax.scan(layer, x, params)
    return jnp.mean(h**2)


PARAMS = (jnp.full((4, 32, 32), 0.05), jnp.linspace(0.1, 1.0, 4 * 32).reshape(4, 32))
X = jnp.ones((64, 32))


@pytest.mark.parametrize("strategy", ["dots", "dots_no_batch", "everything"])
def test_named_strategies_recompute_complex_values(strategy):
    want = jax.grad(loss)(PARAMS, X)
    got = jax.grad(remat.apply(loss, strategy))(PARAMS, X)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)


def test_real_saves_keeps_the_policy_for_real_values():
    def saved(policy):
        f = jax.checkpoint(lambda x: loss(PARAMS, x), policy=policy)
        return [str(a) for a, _ in saved_residuals(f, X)]

    real = saved(RealSaves(jax.checkpoint_policies.everything_saveable))
    assert real and not any("complex" in a for a in real)
    assert any("float32[64,32]" in a for a in real)  # the real matmul's output, saved


def test_a_plan_of_a_complex_layer_fits_and_gives_the_plain_gradients():
    plan = remat.plan(loss, PARAMS, X, budget="70%", verbose=False)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    want = jax.grad(loss)(PARAMS, X)
    got = jax.grad(plan.fn)(PARAMS, X)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
