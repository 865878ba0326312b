"""`remat.scan`'s argument checks: `lax.scan`'s own, with remat's advice appended.

`remat.scan` promises to be `jax.lax.scan`; code that catches `lax.scan`'s errors must keep
catching them. So the checks are `lax.scan`'s: the schedules that build their own loops
first trace ``lax.scan`` abstractly (`jax.eval_shape`) on the same arguments, and any
`TypeError`, `ValueError` or `IndexError` it raises is re-raised, same type and message,
with remat's advice (and the schedule) appended to the message.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax import lax

_NO_LENGTH = (
    "`remat.scan` got xs=None and length=None; pass `length=` (the number of steps) when "
    "there are no inputs to scan over."
)
_BAD_LENGTH = "`remat.scan` got length={got!r}; expected a non-negative int."
_LEAF_NO_AXIS = (
    "`remat.scan` got an xs leaf of shape {shape}; every leaf of xs needs a leading axis "
    "to scan over."
)
_MISMATCHED_XS = (
    "`remat.scan` got xs leaves with different leading axis sizes {sizes}; every leaf of xs "
    "must have the same number of steps."
)
_LENGTH_XS = (
    "`remat.scan` got length={length} but xs has {got} steps; drop `length=` or make it match "
    "the leading axis of xs."
)
_BAD_UNROLL = (
    "`remat.scan` got unroll={got!r}; expected a bool or an int >= 0, as `lax.scan` does "
    "(it unrolls within each segment of a `Nested` or `Binomial` schedule)."
)
_NOT_ARRAY_LEAF = (
    "`remat.scan` got a {kind} at {path}; every leaf of init and xs must be an array "
    "(jax.Array, numpy array or Python number). Close over other values in `f` instead."
)
_CONTEXT = "`remat.scan` with schedule={schedule!r} checks its arguments as `lax.scan` does."
_MARK = "`remat.scan`"
_NON_INT_UNROLL = "'{name}' object cannot be interpreted as an integer"
_NEGATIVE_UNROLL = "`unroll` must be a `bool` or a non-negative `int`."


def _advice(xs: Any, length: Any) -> str | None:
    """remat's own sentence for a misuse of ``xs``/``length``, if it recognises one."""
    leaves = jax.tree_util.tree_leaves(xs)
    if not leaves:
        return _NO_LENGTH if length is None else None
    shapes = [np.shape(a) for a in leaves]
    for shape in shapes:
        if not shape:
            return _LEAF_NO_AXIS.format(shape=shape)
    sizes = sorted({s[0] for s in shapes})
    if len(sizes) > 1:
        return _MISMATCHED_XS.format(sizes=sizes)
    if isinstance(length, int | np.integer) and int(length) != sizes[0]:
        return _LENGTH_XS.format(length=length, got=sizes[0])
    return None


def _append(err: BaseException, text: str) -> None:
    message = str(err.args[0]) if err.args else ""
    if _MARK in message:
        return  # an inner `remat.scan` already said it
    err.args = (f"{message}\n\n{text}", *err.args[1:])


@contextlib.contextmanager
def lax_errors(schedule: Any, xs: Any, length: Any) -> Iterator[None]:
    """Appends remat's advice and the schedule to `lax.scan`'s errors raised inside."""
    try:
        yield
    except (TypeError, ValueError, IndexError) as err:
        advice = _advice(xs, length)
        context = _CONTEXT.format(schedule=schedule)
        _append(err, f"{advice}\n{context}" if advice else context)
        raise


def check_leaves(init: Any, xs: Any) -> None:
    """Leaves that are not JAX types: `lax.scan`'s `TypeError`, naming where the leaf is."""
    for name, tree in (("init", init), ("xs", xs)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            try:
                jax.typeof(leaf)
            except TypeError as err:
                where = name + jax.tree_util.keystr(path)
                advice = _NOT_ARRAY_LEAF.format(kind=type(leaf).__name__, path=where)
                raise TypeError(f"{err}\n\n{advice}") from None


def check_unroll(unroll: Any) -> int | bool:
    """Checks ``unroll`` as `lax.scan` does; returns it (a bool or an int >= 0)."""
    if isinstance(unroll, bool | np.bool_):
        return bool(unroll)
    try:
        value = operator.index(unroll)
    except TypeError as err:
        if isinstance(unroll, jax.core.Tracer):
            raise  # lax.scan's own concreteness error comes from `lax_errors` below
        raise TypeError(
            _NON_INT_UNROLL.format(name=type(unroll).__name__)
            + "\n\n"
            + _BAD_UNROLL.format(got=unroll)
        ) from err
    if value < 0:
        raise ValueError(_NEGATIVE_UNROLL + "\n\n" + _BAD_UNROLL.format(got=unroll))
    return value


def check_length(length: Any) -> None:
    """A negative or non-integer length, which `lax.scan` does not reject clearly."""
    if length is None or isinstance(length, jax.core.Tracer):
        return
    if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 0:
        raise ValueError(_BAD_LENGTH.format(got=length))


def checked_by_lax(f, init, xs, length, reverse, unroll, schedule) -> tuple[Any, int]:
    """Traces ``lax.scan`` on these arguments; returns its carry avals and the step count."""
    with lax_errors(schedule, xs, length):
        carry, _ = jax.eval_shape(
            lambda init, xs: lax.scan(f, init, xs, length=length, reverse=reverse, unroll=unroll),
            init,
            xs,
        )
    leaves = jax.tree_util.tree_leaves(xs)
    return carry, int(np.shape(leaves[0])[0] if leaves else length)


def promote_weak(init: Any, carry: Any) -> Any:
    """Weakly typed initial carries take the body's carry type, as in `lax.scan`."""

    def promote(a, out):
        aval = jax.typeof(a)
        if aval.weak_type and (aval.dtype != out.dtype or not out.weak_type):
            return lax.convert_element_type(a, out.dtype)
        return a

    return jax.tree_util.tree_map(promote, init, carry)
