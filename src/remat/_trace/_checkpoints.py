"""Reading the checkpoints of a traced program: what they ask for, and the program without them.

`remat.measure` asks two questions of the jaxpr before it looks at the compiled program:
does a `jax.checkpoint` in it ask for recomputation (a policy that does not save everything),
and how many matmul FLOPs would the gradient cost as traced? It answers the second for the
program as written and for its plain twin (every checkpoint inlined), so that it can tell
whether XLA kept the recomputation the program asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.extend import core as jcore

_REMAT = ("remat2", "checkpoint", "remat")


def _is_remat(eqn: Any) -> bool:
    return eqn.primitive.name in _REMAT and "policy" in eqn.params


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for value in params.values():
        values = value if isinstance(value, tuple | list) else (value,)
        for v in values:
            if isinstance(v, jcore.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jcore.Jaxpr):
                yield v


def _contains_remat(jaxpr: Any) -> bool:
    return any(
        _is_remat(eqn) or any(_contains_remat(j) for j in _sub_jaxprs(eqn.params))
        for eqn in jaxpr.eqns
    )


def _eqn_dot_flops(eqn: Any) -> float:
    name = eqn.primitive.name
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        shape = eqn.invars[0].aval.shape
        k = math.prod(shape[d] for d in lhs_contract)
        return 2.0 * math.prod(eqn.outvars[0].aval.shape) * k
    if name == "conv_general_dilated":
        dn = eqn.params["dimension_numbers"]
        kernel = eqn.invars[1].aval.shape
        # rhs_spec = (out feature dim, in feature dim, *spatial dims)
        per_output = math.prod(kernel[d] for d in dn.rhs_spec[1:])
        return 2.0 * math.prod(eqn.outvars[0].aval.shape) * per_output
    return 0.0


def traced_dot_flops(jaxpr: Any) -> float:
    """Matmul and convolution FLOPs of a jaxpr, with ``scan`` lengths multiplied in.

    A ``cond`` counts its most expensive branch; a ``while_loop`` body counts once (its trip
    count is not known when tracing). Elementwise work is not counted.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._checkpoints import traced_dot_flops
      >>> f = lambda ws, x: jax.lax.scan(lambda y, w: (y @ w, None), x, ws)[0]
      >>> traced_dot_flops(jax.make_jaxpr(f)(jnp.ones((5, 8, 8)), jnp.ones((2, 8))).jaxpr)
      1280.0
    """
    total = 0.0
    for eqn in jaxpr.eqns:
        total += _eqn_dot_flops(eqn)
        subs = list(_sub_jaxprs(eqn.params))
        if not subs:
            continue
        if eqn.primitive.name == "scan":
            total += eqn.params["length"] * sum(traced_dot_flops(j) for j in subs)
        elif eqn.primitive.name == "cond":
            total += max(traced_dot_flops(j) for j in subs)
        else:
            total += sum(traced_dot_flops(j) for j in subs)
    return total


def _policy_recomputes(policy: Any, jaxpr: Any) -> bool:
    """Whether ``policy`` marks any equation of a checkpoint's body for recomputation."""
    if policy is None:
        return bool(jaxpr.eqns)
    from jax._src.interpreters import partial_eval as pe

    for eqn in jaxpr.eqns:
        if _is_remat(eqn):
            continue  # a nested checkpoint follows its own policy
        try:
            decision = policy(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params)
        except Exception:  # a policy that cannot judge this equation saves nothing special
            continue
        if decision is False or isinstance(decision, pe.RecomputeType):
            return True
        if any(_policy_recomputes(policy, j) for j in _sub_jaxprs(eqn.params)):
            return True
    return False


def recompute_requested(jaxpr: Any) -> bool:
    """Whether a `jax.checkpoint` in ``jaxpr`` has a policy that does not save everything.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._checkpoints import recompute_requested
      >>> f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
      >>> recompute_requested(jax.make_jaxpr(f)(1.0).jaxpr)
      True
    """
    for eqn in jaxpr.eqns:
        if _is_remat(eqn) and _policy_recomputes(eqn.params["policy"], eqn.params["jaxpr"]):
            return True
        if any(recompute_requested(j) for j in _sub_jaxprs(eqn.params)):
            return True
    return False


def _strip_closed(closed: Any) -> Any:
    if not _contains_remat(closed.jaxpr):
        return closed
    avals = [v.aval for v in closed.jaxpr.invars]
    specs = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        for a in avals
    ]
    return jax.make_jaxpr(lambda *xs: _eval_stripped(closed.jaxpr, closed.consts, xs))(*specs)


def _strip_params(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in params.items():
        if isinstance(value, jcore.ClosedJaxpr):
            value = _strip_closed(value)
        elif (
            isinstance(value, tuple)
            and value
            and all(isinstance(v, jcore.ClosedJaxpr) for v in value)
        ):
            value = tuple(_strip_closed(v) for v in value)
        out[key] = value
    return out


def _eval_stripped(jaxpr: Any, consts: Any, args: Any) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if _is_remat(eqn):
            outs = _eval_stripped(eqn.params["jaxpr"], (), invals)
        else:
            params = _strip_params(eqn.params) if _contains_remat_params(eqn) else eqn.params
            bind_params = eqn.primitive.get_bind_params(params)
            outs = eqn.primitive.bind(*invals, **bind_params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _contains_remat_params(eqn: Any) -> bool:
    return any(_contains_remat(j) for j in _sub_jaxprs(eqn.params))


def strip_checkpoints(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The plain twin of ``fn``: the same program with every `jax.checkpoint` inlined.

    Checkpoints inside ``scan``, ``cond``, ``while_loop`` and ``jit`` bodies are removed too;
    ones inside `jax.custom_vjp`/`jax.custom_jvp` rules are left as they are. Values and
    gradients equal ``fn``'s; only what is saved for the backward pass differs.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._checkpoints import strip_checkpoints, recompute_requested
      >>> f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
      >>> plain = strip_checkpoints(f)
      >>> bool(plain(1.0) == f(1.0)), recompute_requested(jax.make_jaxpr(plain)(1.0).jaxpr)
      (True, False)
    """

    def plain(*args: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *xs: fn(*jax.tree_util.tree_unflatten(treedef, xs)), return_shape=True
        )(*leaves)
        outs = _eval_stripped(closed.jaxpr, closed.consts, leaves)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return plain
