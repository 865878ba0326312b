"""The code around a scan whose layers run as segments: before it, recomputed; after it,
checkpointed.

A program is often ``tail(scan(head(args)))``: an embedding lookup makes the layers' first
carry, the layers' scan, then a final norm and the loss. Autodiff keeps the head's output for
the first layer's backward pass and the tail's intermediates for the tail's, beyond what the
layers keep; torch's partitioner decides those per node too (it recomputes an embedding
lookup, and keeps the logits and nothing else of the loss). When a planned scan at the top of
the program runs as segments (`remat._trace._periodic.segments`):

- the head (`head_eqns`: the equations before the scan whose values go only to its initial
  carry, with no matmul, convolution or loop in them) is run inside the segments' custom VJP
  and run again for the first layer's backward pass, so its output is not kept (nor its
  indices): the program keeps the head's inputs, which it holds anyway (its arguments);
- the tail (every equation after the scan, when it holds no loop) is checkpointed saving its
  matmul outputs (`jax.checkpoint_policies.dots_saveable`): it recomputes elementwise work
  only, no FLOPs that `remat.measure` counts.

On the GPT of `benchmarks/vs_torch.py` with every layer saving one set (5 MiB a layer), the
saved activations (the residuals of `jax.vjp`, what torch's saved tensors are to torch) fall
from 43.15 to 41.00 MiB: the head's 0.50 MiB embedding output and the tail's 1.65 MiB of
norm and softmax values, at the same FLOPs (`tests/_trace/test_ends.py` checks the mechanism
on a small program). Its compiled peak is the same with and without them (68.19 MiB): the
tail's values are dead before the layers' backward loop, where the peak is, and the head's
output is not among the buffers live there either. So they lower what the program keeps for
its backward pass, not the CPU peak the planner budgets.

Only the scan's own position at the top of the program is looked at: a scan inside a ``jit``
of the program, or a program with more than one scan planned per layer, is rewritten without
its ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core as jcore

from .._core._complex import RealSaves
from .._core._scan_params import scan_counts
from ._periodic import periodic_loop
from ._rewrite import _Interpreter
from ._scan_info import count_eqn, position_of, scan_info, sub_jaxprs
from ._traced import _rewritten

_P = jcore.primitives

# The tail's policy: its matmul outputs saved, the elementwise work between them recomputed.
TAIL_POLICY = RealSaves(jax.checkpoint_policies.dots_saveable)

# Primitives a head may not hold: work that costs FLOPs to recompute, or a loop.
_DEAR = frozenset(
    {"dot_general", "conv_general_dilated", "scan", "while", "custom_vjp_call", "custom_jvp_call"}
)
# Primitives a checkpointed tail may not hold: checkpointing it would run a loop's forward
# pass again.
_LOOPS = frozenset({"scan", "while"})


def _holds(eqns: Sequence[Any], names: frozenset[str]) -> bool:
    """Whether any of ``eqns``, or an equation inside them, is one of ``names`` or has effects
    (an effect is not run twice)."""
    for eqn in eqns:
        if eqn.primitive.name in names or eqn.effects:
            return True
        if any(_holds(j.eqns, names) for j in sub_jaxprs(eqn)):
            return True
    return False


def head_eqns(jaxpr: jcore.Jaxpr, s: int) -> frozenset[int]:
    """The indices of the equations before ``jaxpr.eqns[s]`` (a scan) whose outputs are used
    only by each other and as the scan's initial carry, and whose inputs are the program's
    arguments, its constants or each other's outputs; none of them holding `_DEAR` work
    (`_holds`).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._ends import head_eqns
      >>> def f(emb, ws, tok):
      ...     x = emb[tok] * 2.0
      ...     return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()
      >>> closed = jax.make_jaxpr(f)(jnp.ones((5, 4)), jnp.ones((3, 4, 4)), jnp.arange(2))
      >>> s = next(j for j, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == "scan")
      >>> sorted(head_eqns(closed.jaxpr, s)) == list(range(s))
      True
    """
    scan = jaxpr.eqns[s]
    nc, nk = scan_counts(scan.params)
    uses: dict[Any, set[Any]] = {}
    for j, eqn in enumerate(jaxpr.eqns):
        for k, v in enumerate(eqn.invars):
            if isinstance(v, jcore.Var):
                uses.setdefault(v, set()).add("init" if j == s and nc <= k < nc + nk else j)
    for v in jaxpr.outvars:
        if isinstance(v, jcore.Var):
            uses.setdefault(v, set()).add("out")
    head: set[int] = set()
    for j in reversed(range(s)):
        eqn = jaxpr.eqns[j]
        used = set().union(*(uses.get(v, set()) for v in eqn.outvars))
        if used and used <= head | {"init"} and not _holds([eqn], _DEAR):
            head.add(j)
    # Only code that reads the program's arguments, constants or the head itself: keeping
    # another value in place of the carry it makes would save nothing.
    held = set(jaxpr.invars) | set(jaxpr.constvars)
    while True:
        made = {v for j in head for v in jaxpr.eqns[j].outvars}
        drop = {j for j in head
                if any(isinstance(v, jcore.Var) and v not in held and v not in made
                       for v in jaxpr.eqns[j].invars)}  # fmt: skip
        kept = head - drop
        made = {v for j in kept for v in jaxpr.eqns[j].outvars}
        drop |= {j for j in kept
                 if any(u not in kept and u != "init"
                        for v in jaxpr.eqns[j].outvars for u in uses.get(v, ()))}  # fmt: skip
        if not drop:
            return frozenset(head)
        head -= drop


def _eval(interp, eqns, env, base):
    """Evaluates ``eqns`` (the program's own, at the top) into ``env``; returns the scan
    position after them."""
    return interp.eval_eqns(eqns, env, base, (), ())


def _inputs(eqns: Sequence[Any], defined: set[Any]) -> list[Any]:
    """The variables ``eqns`` read that none of them defines, in order of first use."""
    out: list[Any] = []
    for eqn in eqns:
        for v in eqn.invars:
            if isinstance(v, jcore.Var) and v not in defined and v not in out:
                out.append(v)
        defined |= {v for v in eqn.outvars if not isinstance(v, jcore.DropVar)}
    return out


def top_scan(jaxpr: jcore.Jaxpr, position: int) -> int | None:
    """The index among ``jaxpr``'s own equations of the scan at ``position``, or None when
    that scan is inside another equation."""
    memo: dict[int, int] = {}
    base = 0
    for j, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive is _P.scan_p and position_of(eqn, base) == position:
            return j
        base += count_eqn(eqn, memo)
    return None


def rewrite_ends(
    fn: Callable[..., Any], position: int, pattern, transform, loop, tail_policy: Any
) -> Callable[..., Any] | None:
    """``fn`` with the scan at ``position`` (a top-level scan, run as segments saving
    ``pattern``) given its head and tail (see the module docstring), every other scan rewritten
    by ``transform`` and ``loop`` as `remat._trace._rewrite.rewrite_scans` does.

    Args:
      fn: the program.
      position: the planned scan's position (`ScanInfo.position`).
      pattern: the names each of its layers saves (as long as the scan).
      transform, loop: as `remat._trace._rewrite.rewrite_scans` takes them.
      tail_policy: the `jax.checkpoint` policy of the code after the scan; None leaves it.
    """

    def evaluator(traced):
        closed = traced.jaxpr
        jaxpr = closed.jaxpr
        s = top_scan(jaxpr, position)

        def evaluate(*dynamic):
            interp = _Interpreter(transform, loop, {})
            if s is None:
                return interp.eval(jaxpr, closed.consts, dynamic, 0, (), ())
            env: dict[Any, Any] = dict(zip(jaxpr.constvars, closed.consts, strict=True))
            env.update(zip(jaxpr.invars, dynamic, strict=True))
            head = head_eqns(jaxpr, s)
            before = [e for j, e in enumerate(jaxpr.eqns[:s]) if j not in head]
            base = _eval(interp, before, env, 0)
            base += sum(count_eqn(jaxpr.eqns[j], interp.memo) for j in head)
            base = _scan(interp, jaxpr, s, [jaxpr.eqns[j] for j in sorted(head)], env, base,
                         pattern)  # fmt: skip
            after = list(jaxpr.eqns[s + 1 :])
            if tail_policy is None or not after or _holds(after, _LOOPS):
                _eval(interp, after, env, base)
                return [v.val if isinstance(v, jcore.Literal) else env[v] for v in jaxpr.outvars]
            inputs = _inputs(after, set())
            defined = {v for e in after for v in e.outvars}
            inputs += [v for v in jaxpr.outvars
                       if isinstance(v, jcore.Var) and v not in defined and v not in inputs]  # fmt: skip

            def tail(*vals):
                local = dict(zip(inputs, vals, strict=True))
                _eval(interp, after, local, base)
                return [v.val if isinstance(v, jcore.Literal) else local[v]
                        for v in jaxpr.outvars]  # fmt: skip

            return jax.checkpoint(tail, policy=tail_policy)(*[env[v] for v in inputs])

        return evaluate

    return _rewritten(fn, evaluator)


def _scan(interp, jaxpr, s, head, env, base, pattern) -> int:
    """Runs the scan ``jaxpr.eqns[s]`` as segments into ``env``, its initial carry computed
    by the ``head`` equations inside them; returns the scan position after it."""
    eqn = jaxpr.eqns[s]
    info = scan_info(eqn, base, (), ())
    closed = info.jaxpr

    def body(consts, carry, xs, tag=None):
        outs = interp.eval(closed.jaxpr, closed.consts, [*consts, *carry, *xs], base + 1,
                           info.path, (), tag)  # fmt: skip
        return list(outs[: info.num_carry]), list(outs[info.num_carry :])

    new_body = interp.transform(info, body) or body
    nc, nk = info.num_consts, info.num_carry

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    consts = [read(v) for v in eqn.invars[:nc]]
    xs = [read(v) for v in eqn.invars[nc + nk :]]
    init_vars = eqn.invars[nc : nc + nk]
    inputs = _inputs(head, set())
    inputs += [v for v in init_vars if isinstance(v, jcore.Var) and v in env and v not in inputs]

    def make_init(*vals):
        local = dict(zip(inputs, vals, strict=True))
        _eval(interp, head, local, base)
        return [v.val if isinstance(v, jcore.Literal) else local[v] for v in init_vars]

    if head:
        carry, ys = periodic_loop(new_body, pattern, consts, [env[v] for v in inputs], xs,
                                  info.length, info.reverse, head=make_init)  # fmt: skip
    else:
        carry, ys = periodic_loop(new_body, pattern, consts, [read(v) for v in init_vars], xs,
                                  info.length, info.reverse)  # fmt: skip
    for v, x in zip(eqn.outvars, [*carry, *ys], strict=True):
        if not isinstance(v, jcore.DropVar):
            env[v] = x
    return base + count_eqn(eqn, interp.memo)
