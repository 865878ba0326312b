"""The block recipe: a "compute-intensive block" wrapped with `jax.checkpoint` inside a model.

The block ``x @ w1 + b1 → relu → @ w2 + b2`` is checkpointed as a whole: its output is kept for
the rest of the model, but the hidden activation inside it is not saved for the backward pass;
`jax.grad` recomputes it from the block's inputs.

Note that on the CPU backend XLA undoes a checkpoint that is not inside a loop, so the memory
saving shows on accelerators, or when the block is the body of a scan.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ._checks import floating

_WHERE = "checkpointed_block_grad"
_KEYS = ("w1", "b1", "w2", "b2")
_NOT_A_MAPPING = (
    "`remat.recipes.checkpointed_block_grad` expects `params` to be a dict with keys "
    "'w1', 'b1', 'w2', 'b2'; got {kind}."
)
_BAD_KEYS = (
    "`remat.recipes.checkpointed_block_grad` expects `params` with exactly the keys "
    "'w1', 'b1', 'w2', 'b2'; got keys {got}{missing}{extra}."
)
_BAD_PARAM = (
    "`remat.recipes.checkpointed_block_grad` expects `params[{key!r}]` of shape {want}, got "
    "shape {shape}. The block is `relu(x @ w1 + b1) @ w2 + b2` with w1 (D, H), b1 (H,), "
    "w2 (H, O), b2 (O,)."
)
_BAD_X = (
    "`remat.recipes.checkpointed_block_grad` expects `x` of shape (..., D) with D = "
    "w1.shape[0] = {d}; got shape {shape}."
)


def block(x: jax.Array, params: Mapping[str, jax.Array]) -> jax.Array:
    """``relu(x @ w1 + b1) @ w2 + b2``: the compute-intensive block."""
    x = jnp.dot(x, params["w1"]) + params["b1"]
    x = jax.nn.relu(x)
    x = jnp.dot(x, params["w2"]) + params["b2"]
    return x


checkpointed_block = jax.checkpoint(block)


def model(x: jax.Array, params: Mapping[str, jax.Array]) -> jax.Array:
    """The model around the block: here the checkpointed block alone."""
    return checkpointed_block(x, params)


def _loss(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.sum(model(x, params))


# ``jax.grad(lambda p: jnp.sum(model(x, p)))(params)``, compiled once per shape and dtype.
_grad_loss = jax.jit(jax.grad(_loss))


def _check(params: object, x: ArrayLike) -> tuple[dict[str, jax.Array], jax.Array]:
    if not isinstance(params, Mapping):
        raise TypeError(_NOT_A_MAPPING.format(kind=type(params).__name__))
    missing = [k for k in _KEYS if k not in params]
    extra = sorted(str(k) for k in params if k not in _KEYS)
    if missing or extra:
        raise ValueError(
            _BAD_KEYS.format(
                got=sorted(str(k) for k in params),
                missing=f"; missing {missing}" if missing else "",
                extra=f"; unexpected {extra}" if extra else "",
            )
        )
    p = {k: floating(jnp.asarray(params[k]), f"params[{k!r}]", _WHERE) for k in _KEYS}
    x = jnp.asarray(x)
    w1, b1, w2, b2 = (p[k] for k in _KEYS)
    if w1.ndim != 2:
        raise ValueError(_BAD_PARAM.format(key="w1", want="(D, H)", shape=w1.shape))
    d, h = w1.shape
    if b1.shape != (h,):
        raise ValueError(_BAD_PARAM.format(key="b1", want=f"(H,) = ({h},)", shape=b1.shape))
    if w2.ndim != 2 or w2.shape[0] != h:
        raise ValueError(_BAD_PARAM.format(key="w2", want=f"(H, O) = ({h}, O)", shape=w2.shape))
    o = w2.shape[1]
    if b2.shape != (o,):
        raise ValueError(_BAD_PARAM.format(key="b2", want=f"(O,) = ({o},)", shape=b2.shape))
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(_BAD_X.format(d=d, shape=x.shape))
    return p, x


def checkpointed_block_grad(params: Mapping[str, ArrayLike], x: ArrayLike) -> dict[str, jax.Array]:
    """The gradient of ``sum(model(x, params))`` for a model whose block is checkpointed.

    The block ``relu(x @ w1 + b1) @ w2 + b2`` is wrapped with `jax.checkpoint` inside the
    model, and the result is ``jax.grad(lambda p: jnp.sum(model(x, p)))(params)``: equal to
    the un-checkpointed gradient, with the block's hidden activation recomputed in the
    backward pass instead of saved.

    Args:
      params: a dict with exactly the keys ``'w1'`` ``(D, H)``, ``'b1'`` ``(H,)``, ``'w2'``
        ``(H, O)``, ``'b2'`` ``(O,)``, of floating dtype.
      x: the input, shape ``(..., D)`` (the seed uses ``(batch, D)``).

    Returns:
      A dict with the same keys and shapes as ``params``: the gradient.

    Raises:
      TypeError: if ``params`` is not a mapping, or a parameter is not floating.
      ValueError: if keys are missing or unexpected, or a shape does not fit the block.

    Example:
      Identity weights and ``x = [[1, -1]]``: the hidden unit for ``-1`` is cut by the ReLU,
      so only the first hidden unit gets a gradient.

      >>> import jax.numpy as jnp
      >>> from remat.recipes import checkpointed_block_grad
      >>> params = {"w1": jnp.eye(2), "b1": jnp.zeros(2), "w2": jnp.eye(2), "b2": jnp.zeros(2)}
      >>> g = checkpointed_block_grad(params, jnp.array([[1.0, -1.0]]))
      >>> g["b1"], g["b2"]
      (Array([1., 0.], dtype=float32), Array([1., 1.], dtype=float32))
      >>> g["w2"]
      Array([[1., 1.],
             [0., 0.]], dtype=float32)
    """
    p, x = _check(params, x)
    return _grad_loss(p, x)
