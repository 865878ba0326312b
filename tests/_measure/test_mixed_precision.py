"""Mixed precision: bf16 and fp16 parameters and activations, and float32 master weights with
bf16 compute, through `remat.apply`, `remat.measure` and `remat.plan`. Gradients keep their
dtype; bytes are counted by dtype; tolerances follow the dtype (`conftest.tolerance`)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose

L, B, D = 4, 16, 32


def loss(ws, x):
    """Computes in the dtype of ``x`` whatever the dtype of the weights (master weights)."""

    def layer(h, w):
        return jnp.tanh(h @ w.astype(h.dtype)), None

    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.mean(h.astype(jnp.float32) ** 2)


PRECISIONS = {
    "bf16": (jnp.bfloat16, jnp.bfloat16),
    "fp16": (jnp.float16, jnp.float16),
    "f32-master-bf16-compute": (jnp.float32, jnp.bfloat16),
}


def args(param_dtype, act_dtype):
    kw, kx = jax.random.split(jax.random.key(0))
    ws = (jax.random.normal(kw, (L, D, D)) / D**0.5).astype(param_dtype)
    return ws, jax.random.normal(kx, (B, D)).astype(act_dtype)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_values_and_gradients_keep_their_dtype(precision):
    ws, x = args(*PRECISIONS[precision])
    want = jax.value_and_grad(loss, argnums=(0, 1))(ws, x)
    for strategy in ("full", remat.Strategy(schedule=remat.Binomial(2))):
        got = jax.value_and_grad(remat.apply(loss, strategy), argnums=(0, 1))(ws, x)
        assert got[1][0].dtype == ws.dtype and got[1][1].dtype == x.dtype
        assert_tree_allclose(got, want)


def test_bytes_are_counted_by_dtype():
    f32 = remat.measure(loss, *args(jnp.float32, jnp.float32), strategy="full", repeats=0)
    bf16 = remat.measure(loss, *args(jnp.bfloat16, jnp.bfloat16), strategy="full", repeats=0)
    carried = [r for r in bf16.residuals if r.multiplicity == L]
    assert carried and all(r.dtype == "bfloat16" for r in carried)
    assert all(r.total_bytes == 2 * B * D * L for r in carried)
    carried32 = [r for r in f32.residuals if r.multiplicity == L]
    assert 2 * sum(r.total_bytes for r in carried) == sum(r.total_bytes for r in carried32)
    # (the compiled peaks are not compared: the CPU backend computes bf16 matmuls in f32)


def test_plan_in_bf16():
    ws, x = args(jnp.float32, jnp.bfloat16)
    ws, x = jnp.tile(ws, (2, 1, 1)), jnp.tile(x, (4, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        plan = remat.plan(loss, ws, x, budget=0.8, argnums=(0, 1), schedules=False)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    itemsize = {"bfloat16": 2, "float32": 4}
    for saved in (v for s in plan.scans for v in s.saved):  # bytes by dtype
        count = 1
        for d in saved.shape:
            count *= d
        assert saved.bytes == count * itemsize[saved.dtype]
    got = jax.grad(plan.fn, argnums=(0, 1))(ws, x)
    assert got[1].dtype == jnp.bfloat16
    assert_tree_allclose(got, jax.grad(loss, argnums=(0, 1))(ws, x))


def low_loss(ws, x):
    """`loss` with a loss of the compute dtype: a bf16 or fp16 scalar, as `jax.grad` takes."""

    def layer(h, w):
        return jnp.tanh(h @ w.astype(h.dtype)), None

    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.mean(h**2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_scalar_losses_are_taken_wherever_jax_grad_takes_them(dtype):
    ws, x = args(jnp.float32, dtype)
    assert jax.eval_shape(low_loss, ws, x).dtype == dtype
    want = jax.grad(low_loss)(ws, x)
    report = remat.compare(low_loss, ws, x, strategies=["full"], repeats=1, progress=False)
    assert report.labels == ("none", "full") and report["full"].seconds is not None
    assert_tree_allclose(jax.grad(remat.apply(low_loss, "full"))(ws, x), want)
    assert [f.code for f in remat.lint(low_loss, ws, x)] == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        plan = remat.plan(low_loss, ws, x, budget=0.8, schedules=False, verbose=False)
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert_tree_allclose(jax.grad(plan.fn)(ws, x), want)


def test_an_integer_or_complex_loss_is_still_refused():
    ws, x = args(jnp.float32, jnp.float32)
    for cast in (jnp.int32, jnp.complex64):
        with pytest.raises(ValueError, match=r"`remat.measure` needs a scalar-valued.*"):
            remat.measure(lambda ws, x, c=cast: loss(ws, x).astype(c), ws, x, repeats=0)
