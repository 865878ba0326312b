"""Typed PRNG keys through a schedule's own loop, as their raw key data.

`remat.Binomial`'s backward pass keeps carries in buffers (``jnp.zeros``, ``.at[].set``,
``jnp.where``) that typed keys (`jax.random.key`, dtype ``key<fry>``) do not support. Keys are
values like any other: a step re-run from a stored carry gets the same key and draws the same
dropout mask. So the loop runs on their key data (`jax.random.key_data`, ``uint32``), and the
body sees typed keys again (`jax.random.wrap_key_data` with the key's own implementation).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat._scan._keys import with_raw_keys
  >>> def run(f, init, xs):
  ...     return jax.lax.scan(f, init, xs)
  >>> f = lambda k, x: (jax.random.split(k)[0], jax.random.uniform(k) * x)
  >>> c, ys = with_raw_keys(run, f, jax.random.key(0), jnp.ones(3))
  >>> c.dtype == jax.random.key(0).dtype, ys.shape
  (True, (3,))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .._core._dtypes import is_key


def _unwrap(tree: Any) -> tuple[Any, list[Any]]:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    impls = [jax.random.key_impl(a) if is_key(a.dtype) else None for a in leaves]
    raw = [jax.random.key_data(a) if i else a for a, i in zip(leaves, impls, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, raw), impls


def _wrap(tree: Any, impls: list[Any]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    typed = [
        jax.random.wrap_key_data(a, impl=i) if i else a for a, i in zip(leaves, impls, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, typed)


def _has_keys(tree: Any) -> bool:
    return any(
        getattr(a, "dtype", None) is not None and is_key(a.dtype)
        for a in jax.tree_util.tree_leaves(tree)
    )


def with_raw_keys(run: Callable[..., Any], f: Callable[..., Any], init: Any, xs: Any) -> Any:
    """``run(f, init, xs) -> (carry, ys)`` with typed keys held as key data inside ``run``."""
    if not _has_keys((init, xs)):
        shape = jax.eval_shape(f, init, jax.tree_util.tree_map(lambda a: a[0], xs))
        if not _has_keys(shape):
            return run(f, init, xs)
    init_raw, c_impls = _unwrap(init)
    xs_raw, x_impls = _unwrap(xs)
    y_impls: list[Any] = []

    def raw_f(c, x):
        c, y = f(_wrap(c, c_impls), _wrap(x, x_impls))
        y, impls = _unwrap(y)
        y_impls[:] = impls
        return _unwrap(c)[0], y

    carry, ys = run(raw_f, init_raw, xs_raw)
    return _wrap(carry, c_impls), _wrap(ys, y_impls)
