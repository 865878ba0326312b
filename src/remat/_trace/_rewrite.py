"""Rewriting the scans of a traced program: `remat.list_scans`, `rewrite_scans`.

A function is traced to a jaxpr (once per input structure, shapes and dtypes), and the jaxpr is
evaluated again by a small interpreter that binds every equation as it was, except ``scan``
equations, which it hands to a *transform* and re-runs with `jax.lax.scan`. Layers written with
`lax.scan`, `flax.linen.scan`, `nnx.scan` or an equinox-style scan over stacked layers all
reach the jaxpr as ``scan`` equations, so one rewrite covers them all, without touching model
code.

The reusable core, for `apply` and for the planner:

- `list_scans(fn, *args, **kwargs) -> list[ScanInfo]`: the scans of ``fn`` at these inputs.
- `rewrite_scans(fn, transform, loop=None) -> fn2`: ``transform(info, body)`` is called for
  every scan, where ``body(consts, carry, xs) -> (new_carry, ys)`` (flat lists of arrays)
  evaluates the scan's body jaxpr, with its own scans already rewritten. The transform
  returns a new body with the same signature (e.g. ``jax.checkpoint(body, policy=...)``),
  or None to leave the scan as it was. To tag values for a policy, call
  ``body(consts, carry, xs, tag=tag)``: ``tag(eqn, i, value) -> value`` sees the ``i``-th
  output of every equation of ``info.jaxpr`` (the body; inputs ``consts + carry + xs``) and
  may wrap it with `jax.ad_checkpoint.checkpoint_name`; or evaluate ``info.jaxpr`` yourself. ``loop(info, body, consts,
  init, xs) -> (carry, ys)`` replaces `lax.scan` for running a rewritten scan.
- `remat.apply(fn, strategy)` (`_apply.py`) is `rewrite_scans` with a transform that
  checkpoints the body.

Positions and names (defined in `_scan_info.py`). Scans are numbered 0, 1, ... in
depth-first order of appearance. A scan's *name* is the innermost `jax.named_scope` /
`jax.named_call` (or `jax.jit`-ed function's name) opened between the enclosing scan body
(or the program itself) and the scan, ``""`` if none; ``info.path`` is the chain of such
names from the program's root. A string in `remat.Strategy.scans` selects the scans whose
``name`` or ``"/".join(path)`` equals it.

The interpreter looks into the sub-programs of ``jit``, ``closed_call``, ``checkpoint``
(`jax.checkpoint`) and ``cond``; those that contain scans are evaluated again: a ``jit`` is
bound again with its own parameters (name, shardings, donation) on the rewritten sub-program,
``closed_call`` is inlined, ``checkpoint`` and ``cond`` are rebuilt with `jax.checkpoint` and
`lax.switch`.
Scans inside ``custom_jvp``/``custom_vjp`` functions, ``while_loop`` and ``shard_map`` are left
alone and not listed: autodiff does not differentiate through them (custom rules, no reverse
mode) or they are out of this module's scope.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax._src import source_info_util
from jax.extend import core as jcore

from .._core._errors import brief
from ._roll_rewrite import rolled_scans
from ._scan_info import (
    ScanInfo,
    count,
    count_eqn,
    holds_scan,
    inner_scope,
    mark_rolled,
    rolled_position,
    scan_info,
    sub_jaxprs,
)
from ._scan_info import _source as _source  # imported from here by `_costmodel`
from ._state import has_nodes, lift, merged
from ._traced import _rewritten, _split_args, _trace, _Traced

_P = jcore.primitives
_count = count  # the number of scans in a jaxpr; imported from here by `_tag`

Body = Callable[[Sequence[Any], Sequence[Any], Sequence[Any]], tuple[list[Any], list[Any]]]


_NOT_CALLABLE = "`{where}` got fn={got}, which is not callable; pass the function to rewrite."


def list_scans(
    fn: Callable[..., Any], *args: Any, roll: bool = True, **kwargs: Any
) -> list[ScanInfo]:
    """Lists the scans of ``fn`` traced at ``args``/``kwargs``, in depth-first order.

    Use it to find the positions and names to put in `remat.Strategy(scans=...)`. With
    ``roll=True`` a program whose layers repeat outside any scan (a Python loop over a list
    of layers) is listed as `remat.apply` sees it: one scan per run of identical layers,
    named ``rolled_{k}_layers``, with the first layer's source line and what is stacked
    (``ScanInfo.stacked``), numbered after the program's own scans (which keep the
    positions ``roll=False`` lists).

    Args:
      fn: the function; it is traced, not run.
      *args: positional arguments: arrays, or `jax.ShapeDtypeStruct` to avoid allocating.
      roll: list the rolled scans too (see above); False lists the program as written.
      **kwargs: keyword arguments.

    Returns:
      One `ScanInfo` per scan (see the module docstring for names and positions).

    Raises:
      TypeError: if ``fn`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def f(x, ws):
      ...     with jax.named_scope("layers"):
      ...         return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]
      >>> [(s.position, s.name, s.length) for s in remat.list_scans(f, jnp.ones(2), jnp.ones((3, 2, 2)))]
      [(0, 'layers', 3)]
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(where="remat.list_scans", got=brief(fn)))
    has_nodes_lifted = has_nodes((args, kwargs))
    if has_nodes_lifted:
        args, kwargs, _ = lift(args, kwargs)
        fn = merged(fn)
    if roll:
        return rolled_scans(fn, args, kwargs, check=not has_nodes_lifted)
    leaves, treedef, _, _ = _split_args(args, kwargs)
    return list(_trace(fn, leaves, treedef, check=not has_nodes_lifted).scans)


### Interpreter

Transform = Callable[[ScanInfo, Body], Body | None]
Loop = Callable[[ScanInfo, Body, list[Any], list[Any], list[Any]], tuple[list[Any], list[Any]]]


def lax_loop(info: ScanInfo, body: Body, consts, init, xs):
    """Runs ``body`` with `lax.scan` and the scan's own length, direction and unroll.

    JAX 0.10's ``scan`` equation has no ``_split_transpose`` parameter (`lax.scan` accepts the
    argument and ignores it), so there is nothing else to carry over. A rolled scan stays
    marked as one (`mark_rolled`), so it keeps its position in the program this makes.
    """

    def step(carry, x):
        return body(consts, carry, x)

    if rolled_position(info.jaxpr) is not None:
        mark_rolled(step, info.position)

    return lax.scan(
        step, list(init), list(xs), length=info.length, reverse=info.reverse, unroll=info.unroll
    )


@dataclasses.dataclass(frozen=True)
class _Interpreter:
    transform: Transform
    loop: Loop
    memo: dict
    # The program's own checkpoints: "rewrite" rebuilds them around their rewritten scans,
    # "keep" binds them as they are (their scans untouched: `apply`'s default), "inline"
    # removes them (`apply(..., override=True)`).
    checkpoints: str = "rewrite"

    def eval(self, jaxpr: jcore.Jaxpr, consts, args, base: int, path, rel, tag=None) -> list[Any]:
        env: dict[Any, Any] = {}
        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for v, x in zip(jaxpr.invars, args, strict=True):
            env[v] = x
        self.eval_eqns(jaxpr.eqns, env, base, path, rel, tag)
        return [v.val if isinstance(v, jcore.Literal) else env[v] for v in jaxpr.outvars]

    def eval_eqns(self, eqns, env: dict[Any, Any], base: int, path, rel, tag=None) -> int:
        """Evaluates ``eqns`` in order into ``env`` (which holds their inputs), the first at
        scan position ``base``; returns the position after them."""
        for eqn in eqns:
            invals = [v.val if isinstance(v, jcore.Literal) else env[v] for v in eqn.invars]
            name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
            with (
                source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
                eqn.ctx.manager,
            ):
                outs = self.eval_eqn(eqn, invals, base, path, rel)
            base += count_eqn(eqn, self.memo)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            if tag is not None:
                outs = [tag(eqn, i, x) for i, x in enumerate(outs)]
            for v, x in zip(eqn.outvars, outs, strict=True):
                if not isinstance(v, jcore.DropVar):
                    env[v] = x
        return base

    def eval_eqn(self, eqn, invals, base, path, rel):
        prim, params = eqn.primitive, eqn.params
        subs = sub_jaxprs(eqn)
        if prim is _P.scan_p:
            return self.eval_scan(eqn, invals, base, path, rel)
        if prim is _P.remat_p and self.checkpoints == "inline":
            inner_path, inner_rel = inner_scope(eqn, path, rel)
            return self.eval(params["jaxpr"], (), invals, base, inner_path, inner_rel)
        if prim is _P.remat_p and self.checkpoints == "keep":
            return prim.bind(*invals, **prim.get_bind_params(params))
        if not subs or not any(holds_scan(j, self.memo) for j in subs):
            return prim.bind(*invals, **prim.get_bind_params(params))
        inner_path, inner_rel = inner_scope(eqn, path, rel)

        def run(j, consts, b):
            return lambda *a: self.eval(j, consts, a, b, inner_path, inner_rel)

        if prim is _P.jit_p:  # the same jit (name, shardings, donation) on the rewritten program
            closed = params["jaxpr"]
            new = jax.make_jaxpr(run(closed.jaxpr, closed.consts, base))(*closed.in_avals)
            return prim.bind(*invals, **dict(params, jaxpr=new))
        if prim is _P.closed_call_p:
            closed = params["call_jaxpr"]
            return run(closed.jaxpr, closed.consts, base)(*invals)
        if prim is _P.call_p:
            return run(params["call_jaxpr"], (), base)(*invals)
        if prim is _P.remat_p:
            f = run(params["jaxpr"], (), base)
            return jax.checkpoint(f, prevent_cse=params["prevent_cse"], policy=params["policy"])(
                *invals
            )
        # cond: index, *operands
        fns, b = [], base
        for branch in params["branches"]:
            fns.append(run(branch.jaxpr, branch.consts, b))
            b += count(branch.jaxpr, self.memo)
        return lax.switch(invals[0], fns, *invals[1:])

    def eval_scan(self, eqn, invals, base, path, rel):
        info = scan_info(eqn, base, path, rel)
        closed = info.jaxpr
        n_inner = holds_scan(closed.jaxpr, self.memo)

        def body(consts, carry, xs, tag=None):
            outs = self.eval(
                closed.jaxpr, closed.consts, [*consts, *carry, *xs], base + 1, info.path, (), tag
            )
            return list(outs[: info.num_carry]), list(outs[info.num_carry :])

        new_body = self.transform(info, body)
        if new_body is None and not n_inner:
            return eqn.primitive.bind(*invals, **eqn.params)
        nc, nk = info.num_consts, info.num_carry
        consts, init, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]
        carry, ys = self.loop(info, body if new_body is None else new_body, consts, init, xs)
        return [*carry, *ys]


def rewrite_scans(
    fn: Callable[..., Any], transform: Transform, loop: Loop | None = None
) -> Callable[..., Any]:
    """Returns ``fn`` with every scan's body replaced by ``transform(info, body)``.

    Args:
      fn: the function to rewrite; any pytree arguments and outputs.
      transform: called once per scan (at each trace) with its `ScanInfo` and
        ``body(consts, carry, xs, tag=None) -> (new_carry, ys)`` (see the module
        docstring for ``tag``); returns a new ``(consts, carry, xs)`` body, or None to keep
        the scan as it was.
      loop: runs a rewritten scan: ``loop(info, body, consts, init, xs) -> (carry, ys)``;
        default `lax_loop` (`lax.scan` with the scan's length, reverse and unroll).

    Returns:
      A function with ``fn``'s signature and output structure.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._rewrite import rewrite_scans
      >>> f = lambda x: jax.lax.scan(lambda c, _: (c * 2, None), x, length=3)[0]
      >>> seen = []
      >>> g = rewrite_scans(f, lambda info, body: seen.append(info.length))
      >>> float(g(1.0)), seen
      (8.0, [3])
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(where="remat.rewrite_scans", got=brief(fn)))
    run = loop or lax_loop

    def evaluator(traced: _Traced):
        closed = traced.jaxpr

        def evaluate(*dynamic):
            interp = _Interpreter(transform, run, {})
            return interp.eval(closed.jaxpr, closed.consts, dynamic, 0, (), ())

        return evaluate

    return _rewritten(fn, evaluator)
