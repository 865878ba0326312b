"""What orders a hand-written backward pass: a layer's recomputation held until its cotangent
arrives, the cotangents of integer inputs, and the `jax.custom_vjp` both forms of a per-layer
scan run as (shared by `remat._trace._periodic` and `remat._trace._one_loop`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core._dtypes import is_float


def after(leaves: list[Any], which: Sequence[bool], ct: Any) -> list[Any]:
    """``leaves``, those marked in ``which`` made to depend on the cotangent ``ct`` (plus zero
    times a bounded scalar of it, which XLA does not fold), so nothing computed from them
    runs before ``ct`` is."""
    floats = [c for c in jax.tree.leaves(ct) if floating(c) and c.size]
    if not floats:
        return leaves
    zero = 0 * jnp.minimum(jnp.abs(floats[0].ravel()[0]), 1)
    return [
        x + zero.astype(x.dtype) if tie and floating(x) else x
        for x, tie in zip(leaves, which, strict=True)
    ]


def tie_one(args: list[Any], ct: Any) -> list[Any]:
    """``args``, the smallest array among them made to depend on the cotangent ``ct`` (plus
    zero times a bounded scalar of it, as `after`), so that what is computed from them runs
    once ``ct`` is here and is not merged with the same computation in the forward pass; one
    is enough, and the smallest costs the least (an embedding lookup's indices, not its
    table)."""
    floats = [c for c in jax.tree.leaves(ct) if floating(c) and c.size]
    sized = [k for k, x in enumerate(args) if hasattr(x, "dtype") and x.dtype != jax.dtypes.float0]
    if not floats or not sized:
        return args
    k = min(sized, key=lambda k: args[k].size)
    zero = 0 * jnp.minimum(jnp.abs(floats[0].ravel()[0]), 1)
    return [x + zero.astype(x.dtype) if j == k else x for j, x in enumerate(args)]


def floating(x: Any) -> bool:
    return hasattr(x, "dtype") and is_float(x.dtype)


def zero_cotangent(x: Any) -> Any:
    """The cotangent of a non-differentiable (integer) input: zeros of JAX's ``float0``."""
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def custom_loop(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    head: Callable[..., Any] | None,
    consts: Sequence[Any],
    init: Sequence[Any],
    xs: Sequence[Any],
) -> tuple[list[Any], list[Any]]:
    """``(carry, ys)`` of ``forward(consts, init, xs, keep=False)``, differentiated by
    ``backward``: a `jax.custom_vjp` whose residuals are ``(consts, init, xs, kept)``, ``init``
    only with a ``head`` (the code before the loop that makes its first carry, recomputed in
    the backward pass), ``kept`` what ``forward(..., keep=True)`` returns beside its output."""

    @jax.custom_vjp
    def run(consts, init, xs):
        return forward(consts, init, xs, keep=False)[0]

    def fwd(consts, init, xs):
        out, kept = forward(consts, init, xs, keep=True)
        return out, (consts, init if head is not None else None, xs, kept)

    run.defvjp(fwd, backward)
    carry, ys = run(list(consts), list(init), list(xs))
    return list(carry), list(ys)


def cotangents(
    consts: Sequence[Any],
    grads: Sequence[Any],
    ct_carry: Sequence[Any],
    head_vjp: Callable[..., Any] | None,
    xs: Sequence[Any],
    xgrads: Sequence[Any],
) -> tuple[list[Any], list[Any], list[Any]]:
    """What the backward pass of `custom_loop` returns: the gradients of ``consts``, of the
    initial carry (through ``head_vjp`` where a head made it) and of ``xs``; a None gradient
    is an integer input's (`zero_cotangent`)."""
    return (
        [zero_cotangent(c) if g is None else g for c, g in zip(consts, grads, strict=True)],
        list(ct_carry) if head_vjp is None else list(head_vjp(list(ct_carry))),
        [zero_cotangent(x) if g is None else g for x, g in zip(xs, xgrads, strict=True)],
    )
