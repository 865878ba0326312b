"""`remat.scan`: `jax.lax.scan` with a choice of checkpointing schedule.

A `lax.scan` whose body is checkpointed still keeps every step's carry for the backward
pass, so its memory is O(N) carries. The schedules here trade recomputation for less:

- ``"none"`` / ``"per_step"``: `lax.scan`, with the body checkpointed under ``policy``.
- `Nested`: ``levels`` nested scans; each level's block body is checkpointed, so the
  backward pass keeps about ``sum(lengths)`` carries (``~ levels * N**(1/levels)``) and runs
  each step ``levels + 1`` times per gradient (with the default per-step policy). Any ``N``
  works: the steps that do not fill a whole block run as one shorter remainder block (an
  exact factorisation of ``N`` is preferred when one is nearly as good; see
  `nested_lengths`).
- `Binomial`: Griewank's offline binomial checkpointing (Revolve, see `_revolve.py` and
  `_scan_binomial.py`): at most ``snapshots`` stored carries and the fewest recomputations
  for that many; compiled memory is O(snapshots * carry) and the program does not grow
  with ``N``.

Every schedule takes `lax.scan`'s arguments and works under every transformation (`jit`,
`vmap`, forward and reverse mode to any order); the arguments are checked by `lax.scan`
itself (see `_scan_checks.py`), so misuse raises `lax.scan`'s errors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._core._schedule import Binomial, Nested, check_schedule
from .._core._strategy import resolve_policy
from . import _scan_checks as checks
from ._keys import with_raw_keys
from ._scan_binomial import binomial_scan

_SHORT_LENGTHS = (
    "`remat.scan` got schedule=Nested(lengths={lengths}) whose product {product} is less than "
    "the scan length {n}; use lengths whose product is at least {n}, or lengths=None."
)


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    _split_transpose: bool = False,
    *,
    schedule: Any = "per_step",
    policy: Any = None,
) -> tuple[Any, Any]:
    """`jax.lax.scan` whose backward pass follows a checkpointing ``schedule``.

    A drop-in for `jax.lax.scan`: the same arguments with the same meaning, the same
    results, the same errors (`lax.scan` checks the arguments; remat appends its advice),
    and every transformation on every schedule: `jax.jit`, `jax.vmap`, reverse mode
    (`jax.grad`, `jax.vjp`, `jax.jacrev`), forward mode (`jax.jvp`, `jax.linearize`,
    `jax.jacfwd`), second order (`jax.hessian`, `grad` of `grad`) and nesting.

    Args:
      f: the step function ``(carry, x) -> (carry, y)``.
      init: the initial carry (a pytree of arrays).
      xs: the inputs to scan over (a pytree of arrays with a common leading axis), or None.
      length: the number of steps; required when ``xs`` is None.
      reverse: scan from the last element of ``xs`` to the first, as `jax.lax.scan` does.
      unroll: how many steps each loop iteration runs, as in `jax.lax.scan` (an int >= 0
        or a bool); `Nested` and `Binomial` unroll within each of their segments, and
        ``True`` unrolls `Nested`'s every level (no loop left, as in `lax.scan`).
      _split_transpose: passed to `jax.lax.scan` (experimental there); ignored by
        `Binomial`, whose backward pass is its own loop.
      schedule: ``"per_step"`` (default: each step checkpointed with ``policy``),
        ``"none"`` (plain `lax.scan`), `remat.Nested` or `remat.Binomial`.
      policy: what each step saves: a strategy string (``"full"``, ``"dots"``, ...) or a
        `jax.checkpoint_policies` policy. ``None`` means ``"full"`` for ``"per_step"`` and
        `Nested`; for `Binomial` it means that the one step being reversed keeps all its
        residuals while it is reversed (one forward per reversal, as Revolve counts).

    Returns:
      ``(carry, ys)`` as `jax.lax.scan` returns them.

    Raises:
      TypeError, ValueError, IndexError: what `jax.lax.scan` raises for the same arguments
        (remat's advice appended), and ValueError for an unknown schedule or policy, a
        negative ``length``, or `Nested` lengths whose product is less than the number of
        steps.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def step(c, x):
      ...     c = jnp.sin(c) + x
      ...     return c, 2 * c
      >>> xs = jnp.linspace(0.0, 1.0, 100)
      >>> loss = lambda c0, s: remat.scan(step, c0, xs, schedule=s)[0]
      >>> g_plain = jax.grad(loss)(0.5, "none")
      >>> g_binomial = jax.grad(loss)(0.5, remat.Binomial(4))
      >>> bool(jnp.allclose(g_plain, g_binomial))
      True
      >>> t_binomial = jax.jvp(lambda c0: loss(c0, remat.Binomial(4)), (0.5,), (1.0,))[1]
      >>> bool(jnp.allclose(t_binomial, g_plain))
      True
    """
    schedule = check_schedule(schedule, "remat.scan")
    checks.check_length(length)
    checks.check_leaves(init, xs)
    unroll = checks.check_unroll(unroll)
    lax_args = dict(
        length=length, reverse=reverse, unroll=unroll, _split_transpose=_split_transpose
    )
    if schedule == "none" or not callable(f):  # `lax.scan` rejects a non-callable body
        with checks.lax_errors(schedule, xs, length):
            return lax.scan(f, init, xs, **lax_args)
    readonly = _readonly_carry(f, init, xs)
    if readonly is not None:  # as `lax.scan` does: read-only carries become constants
        body, rest, restore = _without_readonly(f, init, readonly)
        carry, ys = _scan(body, rest, xs, lax_args, schedule, policy)
        return restore(carry), ys
    return _scan(f, init, xs, lax_args, schedule, policy)


def _scan(f, init, xs, lax_args, schedule, policy):
    length, reverse, unroll = lax_args["length"], lax_args["reverse"], lax_args["unroll"]
    # A `Binomial` step keeps everything unless a policy is given (see `binomial_scan`).
    binomial = isinstance(schedule, Binomial)
    resolved = None if binomial and policy is None else resolve_policy(policy, "remat.scan")
    step = f if resolved is None else jax.checkpoint(f, policy=resolved, prevent_cse=False)
    if schedule == "per_step":
        with checks.lax_errors(schedule, xs, length):
            return lax.scan(step, init, xs, **lax_args)
    carry, n = checks.checked_by_lax(f, init, xs, length, reverse, unroll, schedule)
    init = checks.promote_weak(init, carry)
    if n == 0:
        return lax.scan(f, init, xs, **lax_args)
    if binomial:
        snapshots = schedule.snapshots

        def run(f: Callable[..., Any], init: Any, xs: Any) -> Any:
            return binomial_scan(f, init, xs, n, reverse, unroll, snapshots, policy)

        return with_raw_keys(run, f, init, xs)
    assert isinstance(schedule, Nested)
    lengths = schedule.lengths or nested_lengths(n, schedule.levels)
    if math.prod(lengths) < n:
        raise ValueError(_SHORT_LENGTHS.format(lengths=lengths, product=math.prod(lengths), n=n))
    split = lax_args["_split_transpose"]
    return _nested_scan(step, init, xs, n, tuple(lengths), reverse, unroll, split)


def _readonly_carry(f, init, xs) -> list[bool] | None:
    """Which carry leaves ``f`` returns unchanged (None: none, or ``f`` could not be traced).

    `lax.scan` moves such carries out of the loop, as constants of its body: in a `cond`
    with a batched predicate their output is then not batched. A checkpointed body hides
    the forwarding from `lax.scan`, so `remat.scan` finds it in a trace of ``f`` itself.
    """
    leaves = jax.tree_util.tree_leaves(init)
    x_leaves = jax.tree_util.tree_leaves(xs)
    if not leaves or any(np.ndim(a) == 0 or np.shape(a)[0] == 0 for a in x_leaves):
        return None  # nothing to move, or `lax.scan` has something to say about xs

    def probe(init, xs):
        carry, _ = f(init, jax.tree_util.tree_map(lambda a: a[0], xs))
        return carry

    try:
        closed, carry = jax.make_jaxpr(probe, return_shape=True)(init, xs)
    except Exception:  # the scan itself raises `lax.scan`'s error for it
        return None
    if jax.tree_util.tree_structure(carry) != jax.tree_util.tree_structure(init) or any(
        (a.shape, a.dtype) != (o.shape, o.dtype) and not a.weak_type
        for a, o in zip(map(jax.typeof, leaves), jax.tree_util.tree_leaves(carry), strict=True)
    ):
        return None  # `lax.scan` reports a carry mismatch on the whole carry
    jaxpr = closed.jaxpr
    mask = [o is i for o, i in zip(jaxpr.outvars, jaxpr.invars[: len(leaves)], strict=True)]
    return mask if any(mask) else None


def _without_readonly(f, init, readonly):
    """``f`` on the carry leaves that ``readonly`` does not select, the others closed over;
    its initial carry; and the function that puts a final carry back together."""
    leaves, tree = jax.tree_util.tree_flatten(init)
    fixed = [a for a, m in zip(leaves, readonly, strict=True) if m]
    rest = [a for a, m in zip(leaves, readonly, strict=True) if not m]

    def restore(carry):
        moving, held = iter(carry), iter(fixed)
        return tree.unflatten([next(held) if m else next(moving) for m in readonly])

    def body(carry, x):
        carry, y = f(restore(carry), x)
        out = jax.tree_util.tree_leaves(carry)
        return [a for a, m in zip(out, readonly, strict=True) if not m], y

    return body, rest, restore


# ---------------------------------------------------------------------------------------
# Nested


# An exact factorisation of N (no remainder block) is preferred when its sum of lengths is
# within this factor of the best one with a remainder: a remainder block slices ``xs`` (and
# concatenates the cotangent of ``xs``), which copies them; for a layer stack, whose ``xs``
# are the weights, that copy can cost more than the few extra carries.
_EXACT_SLACK = 1.25


def nested_lengths(n: int, levels: int) -> tuple[int, ...]:
    """Block lengths (outermost first) that `Nested` picks for ``n`` steps.

    A `Nested` scan keeps about ``sum(lengths)`` carries; under ``prod(lengths) >= n`` that
    sum is least when the lengths are equal, each about ``n ** (1/levels)``: the ceiling of
    the root, trimmed (outermost first) while the product still covers ``n``; steps beyond
    the last whole block run as a shorter remainder block, so any ``n`` works, primes
    included. When ``n`` factors exactly into lengths whose sum is within 25% of that, the
    exact factorisation (largest length outermost) is used instead, which avoids copying
    ``xs`` into a remainder block.

    Example:
      >>> from remat._scan._scan import nested_lengths
      >>> nested_lengths(1024, 2), nested_lengths(97, 2), nested_lengths(128, 2)
      ((32, 32), (10, 10), (16, 8))
    """
    even = _even_lengths(n, levels)
    exact = _exact_lengths(max(n, 1), levels)
    if sum(exact) <= _EXACT_SLACK * sum(even):
        return exact
    return even


def _even_lengths(n: int, levels: int) -> tuple[int, ...]:
    if levels == 1 or n <= 1:
        return (max(n, 1),) + (1,) * (levels - 1)
    root = max(1, round(n ** (1 / levels)))
    while root**levels < n:
        root += 1
    while root > 1 and (root - 1) ** levels >= n:
        root -= 1
    lengths = [root] * levels
    for i in range(levels):
        while lengths[i] > 1 and math.prod(lengths) // lengths[i] * (lengths[i] - 1) >= n:
            lengths[i] -= 1
    return tuple(lengths)


@functools.cache
def _exact_lengths(n: int, levels: int) -> tuple[int, ...]:
    """Lengths, largest first, with product exactly ``n`` and the least sum."""
    if levels == 1:
        return (n,)
    divisors = {d for k in range(1, math.isqrt(n) + 1) if n % k == 0 for d in (k, n // k)}
    best = (n, *(1,) * (levels - 1))
    for outer in sorted(divisors):
        inner = _exact_lengths(n // outer, levels - 1)
        if outer >= inner[0] and outer + sum(inner) < sum(best):
            best = (outer, *inner)
    return best


def _nested_scan(step, init, xs, n, lengths, reverse, unroll=1, split_transpose=False):
    """Runs ``n <= prod(lengths)`` steps as nested scans with checkpointed block bodies.

    ``unroll`` applies to the innermost scans (the segments of consecutive steps);
    ``unroll=True`` unrolls every level, so that, as in `lax.scan`, no loop is left.
    """
    if len(lengths) == 1:
        return lax.scan(
            step, init, xs, length=n, reverse=reverse, unroll=unroll,
            _split_transpose=split_transpose,
        )  # fmt: skip
    inner = lengths[1:]
    block = math.prod(inner)
    full, rest = divmod(n, block)
    if not full:  # fewer steps than one block: the inner levels alone run them
        return _nested_scan(step, init, xs, n, inner, reverse, unroll, split_transpose)

    def run_block(size):
        def body(carry, xb):
            return _nested_scan(step, carry, xb, size, inner, reverse, unroll, split_transpose)

        return jax.checkpoint(body, prevent_cse=False)

    def split(a):
        head = a if not rest else lax.slice_in_dim(a, 0, full * block)
        return head.reshape(full, block, *a.shape[1:]), lax.slice_in_dim(a, full * block, n)

    pairs = jax.tree_util.tree_map(split, xs)
    is_pair = lambda p: isinstance(p, tuple) and len(p) == 2 and not isinstance(p[0], tuple)  # noqa: E731
    xs_blocks = jax.tree_util.tree_map(lambda p: p[0], pairs, is_leaf=is_pair)
    xs_rest = jax.tree_util.tree_map(lambda p: p[1], pairs, is_leaf=is_pair)

    carry = init
    ys_blocks = ys_rest = None
    if reverse and rest:  # the remainder is the end of the sequence: in reverse it runs first
        carry, ys_rest = run_block(rest)(carry, xs_rest)
    if full:
        carry, ys_blocks = lax.scan(
            run_block(block), carry, xs_blocks, length=full, reverse=reverse,
            unroll=unroll is True, _split_transpose=split_transpose,
        )  # fmt: skip
        ys_blocks = jax.tree_util.tree_map(
            lambda y: y.reshape(full * block, *y.shape[2:]), ys_blocks
        )
    if not reverse and rest:
        carry, ys_rest = run_block(rest)(carry, xs_rest)
    if ys_blocks is None:
        return carry, ys_rest
    if ys_rest is None:
        return carry, ys_blocks
    return carry, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), ys_blocks, ys_rest)
