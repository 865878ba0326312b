"""Shared test helpers: `tree_allclose` with tolerances that follow the dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", False)

# (rtol, atol) per dtype: loose enough for reassociation, tight enough to catch a wrong gradient.
_TOLERANCES = {
    jnp.dtype(jnp.float64): (1e-10, 1e-12),
    jnp.dtype(jnp.float32): (1e-5, 1e-6),
    jnp.dtype(jnp.bfloat16): (2e-2, 2e-2),
    jnp.dtype(jnp.float16): (2e-3, 2e-3),
}


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing two computations in ``dtype``."""
    return _TOLERANCES.get(jnp.dtype(dtype), (1e-5, 1e-6))


def tree_allclose(a, b, *, scale: float = 1.0) -> bool:
    """True when two pytrees have the same structure, shapes, dtypes and close values.

    ``scale`` multiplies the dtype's tolerance (for long reductions).
    """
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        rtol, atol = tolerance(x.dtype)
        if not np.allclose(
            np.asarray(x, np.float64),
            np.asarray(y, np.float64),
            rtol=rtol * scale,
            atol=atol * scale,
        ):
            return False
    return True


def assert_tree_allclose(a, b, *, scale: float = 1.0) -> None:
    """Asserts `tree_allclose`, with the largest difference in the message."""
    if tree_allclose(a, b, scale=scale):
        return
    diffs = jax.tree_util.tree_map(
        lambda x, y: (
            float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))))
            if jnp.shape(x) == jnp.shape(y)
            else f"shape {jnp.shape(x)} != {jnp.shape(y)}"
        ),
        a,
        b,
    )
    raise AssertionError(f"trees differ; max abs difference per leaf: {diffs}")


def nnx_stack(layers: int, width: int):
    """A stack of ``layers`` `nnx.Linear` + sin blocks run by `nnx.scan`.

    Returns ``(loss, state)``: ``loss(state, x)`` merges the stacked blocks and scans ``x``
    (``(batch, width)``) through them, summing the squares of the output.
    """
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(width, width, rngs=rngs)

        def __call__(self, h):
            return jnp.sin(self.linear(h))

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return Block(nnx.Rngs(key))

    graphdef, state = nnx.split(make(jax.random.split(jax.random.key(0), layers)))

    def loss(state, x):
        blocks = nnx.merge(graphdef, state)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            return block(h)

        return jnp.sum(run(x, blocks) ** 2)

    return loss, state
