"""Dtypes of argument leaves, PRNG keys included: their size in bytes and whether they are
differentiated.

A typed key (`jax.random.key`) has an extended dtype such as ``key<fry>`` that NumPy cannot
interpret; its bytes are those of its key data (two uint32 words for threefry). A raw key
(`jax.random.PRNGKey`) is a uint32 array. Neither is differentiated: gradients are taken with
respect to floating-point leaves only, as `jax.grad(..., allow_int=True)` does.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat._core._dtypes import itemsize, is_float, is_key
  >>> key = jax.random.key(0)
  >>> itemsize(key.dtype), is_key(key.dtype), is_float(key.dtype), is_float(jnp.bfloat16)
  (8, True, False, True)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def dtype_of(leaf: Any) -> Any:
    """The dtype of an array, `jax.ShapeDtypeStruct` or Python scalar leaf."""
    dtype = getattr(leaf, "dtype", None)
    return dtype if dtype is not None else jnp.result_type(leaf)


def is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a typed PRNG key dtype (``key<fry>``, ...)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def is_float(dtype: Any) -> bool:
    """Whether values of ``dtype`` are differentiated: floating point or complex."""
    return not is_key(dtype) and jnp.issubdtype(dtype, jnp.inexact)


def itemsize(dtype: Any) -> int:
    """Bytes per element; 0 for ``float0`` and other dtypes without storage."""
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:  # extended dtypes: keys report the size of their key data
        return int(getattr(dtype, "itemsize", 0) or 0)
