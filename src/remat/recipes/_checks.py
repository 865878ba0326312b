"""Eager input validation shared by the recipes: integers, ranks and shapes.

Every error names the public recipe (``remat.recipes.<name>``) in backticks, says what it got,
and what it expected, so that a bad call fails before JAX or Flax is reached.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

_NOT_AN_INTEGER = (
    "`remat.recipes.{where}` expects `{name}` to be an integer, got {got!r} of type "
    "{kind}. Pass a Python int (an integral float such as 3.0 is accepted too)."
)
_NOT_INTEGRAL = (
    "`remat.recipes.{where}` expects `{name}` to be integral, got {got!r}, which has a "
    "fractional part. Pass a whole number such as {rounded}."
)
_TOO_SMALL = "`remat.recipes.{where}` expects `{name}` >= {least}, got {got}. {fix}"
_BAD_RANK = (
    "`remat.recipes.{where}` expects `{name}` to be {want}, got an array of shape {shape} "
    "({ndim}-D). {fix}"
)
_NOT_FLOATING = (
    "`remat.recipes.{where}` differentiates with respect to `{name}`, so it must have a "
    "floating dtype; got {dtype}. Cast it first, e.g. `{name}.astype(jnp.float32)`."
)


def as_int(value: object, name: str, where: str) -> int:
    """``value`` as an int; integral floats are accepted, booleans and fractions are not."""
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise TypeError(
            _NOT_AN_INTEGER.format(where=where, name=name, got=value, kind=type(value).__name__)
        )
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        pass
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            _NOT_AN_INTEGER.format(where=where, name=name, got=value, kind=type(value).__name__)
        ) from None
    if not number.is_integer():
        raise ValueError(
            _NOT_INTEGRAL.format(where=where, name=name, got=value, rounded=round(number))
        )
    return int(number)


def at_least(value: int, least: int, name: str, where: str, fix: str) -> int:
    """``value`` unchanged, or a `ValueError` when it is below ``least``."""
    if value < least:
        raise ValueError(_TOO_SMALL.format(where=where, name=name, least=least, got=value, fix=fix))
    return value


def as_array(value: object, ndim: int, name: str, where: str, want: str, fix: str) -> jax.Array:
    """``value`` as a `jax.Array` of rank ``ndim`` (``want`` describes it for the message)."""
    array = jnp.asarray(value)
    if array.ndim != ndim:
        raise ValueError(
            _BAD_RANK.format(
                where=where, name=name, want=want, shape=array.shape, ndim=array.ndim, fix=fix
            )
        )
    return array


def floating(array: jax.Array, name: str, where: str) -> jax.Array:
    """``array`` unchanged, or a `TypeError` when it cannot be differentiated."""
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise TypeError(_NOT_FLOATING.format(where=where, name=name, dtype=array.dtype))
    return array
