"""Tracing a function once per input structure: `_trace`, `_rewritten`.

Array leaves of the arguments are traced (as `jax.ShapeDtypeStruct`s); every other leaf is
static. `_rewritten(fn, evaluator)` is the wrapper every rewrite of a traced program returns
(`remat.apply`, `rewrite_scans`, rolling): it traces ``fn`` once per input structure,
shapes and dtypes, and evaluates the rewritten program on the array leaves. `nnx` modules
among the arguments are lifted to their state first and updated after (see `_state`), and
any other in-place change to an argument is refused (`check_unchanged`).

`traced_once` shares traces within a block: `remat.plan` looks for scans, models them, reads
their shardings and rewrites them, each from the same program; inside ``with traced_once():``
they trace ``fn`` at its arguments once between them (measured on an 80-layer Llama-style
decoder planned from shapes: the loss traced 8 times per plan before, 4 after).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from ._scan_info import ScanInfo, scans_of
from ._state import check_unchanged, has_nodes, lift, merged, write_back


def _is_array(x) -> bool:
    """Array leaves are traced; every other leaf (Python numbers, strings, ...) is static."""
    return isinstance(x, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct)


def _aval(x) -> tuple[Any, ...]:
    """Shape, dtype, weak type, and the manual mesh axes the value varies over (inside
    `jax.shard_map`; empty elsewhere)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.shape, x.dtype, bool(getattr(x, "weak_type", False)), frozenset()
    aval = jax.typeof(x)
    return aval.shape, aval.dtype, aval.weak_type, varying(aval)


def varying(aval: Any) -> frozenset[str]:
    """The manual mesh axes a value of type ``aval`` varies over (inside `jax.shard_map`;
    empty elsewhere)."""
    return frozenset(getattr(getattr(aval, "manual_axis_type", None), "varying", ()))


def zeros_varying(shape: tuple[int, ...], dtype: Any, aval: Any) -> Any:
    """Zeros of ``shape`` and ``dtype``; inside `jax.shard_map`, varying over the manual axes
    a value of type ``aval`` varies over (a loop's carried buffer must match what is written
    into it, and a `jax.lax.cond`'s branches must agree)."""
    out = jnp.zeros(shape, dtype)
    axes = tuple(sorted(varying(aval)))
    return jax.lax.pcast(out, axes, to="varying") if axes else out


def aval_spec(aval: Any) -> Any:
    """What a value of type ``aval`` is traced as: its shape and dtype, or, for a value inside
    `jax.shard_map` that varies over manual axes, the type itself, so that the traced program
    has the `pvary` that shard_map's checks put where a replicated value meets it."""
    if varying(aval):
        return aval
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _spec(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, weak_type=bool(getattr(x, "weak_type", False))
        )
    return aval_spec(jax.typeof(x))


@dataclasses.dataclass(frozen=True)
class _Traced:
    jaxpr: jcore.ClosedJaxpr
    out_tree: Any
    scans: tuple[ScanInfo, ...]


def _split_args(args, kwargs):
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    dynamic = [x for x in leaves if _is_array(x)]
    return leaves, treedef, dynamic, _key(leaves, treedef)


def _key(leaves, treedef) -> tuple[Any, ...]:
    """What a trace depends on: the structure, the static leaves, the arrays' avals."""
    avals = tuple(_aval(x) for x in leaves if _is_array(x))
    static = tuple(None if _is_array(x) else (type(x), x) for x in leaves)
    return treedef, static, avals


# While `traced_once` is active: the traces made so far, by function and input structure.
_SHARED: contextvars.ContextVar[dict[Any, _Traced] | None] = contextvars.ContextVar(
    "remat_shared_traces", default=None
)


@contextlib.contextmanager
def traced_once():
    """Within the block, `_trace` of one function at one input structure (shapes, dtypes,
    static leaves) traces once: later calls get the same `_Traced`. Nested blocks share the
    outermost one's traces; they are dropped when it ends."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _trace(fn, leaves, treedef, check=True) -> _Traced:
    shared = _SHARED.get()
    if shared is None:
        return _trace_now(fn, leaves, treedef, check)
    key = (fn, check, _key(leaves, treedef))
    try:
        found = shared.get(key)
    except TypeError:  # an unhashable static argument: trace every time
        return _trace_now(fn, leaves, treedef, check)
    if found is None:
        found = shared[key] = _trace_now(fn, leaves, treedef, check)
    return found


def _trace_now(fn, leaves, treedef, check=True) -> _Traced:
    is_dyn = [_is_array(x) for x in leaves]

    def flat(*dynamic):
        it = iter(dynamic)
        full = [next(it) if d else x for x, d in zip(leaves, is_dyn, strict=True)]
        args, kwargs = jax.tree_util.tree_unflatten(treedef, full)
        out = fn(*args, **kwargs)
        if check:  # (nnx nodes, lifted, hand their changes back: see `_state`)
            check_unchanged(_name(fn), (args, kwargs), full, treedef)
        return out

    specs = [_spec(x) for x, d in zip(leaves, is_dyn, strict=True) if d]
    closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*specs)
    scans = scans_of(closed.jaxpr)
    return _Traced(closed, jax.tree_util.tree_structure(out_shape), tuple(scans))


def _rewritten(fn, evaluator, lift_nodes=True):
    """``fn2(*args, **kwargs)``: traces ``fn`` (cached per input structure, shapes and dtypes),
    then runs ``evaluator(traced)(*arrays)``, the rewritten program on the array leaves.

    Called on concrete arrays, the evaluation is compiled with `jax.jit` (once per cache
    entry), so that eager calls do not re-trace every rewritten scan op by op; under an
    outer transformation (`jit`, `grad`, `vmap`) it is traced inline.
    """
    cache: dict[Any, tuple[_Traced, Callable[..., Any], Callable[..., Any]]] = {}

    def entry(leaves, treedef):
        traced = _trace(fn, leaves, treedef, check=lift_nodes)
        run = evaluator(traced)
        return traced, run, jax.jit(run)

    stateful: list[Callable[..., Any]] = []  # ``fn`` on lifted nnx nodes, made when needed

    @functools.wraps(fn)
    def fn2(*args, **kwargs):
        if lift_nodes and has_nodes((args, kwargs)):  # nnx modules: state changes are kept
            args, kwargs, nodes = lift(args, kwargs)
            if not stateful:
                stateful.append(_rewritten(merged(fn), evaluator, lift_nodes=False))
            out, states = stateful[0](*args, **kwargs)
            write_back(nodes, states)
            return out
        leaves, treedef, dynamic, key = _split_args(args, kwargs)
        try:
            hash(key)
        except TypeError:  # an unhashable static argument: trace every time
            found = entry(leaves, treedef)
        else:
            if key not in cache:
                cache[key] = entry(leaves, treedef)
            found = cache[key]
        traced, run, jitted = found
        eager = not any(isinstance(x, jax.core.Tracer) for x in dynamic)
        outs = (jitted if eager else run)(*dynamic)
        return jax.tree_util.tree_unflatten(traced.out_tree, outs)

    return fn2


def _name(fn: Any) -> str:
    return f"`{getattr(fn, '__qualname__', repr(fn))}`"
