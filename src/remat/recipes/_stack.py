"""The scanned-stack recipe: a checkpointed layer as the body of `lax.scan`.

A stack of ``L`` identical layers run by `lax.scan` keeps, for the backward pass, what each
step's body needs: here the step's input and the ReLU's mask. Wrapping the *body* with
`jax.checkpoint` keeps only the step's input (the scan's carry) and recomputes the rest in
the backward scan, so the per-layer residuals shrink to one carry per step. Because the
checkpoint sits inside a loop, this saving is realised by XLA on every backend, CPU included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from ._checks import as_array, floating

_WHERE = "grad_checkpointed_stack"
_NOT_SQUARE = (
    "`remat.recipes.grad_checkpointed_stack` expects `weights` of shape (L, d, d), square "
    "layers so that the carry keeps its shape; got shape {shape}."
)
_NO_LAYERS = (
    "`remat.recipes.grad_checkpointed_stack` expects at least one layer, got `weights` of "
    "shape {shape} (L = 0). Stack L >= 1 matrices of shape (d, d)."
)
_D_MISMATCH = (
    "`remat.recipes.grad_checkpointed_stack` got `weights` of shape {w_shape} (d = {d}) and "
    "`x` of shape {x_shape} (d = {x_d}); `x` must be (batch, d) with the layers' d. "
    "Transpose or reshape one of them."
)


def layer(y: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
    """One step of the stack: ``(relu(y @ w), None)``, as a `lax.scan` body."""
    return jax.nn.relu(y @ w), None


checkpointed_layer = jax.checkpoint(layer)


def stack_loss(weights: jax.Array, x: jax.Array) -> jax.Array:
    """``sum(y_final ** 2)`` after scanning the checkpointed layer over ``weights``."""
    y_final, _ = lax.scan(checkpointed_layer, x, weights)
    return jnp.sum(y_final**2)


# Compiled once per shape and dtype; the validation above it runs eagerly on every call.
_grad_stack_loss = jax.jit(jax.grad(stack_loss, argnums=0))


def grad_checkpointed_stack(weights: ArrayLike, x: ArrayLike) -> jax.Array:
    """The gradient, with respect to the weights, of a checkpointed scanned stack.

    Scans ``layer(y, w) = (relu(y @ w), None)``, wrapped with `jax.checkpoint`, over the
    ``L`` matrices of ``weights`` starting from ``x``, and differentiates
    ``loss = sum(y_final ** 2)``. The result equals the un-checkpointed gradient; the backward
    pass recomputes each layer from its saved input instead of keeping its activations.

    Args:
      weights: the layers, shape ``(L, d, d)`` with ``L >= 1``, a floating dtype.
      x: the input batch, shape ``(batch, d)``.

    Returns:
      ``jax.grad(loss, argnums=0)(weights, x)``, of the same shape as ``weights``.

    Raises:
      ValueError: if ``weights`` is not 3-D, has no layers or non-square layers, ``x`` is not
        2-D, or their ``d`` differ.
      TypeError: if ``weights`` does not have a floating dtype.

    Example:
      Three identity layers and a batch of ones: ``y_final = x``, so each layer's gradient is
      ``x.T @ (2 * y_final)``, a matrix of twos.

      >>> import jax.numpy as jnp
      >>> from remat.recipes import grad_checkpointed_stack
      >>> grad_checkpointed_stack(jnp.stack([jnp.eye(2)] * 3), jnp.ones((1, 2)))[0]
      Array([[2., 2.],
             [2., 2.]], dtype=float32)
    """
    weights = as_array(
        weights,
        3,
        "weights",
        _WHERE,
        "3-D of shape (L, d, d)",
        "Stack the layers' (d, d) matrices along a leading axis, e.g. `jnp.stack(ws)`.",
    )
    x = as_array(
        x,
        2,
        "x",
        _WHERE,
        "2-D of shape (batch, d)",
        "For a single example, use `x[None, :]`.",
    )
    floating(weights, "weights", _WHERE)
    if weights.shape[1] != weights.shape[2]:
        raise ValueError(_NOT_SQUARE.format(shape=weights.shape))
    if weights.shape[0] == 0:
        raise ValueError(_NO_LAYERS.format(shape=weights.shape))
    if x.shape[1] != weights.shape[1]:
        raise ValueError(
            _D_MISMATCH.format(
                w_shape=weights.shape, d=weights.shape[1], x_shape=x.shape, x_d=x.shape[1]
            )
        )
    return _grad_stack_loss(weights, x)
