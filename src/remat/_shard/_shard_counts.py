"""How many ways each value of a jaxpr is split over devices: a memory model for SPMD programs.

Under `jax.sharding.AxisType.Auto` mesh axes (classic GSPMD, and every `jax.jit` with
``in_shardings``), a traced jaxpr knows the shardings of its inputs only; XLA's SPMD partitioner
decides those of the intermediates at compile time. A planner that sizes a scan body's
residuals from the jaxpr must nevertheless count each value at its **per-device** size, since
XLA's memory analysis of an SPMD program, which the plan is checked against, is per device.

`shard_counts` estimates the split of every value by propagating, dimension by dimension, how
many pieces each array axis is cut into, the way GSPMD's propagation does for the common
cases:

- elementwise operations and any operation whose output has an input's rank and sizes keep
  that input's splits (the largest over inputs, per dimension);
- `dot_general` keeps the splits of batch and free dimensions and drops the contracting ones
  (those are summed across devices);
- `transpose` permutes, `broadcast_in_dim` maps, `reshape` keeps the leading dimensions whose
  sizes do not change, reductions and `squeeze` drop their axes;
- `sharding_constraint`, ``jit(in_shardings=, out_shardings=)`` and explicit-axis avals set
  splits exactly;
- `scan` bodies see their sliced inputs without the leading axis; `remat`, `jit`, custom
  derivative calls, `cond` and `while` bodies are entered.

Anything else starts whole (split 1), which over-counts memory: a plan built on this model
errs on the side of fitting. A dimension's split never exceeds, and always divides, its size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.extend import core

from .._core._scan_params import scan_counts
from ._sharding import spec_splits

Splits = tuple[int, ...]

_SUB_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def splits_of(shape: Sequence[int], sharding: Any) -> Splits:
    """Per dimension, how many pieces ``sharding`` cuts a ``shape``-d value into.

    Example:
      >>> from remat._shard._shard_counts import splits_of
      >>> splits_of((8, 16), None)
      (1, 1)
    """
    shape = tuple(int(d) for d in shape)
    if sharding is None or not isinstance(sharding, jax.sharding.Sharding):
        return (1,) * len(shape)
    try:
        piece = sharding.shard_shape(shape)
    except (ValueError, TypeError, AttributeError):
        return (1,) * len(shape)
    return tuple(max(1, d // p) if p else 1 for d, p in zip(shape, piece, strict=True))


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(getattr(var.aval, "shape", ()))


def _whole(var: Any) -> Splits:
    return (1,) * len(_shape(var))


def _fit(var: Any, splits: Splits) -> Splits:
    """Clamps ``splits`` to ``var``'s shape: each split divides its dimension."""
    shape = _shape(var)
    if len(splits) != len(shape):
        return (1,) * len(shape)
    return tuple(s if s > 0 and d % s == 0 else 1 for s, d in zip(splits, shape, strict=True))


def _aval_splits(var: Any) -> Splits | None:
    """Splits from an explicit-axis aval (``f32[8@data,16]``), when it carries a sharding."""
    sharding = getattr(var.aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if not spec or not any(p is not None for p in spec):
        return None
    splits = spec_splits(sharding, len(_shape(var)))
    return None if splits is None else _fit(var, splits)


class _Env:
    def __init__(self) -> None:
        self.splits: dict[Any, Splits] = {}
        self.devices = 1  # the largest mesh a declared sharding names

    def declare(self, sharding: Any) -> None:
        if isinstance(sharding, jax.sharding.Sharding):
            self.devices = max(self.devices, _num_devices(sharding))

    def read(self, atom: Any) -> Splits:
        if isinstance(atom, core.Literal) or not hasattr(atom, "aval"):
            return (1,) * len(getattr(getattr(atom, "aval", None), "shape", ()))
        return self.splits.get(atom, _whole(atom))

    def write(self, var: Any, splits: Splits) -> None:
        explicit = _aval_splits(var)
        self.splits[var] = explicit if explicit is not None else _fit(var, splits)


def _same_shape_rule(eqn: Any, ins: list[Splits]) -> list[Splits]:
    outs = []
    for out in eqn.outvars:
        shape = _shape(out)
        best = [1] * len(shape)
        for var, splits in zip(eqn.invars, ins, strict=True):
            in_shape = tuple(getattr(getattr(var, "aval", None), "shape", ()))
            if len(in_shape) != len(shape):
                continue
            for d, (a, b) in enumerate(zip(in_shape, shape, strict=True)):
                if a == b:
                    best[d] = max(best[d], splits[d])
        outs.append(tuple(best))
    return outs


def _dot_general(eqn: Any, ins: list[Splits]) -> list[Splits]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = ins[0], ins[1]
    batch = [max(lhs[i], rhs[j]) for i, j in zip(lb, rb, strict=True)]
    lfree = [lhs[i] for i in range(len(lhs)) if i not in lc and i not in lb]
    rfree = [rhs[i] for i in range(len(rhs)) if i not in rc and i not in rb]
    return [tuple(batch + lfree + rfree)]


def _transpose(eqn: Any, ins: list[Splits]) -> list[Splits]:
    return [tuple(ins[0][p] for p in eqn.params["permutation"])]


def _broadcast_in_dim(eqn: Any, ins: list[Splits]) -> list[Splits]:
    out = [1] * len(eqn.params["shape"])
    in_shape = _shape(eqn.invars[0]) if hasattr(eqn.invars[0], "aval") else ()
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if i < len(in_shape) and in_shape[i] == eqn.params["shape"][d]:
            out[d] = ins[0][i]
    return [tuple(out)]


def _reshape(eqn: Any, ins: list[Splits]) -> list[Splits]:
    in_shape, out_shape = _shape(eqn.invars[0]), _shape(eqn.outvars[0])
    out = [1] * len(out_shape)
    for d, (a, b) in enumerate(zip(in_shape, out_shape, strict=False)):
        if a != b:
            # A split dimension cut into (outer, inner) keeps its split on the outer part.
            if ins[0][d] > 1 and b % ins[0][d] == 0 and (a % b == 0 or b % a == 0):
                out[d] = ins[0][d]
            break
        out[d] = ins[0][d]
    return [tuple(out)]


def _drop_axes(eqn: Any, ins: list[Splits]) -> list[Splits]:
    axes = eqn.params.get("axes", eqn.params.get("dimensions", ()))
    kept = tuple(s for d, s in enumerate(ins[0]) if d not in set(axes))
    return [kept for _ in eqn.outvars]


def _sharding_constraint(eqn: Any, ins: list[Splits]) -> list[Splits]:
    return [splits_of(_shape(v), eqn.params["sharding"]) for v in eqn.outvars]


_RULES = {
    "dot_general": _dot_general,
    "transpose": _transpose,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": _drop_axes,
    "reduce_sum": _drop_axes,
    "reduce_max": _drop_axes,
    "reduce_min": _drop_axes,
    "reduce_prod": _drop_axes,
    "reduce_and": _drop_axes,
    "reduce_or": _drop_axes,
    "argmax": _drop_axes,
    "argmin": _drop_axes,
    "sharding_constraint": _sharding_constraint,
}


def _jaxpr_of(params: dict[str, Any]) -> Any:
    for key in _SUB_JAXPR_PARAMS:
        sub = params.get(key)
        if sub is not None and (hasattr(sub, "eqns") or hasattr(sub, "jaxpr")):
            return sub
    return None


def _open(jaxpr: Any) -> Any:
    return jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") and hasattr(jaxpr, "consts") else jaxpr


def _declared(shardings: Any, n: int) -> list[Any]:
    """The declared shardings of a ``jit`` eqn, or Nones where unspecified."""
    if shardings is None:
        return [None] * n
    return [s if isinstance(s, jax.sharding.Sharding) else None for s in shardings]


def _run(jaxpr: Any, ins: list[Splits], env: _Env) -> list[Splits]:
    jaxpr = _open(jaxpr)
    for var, splits in zip(jaxpr.invars, ins, strict=True):
        env.write(var, splits)
    for var in jaxpr.constvars:
        env.write(var, _whole(var))
    for eqn in jaxpr.eqns:
        in_splits = [env.read(v) for v in eqn.invars]
        outs = _eqn(eqn, in_splits, env)
        for var, splits in zip(eqn.outvars, outs, strict=True):
            env.write(var, splits)
    return [env.read(v) for v in jaxpr.outvars]


def _eqn(eqn: Any, ins: list[Splits], env: _Env) -> list[Splits]:
    name = eqn.primitive.name
    params = eqn.params
    if name == "sharding_constraint":
        env.declare(params["sharding"])
    if name in _RULES:
        return _RULES[name](eqn, ins)
    if name == "scan":
        consts, carry = scan_counts(params)
        body_ins = [*ins[: consts + carry], *(s[1:] for s in ins[consts + carry :])]
        body_outs = _run(params["jaxpr"], body_ins, env)
        return [*body_outs[:carry], *((1, *s) for s in body_outs[carry:])]
    if name == "while":
        return _run(params["body_jaxpr"], ins[params["cond_nconsts"] :], env)
    if name == "cond":
        outs = [_run(branch, ins[1:], env) for branch in params["branches"]]
        return [tuple(max(col) for col in zip(*c, strict=True)) for c in zip(*outs, strict=True)]
    if name in ("pjit", "jit"):
        declared_in = _declared(params.get("in_shardings"), len(ins))
        for s in (*declared_in, *_declared(params.get("out_shardings"), 0)):
            env.declare(s)
        ins = [
            splits_of(_shape(v), s) if s is not None else i
            for v, s, i in zip(eqn.invars, declared_in, ins, strict=True)
        ]
        outs = _run(params["jaxpr"], ins, env)
        declared_out = _declared(params.get("out_shardings"), len(outs))
        return [
            splits_of(_shape(v), s) if s is not None else o
            for v, s, o in zip(eqn.outvars, declared_out, outs, strict=True)
        ]
    sub = _jaxpr_of(params)
    if sub is not None and len(_open(sub).invars) == len(ins):
        outs = _run(sub, ins, env)
        if len(outs) == len(eqn.outvars):
            return outs
    return _same_shape_rule(eqn, ins)


def shard_counts(
    jaxpr: Any, in_shardings: Sequence[Any], num_devices: int | None = None
) -> dict[Any, int]:
    """Into how many pieces each value of ``jaxpr`` (and of its sub-jaxprs) is split.

    Args:
      jaxpr: a (closed) jaxpr, e.g. from `jax.make_jaxpr`.
      in_shardings: one sharding (or None for a whole value, or a tuple of per-dimension
        splits) per input of ``jaxpr``, e.g.
        ``[x.sharding for x in jax.tree_util.tree_leaves(args)]``.
      num_devices: the most pieces a value can be split into; default: the largest mesh
        among ``in_shardings``.

    Returns:
      A dict from each variable to its number of pieces: its per-device bytes are its bytes
      divided by this number.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._shard._shard_counts import shard_counts
      >>> closed = jax.make_jaxpr(jnp.sin)(jnp.ones(4))
      >>> shard_counts(closed, [None])[closed.jaxpr.outvars[0]]
      1
    """
    env = _Env()
    opened = _open(jaxpr)
    in_shardings = list(in_shardings)
    ins = [
        _fit(v, s) if isinstance(s, tuple) else splits_of(_shape(v), s)
        for v, s in zip(opened.invars, in_shardings, strict=True)
    ]
    _run(jaxpr, ins, env)
    # No value is split into more pieces than there are devices (a merge of splits along
    # different dimensions can overshoot when two of them come from the same mesh axis).
    cap = num_devices or max(
        1,
        env.devices,  # meshes named by jit shardings and sharding constraints inside
        *(_num_devices(s) for s in in_shardings if isinstance(s, jax.sharding.Sharding)),
        *(math.prod(s) for s in in_shardings if isinstance(s, tuple)),
    )
    return {var: min(math.prod(splits), cap) for var, splits in env.splits.items()}


def _num_devices(sharding: Any) -> int:
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and hasattr(mesh, "size"):
        return int(mesh.size)
    try:
        return len(sharding.device_set)
    except (ValueError, AttributeError):
        return 1


def per_device_residuals(
    closed: Any, leaves: Sequence[Any], residual_vars: Sequence[Any], residuals: Sequence[Any]
) -> tuple[Any, ...]:
    """``residuals`` (`remat.Residual`) with their bytes divided by their shard counts.

    ``closed`` is the traced forward program, ``leaves`` its flat arguments (whose
    shardings seed the propagation, with those a `jax.jit` inside declares) and
    ``residual_vars`` its residual outputs, one per residual. Unsharded programs keep their
    bytes (every count is 1).
    """
    from ._sharding import _sharding_of

    counts = shard_counts(closed, [_sharding_of(x) for x in leaves])
    if all(c == 1 for c in counts.values()):
        return tuple(residuals)
    return tuple(
        dataclasses.replace(r, bytes=r.bytes // max(1, counts.get(v, 1)))
        if not isinstance(v, core.Literal)
        else r
        for v, r in zip(residual_vars, residuals, strict=True)
    )


def scan_input_splits(fn: Any, *args: Any) -> tuple[dict[int, list[Splits]], int]:
    """Per scan of ``fn`` (by `remat.list_scans` position), the splits of its body's inputs.

    Returns ``({position: [splits of each body input]}, number of devices)``; the body
    inputs are ``consts + carry + xs`` as in `remat.ScanInfo.jaxpr`.
    """
    from .._trace._traced import _split_args, _trace
    from ._sharding import _device_count, _sharding_of

    leaves, treedef, dynamic, _ = _split_args(args, {})
    traced = _trace(fn, leaves, treedef)
    shardings = [_sharding_of(x) for x in dynamic]
    env = _Env()
    opened = traced.jaxpr.jaxpr
    ins = [splits_of(_shape(v), s) for v, s in zip(opened.invars, shardings, strict=True)]
    _run(traced.jaxpr, ins, env)
    devices = max([env.devices, *(_device_count(s) for s in shardings if s is not None)])
    splits = {
        info.position: [env.read(v) for v in info.jaxpr.jaxpr.invars] for info in traced.scans
    }
    return splits, devices
