"""Reading the checkpoints of a traced program: what they ask for, and the program without them.

`remat.measure` asks two questions of the jaxpr before it looks at the compiled program:
does a `jax.checkpoint` in it ask for recomputation (a policy that does not save everything),
and how many matmul FLOPs would the gradient cost as traced? It answers the second for the
program as written and for its plain twin (every checkpoint inlined), so that it can tell
whether XLA kept the recomputation the program asked for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.extend import core as jcore

from ._jaxpr_walk import library_dirs
from ._scan_info import _frame, _source

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


### The program's own checkpoints


@dataclasses.dataclass(frozen=True)
class Site:
    """One `jax.checkpoint` (`jax.remat`, `flax.linen.remat`, `nnx.remat`) in a traced program.

    Attributes:
      policy: the policy's readable form (``"full"`` for ``policy=None``: save nothing).
      source: ``"file.py:line"`` of the user code that made it, ``""`` if unknown.
    """

    policy: str
    source: str

    def __str__(self) -> str:
        return f"checkpoint(policy={self.policy})" + (f" at {self.source}" if self.source else "")


def _policy_text(policy: Any) -> str:
    if policy is None:
        return "full"
    names = getattr(policy, "saveable_names", None)
    if names is not None:  # save_only_these_names
        return f"save_only_these_names({', '.join(repr(n) for n in sorted(names))})"
    return getattr(policy, "__name__", None) or repr(policy)


def _user_source(eqn: Any, outer: str) -> str:
    """The equation's source line, or ``outer`` (the enclosing equation's) where every frame
    is a library's (a `flax.linen.remat` inside `flax.linen.scan` is traced in flax)."""
    frame = _frame(eqn)
    if frame is None or frame.file_name.startswith(library_dirs(("flax", "equinox"))):
        return outer
    return _source(eqn)


def checkpoint_sites(jaxpr: Any, outer: str = "") -> tuple[Site, ...]:
    """The program's own checkpoints, in order of appearance, nested ones included.

    A checkpoint's source line is the user's line that made it, or that of the scan (or
    call) around it when it was traced inside a library (`flax.linen.remat` in
    `flax.linen.scan`).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._checkpoints import checkpoint_sites
      >>> policy = jax.checkpoint_policies.save_only_these_names("h1")
      >>> f = jax.checkpoint(jnp.sin, policy=policy)
      >>> [s.policy for s in checkpoint_sites(jax.make_jaxpr(f)(1.0).jaxpr)]
      ["save_only_these_names('h1')"]
    """
    out: list[Site] = []
    for eqn in jaxpr.eqns:
        where = _user_source(eqn, outer)
        if _is_remat(eqn):
            out.append(Site(_policy_text(eqn.params["policy"]), where))
        for j in _sub_jaxprs(eqn.params):
            out.extend(checkpoint_sites(j, where))
    return tuple(dict.fromkeys(out))  # a site traced twice (a scan's two bodies) counts once


_LOOPS = ("scan", "while")


def checkpoint_in_loop(jaxpr: Any) -> bool:
    """Whether a checkpoint of ``jaxpr`` is inside a loop (a `lax.scan` or while body), where
    the compiler keeps its recomputation.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._checkpoints import checkpoint_in_loop
      >>> body = jax.checkpoint(lambda h, w: (jnp.sin(h * w), None))
      >>> checkpoint_in_loop(jax.make_jaxpr(lambda w: jax.lax.scan(body, 1.0, w))(jnp.ones(3)).jaxpr)
      True
    """
    for eqn in jaxpr.eqns:
        subs = list(_sub_jaxprs(eqn.params))
        if eqn.primitive.name in _LOOPS and any(_contains_remat(j) for j in subs):
            return True
        if any(checkpoint_in_loop(j) for j in subs):
            return True
    return False


def contains_checkpoint(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` (or a sub-program of it) has a `jax.checkpoint` of its own."""
    return _contains_remat(jaxpr)


def checkpoint_names(jaxpr: Any) -> tuple[str, ...]:
    """The `jax.ad_checkpoint.checkpoint_name` names the program gives its values, in order.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> from remat._trace._checkpoints import checkpoint_names
      >>> checkpoint_names(jax.make_jaxpr(lambda x: checkpoint_name(x * 2, "h1"))(1.0).jaxpr)
      ('h1',)
    """
    out: list[str] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "name":
            out.append(eqn.params["name"])
        for j in _sub_jaxprs(eqn.params):
            out.extend(checkpoint_names(j))
    return tuple(dict.fromkeys(out))
