"""What autodiff keeps from the forward pass for the backward pass, with multiplicities.

`jax.ad_checkpoint.print_saved_residuals` lists the residuals of `jax.vjp` as they leave the
traced program: a value kept at every step of a ``lax.scan`` of length ``N`` appears there as one
stacked array, with no hint of what produced it inside the loop. `saved_residuals` follows each
residual into the scans (and `jit`s, checkpoints and calls) that produced it, and reports it per
copy, with its multiplicity (the product of the lengths of the scans around it), the primitive
that produced it, its `checkpoint_name` and the line of user code it came from.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from .._core._scan_params import scan_counts
from .._trace._jaxpr_walk import display_path
from ._measurement import Residual

try:  # the frames of remat's own modules are not "user code"
    from jax._src import source_info_util as _source_info

    _source_info.register_exclusion(os.path.dirname(__file__))
except Exception:  # pragma: no cover - private JAX API moved
    _source_info = None

_LIBRARY_DIRS = ("site-packages", "dist-packages")
_LOOK_THROUGH = ("reduce_precision", "copy", "copy_p")


def _nbytes(aval: Any) -> tuple[tuple[int, ...], str, int]:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # extended dtypes (PRNG keys)
        itemsize = getattr(dtype, "itemsize", 0) or 0
    return shape, str(dtype), int(itemsize * math.prod(shape))


def _source(eqn: Any) -> str | None:
    if _source_info is None:
        return None
    try:
        frames = list(_source_info.user_frames(eqn.source_info.traceback))
    except Exception:  # pragma: no cover - private JAX API moved
        return None
    if not frames:
        return None
    # prefer the user's own line (e.g. the model code) to a line inside an installed
    # library such as flax.linen that the user's line called
    own = [f for f in frames if not any(p in f.file_name for p in _LIBRARY_DIRS)]
    frame = (own or frames)[0]
    return f"{display_path(frame.file_name)}:{frame.start_line}"


def _sub_jaxpr(params: dict[str, Any], n_in: int, n_out: int) -> tuple[Any, list[Any]] | None:
    """The (jaxpr, consts) of a call-like equation whose inputs/outputs map one to one."""
    for value in params.values():
        if isinstance(value, jcore.ClosedJaxpr):
            jaxpr, consts = value.jaxpr, list(value.consts)
        elif isinstance(value, jcore.Jaxpr):
            jaxpr, consts = value, []
        else:
            continue
        if len(jaxpr.invars) == n_in and len(jaxpr.outvars) == n_out:
            return jaxpr, consts
    return None


class _Origin:
    """Where one residual came from: producer primitive, name, source line."""

    def __init__(self):
        self.primitive = ""
        self.name: str | None = None
        self.source: str | None = None


@functools.lru_cache(maxsize=64)  # jaxprs hash by identity; cleared after each use
def _producers(jaxpr: Any) -> dict[Any, tuple[Any, int]]:
    return {v: (eqn, i) for eqn in jaxpr.eqns for i, v in enumerate(eqn.outvars)}


def _find_origin(
    jaxpr: Any, var: Any, origin: _Origin, outer: Callable[[int], None] | None, seen: set[Any]
) -> None:
    """Fills ``origin`` by following ``var`` back to the equation that produced it.

    ``outer(i)`` continues with the i-th input of the enclosing call when ``var`` is an
    input of ``jaxpr``; it is None at the top level.
    """
    key = (id(jaxpr), id(var))
    if key in seen:  # a scan carry that passes through unchanged
        origin.primitive = origin.primitive or "scan carry"
        return
    seen.add(key)
    if isinstance(var, jcore.Literal):
        origin.primitive = "literal"
        return
    if var in jaxpr.invars:
        if outer is None:
            origin.primitive = "argument"
        else:
            outer(jaxpr.invars.index(var))
        return
    if var in jaxpr.constvars:
        origin.primitive = "constant"
        return
    producer = _producers(jaxpr).get(var)
    if producer is None:
        origin.primitive = "unknown"
        return
    eqn, index = producer
    try:
        _follow(jaxpr, eqn, index, origin, outer, seen)
    finally:
        # the innermost equation with a known line wins; callers fill in what is missing
        if origin.source is None:
            origin.source = _source(eqn)


def _follow(
    jaxpr: Any,
    eqn: Any,
    index: int,
    origin: _Origin,
    outer: Callable[[int], None] | None,
    seen: set[Any],
) -> None:
    prim = eqn.primitive.name

    def continue_outer(i: int, eqn=eqn) -> None:
        _find_origin(jaxpr, eqn.invars[i], origin, outer, seen)

    if prim in _LOOK_THROUGH or prim == "name":
        if prim == "name" and origin.name is None:
            origin.name = eqn.params["name"]
        _find_origin(jaxpr, eqn.invars[0], origin, outer, seen)
        return
    if prim == "scan":
        body = eqn.params["jaxpr"]
        num_consts, num_carry = scan_counts(eqn.params)

        def from_body_input(i: int, eqn=eqn) -> None:
            if num_consts <= i < num_consts + num_carry:
                # the carry at step t is what the body produced at step t - 1
                _find_origin(
                    body.jaxpr, body.jaxpr.outvars[i - num_consts], origin, from_body_input, seen
                )
            else:
                continue_outer(i)

        _find_origin(body.jaxpr, body.jaxpr.outvars[index], origin, from_body_input, seen)
        return
    sub = _sub_jaxpr(eqn.params, len(eqn.invars), len(eqn.outvars))
    if sub is not None:
        _find_origin(sub[0], sub[0].outvars[index], origin, continue_outer, seen)
        return
    origin.primitive = prim


def _walk(jaxpr: Any, var: Any, mult: int) -> tuple[Any, int]:
    """Follows ``var`` into the scans that stack it: returns (per-copy aval, multiplicity)."""
    seen: set[int] = set()
    while True:
        producer = _producers(jaxpr).get(var)
        if producer is None or id(var) in seen:
            return var.aval, mult
        seen.add(id(var))
        eqn, index = producer
        prim = eqn.primitive.name
        if prim in _LOOK_THROUGH or prim == "name":
            jaxpr, var = jaxpr, eqn.invars[0]
            if isinstance(var, jcore.Literal):
                return var.aval, mult
            continue
        if prim == "scan":
            body = eqn.params["jaxpr"].jaxpr
            if index >= scan_counts(eqn.params)[1]:
                mult *= int(eqn.params["length"])
            jaxpr, var = body, body.outvars[index]
        else:
            sub = _sub_jaxpr(eqn.params, len(eqn.invars), len(eqn.outvars))
            if sub is None:
                return var.aval, mult
            jaxpr, var = sub[0], sub[0].outvars[index]
        if isinstance(var, jcore.Literal) or var in jaxpr.invars or var in jaxpr.constvars:
            return var.aval, mult


def residuals_of_jaxpr(jaxpr: Any, residual_vars: Sequence[Any]) -> tuple[Residual, ...]:
    """Describes the residual outputs ``residual_vars`` of a traced forward program.

    Args:
      jaxpr: the (open) jaxpr of the forward pass whose outputs include the residuals.
      residual_vars: the outputs of ``jaxpr`` that are residuals.

    Returns:
      One `remat.Residual` per residual, per copy, with its multiplicity.
    """
    try:
        return tuple(_describe(jaxpr, var) for var in residual_vars)
    finally:
        _producers.cache_clear()  # do not keep the program's jaxprs (and constants) alive


def _describe(jaxpr: Any, var: Any) -> Residual:
    if isinstance(var, jcore.Literal):
        aval, mult = var.aval, 1
    else:
        aval, mult = _walk(jaxpr, var, 1)
    origin = _Origin()
    _find_origin(jaxpr, var, origin, None, set())
    shape, dtype, nbytes = _nbytes(aval)
    return Residual(
        shape=shape,
        dtype=dtype,
        bytes=nbytes,
        multiplicity=mult,
        primitive=origin.primitive,
        name=origin.name,
        source=origin.source,
    )


def saved_residuals(
    fn: Callable[..., Any], *args: Any, argnums: int | Sequence[int] = 0
) -> tuple[Residual, ...]:
    """What `jax.vjp` of ``fn`` with respect to ``args[argnums]`` keeps for the backward pass.

    Each residual is reported per copy: a value kept at every step of a ``lax.scan`` of
    length ``N`` is one `remat.Residual` with the per-step shape and ``multiplicity=N``
    (nested scans multiply). Arguments that are kept (e.g. weights a matmul's gradient
    needs) are listed with ``primitive="argument"``.

    Args:
      fn: the function to differentiate.
      *args: its arguments (arrays or pytrees of arrays).
      argnums: which positional arguments are differentiated, as in `jax.grad`.

    Returns:
      A tuple of `remat.Residual`, in the order `jax.vjp` keeps them.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._residuals import saved_residuals
      >>> def f(ws, x):
      ...     return jax.lax.scan(lambda y, w: (jnp.sin(y @ w), None), x, ws)[0].sum()
      >>> [(r.shape, r.multiplicity, r.primitive)
      ...  for r in saved_residuals(f, jnp.ones((3, 4, 4)), jnp.ones((2, 4)))]
      [((3, 4, 4), 1, 'argument'), ((2, 4), 3, 'sin'), ((2, 4), 3, 'cos')]
    """
    argnums_t = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    leaves, treedef = jax.tree_util.tree_flatten(args)

    def forward(*flat):
        all_args = list(jax.tree_util.tree_unflatten(treedef, flat))

        def of_diff(*diff):
            for i, d in zip(argnums_t, diff, strict=True):
                all_args[i] = d
            return fn(*all_args)

        _, vjp_fn = jax.vjp(of_diff, *(all_args[i] for i in argnums_t))
        return vjp_fn

    closed, vjp_shape = jax.make_jaxpr(forward, return_shape=True)(*leaves)
    num_res = len(jax.tree_util.tree_leaves(vjp_shape))
    jaxpr = closed.jaxpr
    residual_vars = jaxpr.outvars[len(jaxpr.outvars) - num_res :]
    residuals = residuals_of_jaxpr(jaxpr, residual_vars)
    from .._shard._shard_counts import per_device_residuals  # sharded arguments: bytes per device

    return per_device_residuals(closed, leaves, residual_vars, residuals)
