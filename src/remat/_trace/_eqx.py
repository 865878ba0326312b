"""Equinox modules among a function's arguments, split as Equinox's own transforms split them.

An Equinox model is passed whole: ``eqx.filter_value_and_grad(loss)(model, x)``. Its leaves
are arrays (the parameters, differentiated when floating point) and everything else: Python
bools such as `eqx.nn.Dropout`'s ``inference``, floats such as its rate, activation
functions. `jax.value_and_grad` would trace every leaf as an array, and ``if
self.inference:`` fails on a traced bool; ``eqx.filter_*`` transforms trace the array leaves
and keep the rest static. `split_modules` does the same for every entry point that compiles a
gradient step (`remat.measure`, `remat.compare`, `remat.plan`, `remat.lint`): each module
among the arguments becomes a `Split`, a pytree whose leaves are the module's arrays and whose
static part (the module without them) is part of its structure; `combined` rebuilds the
modules before calling the function. Floating-point arrays are differentiated, other arrays
(integer counters, PRNG keys) get ``float0`` gradients, which take no memory, as everywhere
in remat.

A function rewritten for split arguments is given back to the user taking modules
(`taking_modules`), so that ``eqx.filter_grad(plan.fn)(model, x)`` returns the gradients in
the module's own structure, as ``eqx.filter_grad(loss)`` does.

Equinox is optional: nothing here imports it unless it is imported already (no Equinox
module can exist without it).

With Equinox installed (the ``equinox`` extra), for example::

  drop = eqx.nn.Dropout(0.5, inference=True)
  split = split_modules((drop, jnp.ones(3)))   # no array leaf in split[0]: all static
  jax.jit(combined(lambda m, x: m(x).sum()))(*split)   # 3.0
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def is_module(x: Any) -> bool:
    """An Equinox module (False, without importing it, when Equinox is not imported)."""
    if "equinox" not in sys.modules:
        return False
    import equinox as eqx

    return isinstance(x, eqx.Module)


def has_modules(tree: Any) -> bool:
    """Whether ``tree`` holds an Equinox module."""
    if "equinox" not in sys.modules:
        return False
    return any(is_module(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=is_module))


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct)


@dataclasses.dataclass(frozen=True)
class _Path:
    """A `Split` child's key: the leaf's path in its module, so that JAX's messages name
    it as they name a leaf of the module itself (``model.blocks[0].weight``)."""

    path: tuple[Any, ...]

    def __str__(self) -> str:
        return jax.tree_util.keystr(self.path)


@jax.tree_util.register_pytree_with_keys_class
class Split:
    """An Equinox module as its array leaves (the children) and the rest (static: the
    module's structure and its other leaves, by position)."""

    def __init__(self, arrays: tuple[Any, ...], static: tuple[Any, ...]):
        self.arrays, self.static = tuple(arrays), static

    @classmethod
    def of(cls, module: Any) -> Split:
        flat, treedef = jax.tree_util.tree_flatten_with_path(module)
        arrays = tuple(x for _, x in flat if _is_array(x))
        paths = tuple(_Path(p) for p, x in flat if _is_array(x))
        rest = tuple((i, x) for i, (_, x) in enumerate(flat) if not _is_array(x))
        return cls(arrays, (treedef, rest, paths))

    def module(self) -> Any:
        treedef, rest, _ = self.static
        arrays, others = iter(self.arrays), dict(rest)
        leaves = [others[i] if i in others else next(arrays) for i in range(treedef.num_leaves)]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def tree_flatten_with_keys(self):
        return tuple(zip(self.static[2], self.arrays, strict=True)), self.static

    def tree_flatten(self):
        return self.arrays, self.static

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(tuple(children), static)

    def __repr__(self) -> str:
        return f"Split({self.static[0]})"


def _split_one(x: Any) -> Any:
    return Split.of(x) if is_module(x) else x


def _merge_one(x: Any) -> Any:
    return x.module() if isinstance(x, Split) else x


def split_modules(args: Any) -> Any:
    """``args`` (any pytree) with every Equinox module replaced by a `Split`."""
    if not has_modules(args):
        return args
    return jax.tree_util.tree_map(_split_one, args, is_leaf=is_module)


def merge_modules(args: Any) -> Any:
    """``args`` with every `Split` rebuilt into its module."""
    return jax.tree_util.tree_map(_merge_one, args, is_leaf=lambda x: isinstance(x, Split))


class combined:  # used as a function: ``combined(fn)(*split_args)``
    """``fn`` taking `Split` arguments: rebuilds the modules and calls ``fn``. Equal (and
    hashing equal) for the same ``fn``, so caches keyed by the function still hit; named
    as ``fn`` in messages."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = merge_modules((args, kwargs))
        return self.fn(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, combined) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash((combined, self.fn))


def with_modules_split(fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], tuple]:
    """``(fn, args)`` unchanged without Equinox modules; else ``(combined(fn), args split)``."""
    if not has_modules(args):
        return fn, args
    return combined(fn), tuple(split_modules(args))


def taking_modules(split_fn: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``split_fn`` (a function of split arguments, e.g. a rewritten `combined`) taking the
    modules themselves, as ``fn`` does: what the user calls and transforms."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = split_modules((args, kwargs))
        return split_fn(*args, **kwargs)

    return call
