"""Naming every value of every scan body, and re-running a program with chosen names saved.

The planner identifies the values of a scan body by position: the body is flattened (calls to
`jax.jit`-ed functions inlined) and every floating-point output of its ``j``-th equation in the
``i``-th scan of the program (depth first, scans inside scan bodies are not counted) is tagged
``checkpoint_name(x, "remat_s{i}_e{j}")`` (``..._e{j}_{k}`` for the ``k``-th output of an
equation with several). Checkpointing the body with ``save_only_these_names(*chosen)`` then
saves exactly the chosen values: any subset is expressible, not only JAX's named policies.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import source_info_util
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore

# Call primitives whose bodies are inlined, so the values inside them can be named.
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}


def value_name(scan: int, eqn: int, out: int, nouts: int) -> str:
    """The checkpoint name of output ``out`` of equation ``eqn`` in scan ``scan``."""
    return f"remat_s{scan}_e{eqn}" if nouts == 1 else f"remat_s{scan}_e{eqn}_{out}"


def _read(env: dict, v: Any) -> Any:
    return v.val if isinstance(v, jcore.Literal) else env[v]


def _bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    params = eqn.primitive.get_bind_params(eqn.params)
    with (
        source_info_util.user_context(
            eqn.source_info.traceback, name_stack=eqn.source_info.name_stack
        ),
        eqn.ctx.manager,
    ):
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _eval_inlined(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    env: dict = {}
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        key = _INLINE.get(eqn.primitive.name)
        if key is not None and key in eqn.params:
            inner = eqn.params[key]
            inner_consts = inner.consts if hasattr(inner, "consts") else ()
            inner = inner.jaxpr if hasattr(inner, "jaxpr") else inner
            outs = _eval_inlined(inner, inner_consts, invals)
        else:
            outs = _bind(eqn, invals)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def _spec(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def flatten(closed: Any) -> Any:
    """A `ClosedJaxpr` equal to ``closed`` with calls to jitted functions inlined."""
    specs = [_spec(v.aval) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, a))(*specs)


def is_tagged(aval: Any) -> bool:
    """Whether a value of this type gets a name: floating-point arrays only."""
    return hasattr(aval, "dtype") and jnp.issubdtype(aval.dtype, jnp.inexact)


def eval_tagged(flat: Any, scan: int, args: Sequence[Any]) -> list[Any]:
    """Evaluates a flattened body, tagging every floating-point equation output."""
    jaxpr = flat.jaxpr
    env: dict = {}
    env.update(zip(jaxpr.constvars, flat.consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for j, eqn in enumerate(jaxpr.eqns):
        outs = _bind(eqn, [_read(env, v) for v in eqn.invars])
        for k, (var, out) in enumerate(zip(eqn.outvars, outs, strict=True)):
            if is_tagged(var.aval):
                out = checkpoint_name(out, value_name(scan, j, k, len(eqn.outvars)))
            env[var] = out
    return [_read(env, v) for v in jaxpr.outvars]


@dataclasses.dataclass(frozen=True)
class ScanChoice:
    """What to do with one scan: save these names (``None``: leave the scan as it is)."""

    names: tuple[str, ...] | None
    schedule: Any = "per_step"


@dataclasses.dataclass
class _State:
    choices: dict[int, ScanChoice]
    scan_eqns: list[Any]
    count: int = 0


def _run_scan(eqn: Any, invals: Sequence[Any], state: _State) -> list[Any]:
    index = state.count
    state.count += 1
    state.scan_eqns.append(eqn)
    choice = state.choices.get(index)
    if choice is None or choice.names is None:
        return _bind(eqn, invals)
    p = eqn.params
    nc, nk = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], list(invals[nc : nc + nk]), list(invals[nc + nk :])
    flat = flatten(p["jaxpr"])

    def step(carry, x):
        outs = eval_tagged(flat, index, [*consts, *carry, *x])
        return outs[:nk], outs[nk:]

    policy = jax.checkpoint_policies.save_only_these_names(*choice.names)
    if choice.schedule == "per_step":
        body = jax.checkpoint(step, policy=policy, prevent_cse=False)
        carry, ys = lax.scan(
            body, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
        )
    else:
        from ._scan import scan as remat_scan  # the scan helper's schedules

        carry, ys = remat_scan(
            step, init, xs, length=p["length"], reverse=p["reverse"],
            schedule=choice.schedule, policy=policy,
        )  # fmt: skip
    return [*carry, *ys]


def _eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], state: _State) -> list[Any]:
    env: dict = {}
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        key = _INLINE.get(eqn.primitive.name)
        if eqn.primitive.name == "scan":
            outs = _run_scan(eqn, invals, state)
        elif key is not None and key in eqn.params:
            inner = eqn.params[key]
            inner_consts = inner.consts if hasattr(inner, "consts") else ()
            inner = inner.jaxpr if hasattr(inner, "jaxpr") else inner
            outs = _eval(inner, inner_consts, invals, state)
        else:
            outs = _bind(eqn, invals)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def trace(fn: Callable, args: Sequence[Any]) -> tuple[Any, Any]:
    """Traces ``fn(*args)``; returns its `ClosedJaxpr` and the output tree."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    return closed, jax.tree_util.tree_structure(out_shape)


def find_scans(closed: Any) -> list[Any]:
    """The scan equations of a traced program, in the order `rewrite` numbers them."""
    state = _State(choices={}, scan_eqns=[])
    specs = [_spec(v.aval) for v in closed.jaxpr.invars]
    jax.make_jaxpr(lambda *a: _eval(closed.jaxpr, closed.consts, a, state))(*specs)
    return state.scan_eqns


def rewrite(fn: Callable, choices: dict[int, ScanChoice]) -> Callable:
    """``fn`` with its scans re-run as ``choices`` says (scans not in ``choices`` unchanged).

    The returned function traces ``fn`` on each call, so it takes the same arguments
    (pytrees of arrays) and returns the same pytree.
    """
    choices = dict(choices)

    @functools.wraps(fn)
    def rewritten(*args):
        flat_args, _ = jax.tree_util.tree_flatten(args)
        closed, out_tree = trace(fn, args)
        state = _State(choices=choices, scan_eqns=[])
        outs = _eval(closed.jaxpr, closed.consts, flat_args, state)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return rewritten
