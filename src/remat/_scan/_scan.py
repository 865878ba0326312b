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
- `Binomial`: Griewank's offline binomial checkpointing (Revolve, see `_revolve.py`). The
  forward pass is a plain scan that keeps the carries the schedule stores in its first sweep;
  the backward pass runs the rest of the schedule (computed in Python at trace time, encoded
  as an int32 table) in one `lax.fori_loop` with a fixed buffer of ``snapshots + 1`` carries
  (the snapshots and the last step's input).
  Compiled memory is O(snapshots * carry) and the program does not grow with ``N``; the body
  runs ``revolve_cost(N, snapshots) + N + 1`` times per gradient (the fewest for that many
  stored carries).
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
from ._keys import with_raw_keys
from ._revolve import revolve_schedule

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
_SHORT_LENGTHS = (
    "`remat.scan` got schedule=Nested(lengths={lengths}) whose product {product} is less than "
    "the scan length {n}; use lengths whose product is at least {n}, or lengths=None."
)
_CARRY_MISMATCH = (
    "`remat.scan` got a body whose output carry {out} does not match its input carry {inp}; "
    "the carry must keep the same structure, shapes and dtypes."
)


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    *,
    schedule: Any = "per_step",
    policy: Any = None,
) -> tuple[Any, Any]:
    """`jax.lax.scan` whose backward pass follows a checkpointing ``schedule``.

    Same semantics as `jax.lax.scan`: ``f(carry, x) -> (carry, y)``, pytree carries and
    inputs, stacked per-step outputs ``ys``, ``reverse``, ``xs=None`` with ``length``, and
    gradients for the arrays ``f`` closes over.

    Args:
      f: the step function ``(carry, x) -> (carry, y)``.
      init: the initial carry (a pytree of arrays).
      xs: the inputs to scan over (a pytree of arrays with a common leading axis), or None.
      length: the number of steps; required when ``xs`` is None.
      reverse: scan from the last element of ``xs`` to the first, as `jax.lax.scan` does.
      schedule: ``"per_step"`` (default: each step checkpointed with ``policy``),
        ``"none"`` (plain `lax.scan`), `remat.Nested` or `remat.Binomial`.
      policy: what each step saves: a strategy string (``"full"``, ``"dots"``, ...) or a
        `jax.checkpoint_policies` policy. ``None`` means ``"full"`` for ``"per_step"`` and
        `Nested`; for `Binomial` it means that the one step being reversed keeps all its
        residuals while it is reversed (one forward per reversal, as Revolve counts).

    Returns:
      ``(carry, ys)`` as `jax.lax.scan` returns them.

    `Binomial` defines the gradient with `jax.custom_vjp`: it supports reverse mode
    (`jax.grad`, `jax.vjp`) under `jax.jit` and `jax.vmap`, but not forward mode
    (`jax.jvp`) nor a second reverse pass through its backward pass.

    Raises:
      ValueError: for an unknown schedule or policy, ``xs``/``length`` that disagree, or
        `Nested` lengths whose product is less than the number of steps.

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
    """
    schedule = check_schedule(schedule, "remat.scan")
    _check_array_leaves(init, "init")
    _check_array_leaves(xs, "xs")
    n = _scan_length(xs, length)
    if schedule == "none" or n == 0:
        return lax.scan(f, init, xs, length=n, reverse=reverse)
    if isinstance(schedule, Binomial):
        run = functools.partial(
            _binomial_scan, n=n, reverse=reverse, snapshots=schedule.snapshots, policy=policy
        )
        return with_raw_keys(run, f, init, xs)
    resolved = resolve_policy(policy, "remat.scan")
    step = f if resolved is None else jax.checkpoint(f, policy=resolved, prevent_cse=False)
    if schedule == "per_step":
        return lax.scan(step, init, xs, length=n, reverse=reverse)
    assert isinstance(schedule, Nested)
    lengths = schedule.lengths or nested_lengths(n, schedule.levels)
    if math.prod(lengths) < n:
        raise ValueError(_SHORT_LENGTHS.format(lengths=lengths, product=math.prod(lengths), n=n))
    return _nested_scan(step, init, xs, n, tuple(lengths), reverse)


def _scan_length(xs: Any, length: Any) -> int:
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 0
    ):
        raise ValueError(_BAD_LENGTH.format(got=length))
    leaves = jax.tree_util.tree_leaves(xs)
    if not leaves:
        if length is None:
            raise ValueError(_NO_LENGTH)
        return int(length)
    sizes = []
    for leaf in leaves:
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(_LEAF_NO_AXIS.format(shape=shape))
        sizes.append(shape[0])
    if len(set(sizes)) > 1:
        raise ValueError(_MISMATCHED_XS.format(sizes=sorted(set(sizes))))
    if length is not None and int(length) != sizes[0]:
        raise ValueError(_LENGTH_XS.format(length=length, got=sizes[0]))
    return int(sizes[0])


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


def _nested_scan(step, init, xs, n: int, lengths: tuple[int, ...], reverse: bool):
    """Runs ``n <= prod(lengths)`` steps as nested scans with checkpointed block bodies."""
    if len(lengths) == 1:
        return lax.scan(step, init, xs, length=n, reverse=reverse)
    inner = lengths[1:]
    block = math.prod(inner)
    full, rest = divmod(n, block)

    def run_block(size):
        def body(carry, xb):
            return _nested_scan(step, carry, xb, size, inner, reverse)

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
            run_block(block), carry, xs_blocks, length=full, reverse=reverse
        )
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


# ---------------------------------------------------------------------------------------
# Binomial


def _inexact(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _macros(n: int, snapshots: int):
    """Compiles `revolve_schedule` into the forward stores and a table of backward steps.

    Returns ``(stores, first, table, slots)``: ``stores`` maps a carry index to the buffer
    row the forward pass writes it to (the schedule's first sweep, plus the input of the
    last step, which the backward pass starts from, in row ``slots`` unless a snapshot
    already holds it); ``first`` is that row; ``table`` is an int32 array whose rows
    ``(restore, start, advance, store, reverse)`` each mean: make slot ``restore`` current
    (-1: keep the current carry), whose index is ``start``; advance ``advance`` steps; copy
    the carry into slot ``store`` (-1: none); if ``reverse``, reverse step
    ``start + advance``. Slot ``j >= 1`` is buffer row ``j - 1``; slot 0 is ``init``.
    """
    actions = revolve_schedule(n, snapshots)
    first_reverse = next(p for p, (kind, _) in enumerate(actions) if kind == "reverse")
    slots = max([arg for kind, arg in actions if kind == "store"], default=0)
    stores, index, slot_index = {}, 0, {0: 0}
    for kind, arg in actions[:first_reverse]:
        if kind == "advance":
            index += arg
        else:
            stores[index] = arg - 1
            slot_index[arg] = index
    assert index == n - 1
    first = stores.setdefault(n - 1, slots)

    rows, row = [], None
    index = n - 1
    for kind, arg in actions[first_reverse:]:
        # Open a new row when this action cannot follow the row's last one in the order
        # restore, advance, store, reverse.
        order = {"restore": 0, "advance": 1, "store": 2, "reverse": 3}[kind]
        if row is None or order <= row["last"]:
            if row is not None:
                rows.append(row)
            row = {"restore": -1, "start": index, "advance": 0, "store": -1, "reverse": 0}
        row["last"] = order
        if kind == "restore":
            index = slot_index[arg]
            row["restore"], row["start"] = arg, index
        elif kind == "advance":
            row["advance"] = arg
            index += arg
        elif kind == "store":
            row["store"] = arg
            slot_index[arg] = index
        else:
            assert arg == index
            row["reverse"] = 1
    rows.append(row)
    keys = ("restore", "start", "advance", "store", "reverse")
    table = np.array([[r[k] for k in keys] for r in rows], dtype=np.int32)
    return stores, first, table, slots


def _binomial_scan(f, init, xs, n: int, reverse: bool, snapshots: int, policy: Any):
    x0 = jax.tree_util.tree_map(lambda a: a[0], xs)
    init = jax.tree_util.tree_map(jnp.asarray, init)
    carry_shape, _ = jax.eval_shape(f, init, x0)
    if jax.tree_util.tree_structure(carry_shape) != jax.tree_util.tree_structure(init) or any(
        a.shape != b.shape or (a.dtype != b.dtype and not jax.typeof(b).weak_type)
        for a, b in zip(
            jax.tree_util.tree_leaves(carry_shape), jax.tree_util.tree_leaves(init), strict=True
        )
    ):
        raise TypeError(_CARRY_MISMATCH.format(out=carry_shape, inp=init))
    # Weakly typed initial carries (Python scalars) take the body's dtype, as in `lax.scan`.
    init = jax.tree_util.tree_map(lambda a, s: a.astype(s.dtype), init, carry_shape)
    converted, consts = jax.closure_convert(f, init, x0)
    c_tree = jax.tree_util.tree_structure(init)
    x_tree = jax.tree_util.tree_structure(xs)
    y_tree = None

    def step(c_leaves, x_leaves, k_leaves):
        nonlocal y_tree
        carry = jax.tree_util.tree_unflatten(c_tree, c_leaves)
        x = jax.tree_util.tree_unflatten(x_tree, x_leaves)
        carry, y = converted(carry, x, *k_leaves)
        y_leaves, y_tree = jax.tree_util.tree_flatten(y)
        return jax.tree_util.tree_leaves(carry), y_leaves

    if policy is not None:
        resolved = resolve_policy(policy, "remat.scan")
        if resolved is not None:
            step = jax.checkpoint(step, policy=resolved, prevent_cse=False)

    stores, first, table, slots = _macros(n, snapshots)
    rows = slots + (first == slots)  # snapshot rows, plus one for the last step's input
    store_at = np.array(sorted(stores), dtype=np.int32)
    store_row = np.array([stores[i] for i in sorted(stores)], dtype=np.int32)

    def position(i):  # execution step i reads xs[position(i)]
        return n - 1 - i if reverse else i

    def x_at(x_leaves, i):
        return [lax.dynamic_index_in_dim(a, position(i), keepdims=False) for a in x_leaves]

    def primal(c0, x_leaves, k_leaves):
        def body(c, x):
            c, y = step(list(c), x, k_leaves)
            return tuple(c), y

        c, ys = lax.scan(body, tuple(c0), x_leaves, length=n, reverse=reverse)
        return list(c), ys

    @jax.custom_vjp
    def run(c0, x_leaves, k_leaves):
        return primal(c0, x_leaves, k_leaves)

    def run_fwd(c0, x_leaves, k_leaves):
        buf = [jnp.zeros((rows, *a.shape), a.dtype) for a in c0]

        def body(state, x):
            i, c, buf = state
            hit = store_at == i
            row = jnp.sum(jnp.where(hit, store_row, 0))
            buf = [
                b.at[row].set(jnp.where(hit.any(), a, b[row])) for b, a in zip(buf, c, strict=True)
            ]
            c, y = step(list(c), x, k_leaves)
            return (i + 1, tuple(c), buf), y

        (_, c, buf), ys = lax.scan(
            body, (jnp.int32(0), tuple(c0), buf), x_leaves, length=n, reverse=reverse
        )
        return (list(c), ys), (c0, x_leaves, k_leaves, buf)

    def run_bwd(res, cts):
        c0, x_leaves, k_leaves, buf = res
        ct_c_final, ct_ys = cts
        c_mask = [_inexact(a) for a in c0]
        x_mask = [_inexact(a) for a in x_leaves]
        k_mask = [_inexact(a) for a in k_leaves]
        y_mask = [_inexact(a) for a in ct_ys]

        def pick(leaves, mask):
            return [a for a, m in zip(leaves, mask, strict=True) if m]

        def merge(diff, full, mask):
            it = iter(diff)
            return [next(it) if m else a for a, m in zip(full, mask, strict=True)]

        def reverse_step(i, cur, ct_c, ct_x, ct_k):
            x = x_at(x_leaves, i)

            def diff_step(cd, xd, kd):
                c_out, y = step(
                    merge(cd, cur, c_mask), merge(xd, x, x_mask), merge(kd, k_leaves, k_mask)
                )
                return pick(c_out, c_mask), pick(y, y_mask)

            _, vjp = jax.vjp(diff_step, pick(cur, c_mask), pick(x, x_mask), pick(k_leaves, k_mask))
            ct_y = (
                pick(
                    [lax.dynamic_index_in_dim(a, position(i), keepdims=False) for a in ct_ys],
                    y_mask,
                )
                if ct_ys
                else []
            )
            g_c, g_x, g_k = vjp((ct_c, ct_y))
            ct_x = [
                lax.dynamic_update_index_in_dim(a, g.astype(a.dtype), position(i), 0)
                for a, g in zip(ct_x, g_x, strict=True)
            ]
            ct_k = [a + g for a, g in zip(ct_k, g_k, strict=True)]
            return g_c, ct_x, ct_k

        def advance(cur, start, count):
            def body(t, c):
                return step(c, x_at(x_leaves, start + t), k_leaves)[0]

            return lax.fori_loop(0, count, body, cur)

        def macro(p, state):
            cur, buf, ct_c, ct_x, ct_k = state
            restore, start, count, store, rev = (table[p, j] for j in range(5))
            if slots:
                j = jnp.clip(restore - 1, 0, rows - 1)
                held = [jnp.where(restore == 0, a, b[j]) for a, b in zip(c0, buf, strict=True)]
            else:
                held = c0
            cur = [jnp.where(restore >= 0, h, c) for h, c in zip(held, cur, strict=True)]
            cur = advance(cur, start, count)
            if slots:
                j = jnp.clip(store - 1, 0, rows - 1)
                buf = [
                    b.at[j].set(jnp.where(store >= 1, c, b[j]))
                    for b, c in zip(buf, cur, strict=True)
                ]
            ct_c, ct_x, ct_k = lax.cond(
                rev == 1,
                lambda args: reverse_step(start + count, *args),
                lambda args: tuple(args[1:]),
                (cur, ct_c, ct_x, ct_k),
            )
            return cur, buf, ct_c, ct_x, ct_k

        table = jnp.asarray(table_np)
        cur = [b[first] for b in buf]
        ct_c = pick(ct_c_final, c_mask)
        ct_x = [jnp.zeros_like(a) for a in pick(x_leaves, x_mask)]
        ct_k = [jnp.zeros_like(a) for a in pick(k_leaves, k_mask)]
        _, _, ct_c, ct_x, ct_k = lax.fori_loop(
            0, table_np.shape[0], macro, (cur, buf, ct_c, ct_x, ct_k)
        )

        def spread(diff, full, mask):
            it = iter(diff)
            return [next(it) if m else None for _, m in zip(full, mask, strict=True)]

        return (
            spread(ct_c, c0, c_mask),
            spread(ct_x, x_leaves, x_mask),
            spread(ct_k, k_leaves, k_mask),
        )

    table_np = table
    run.defvjp(run_fwd, run_bwd)
    c, ys = run(jax.tree_util.tree_leaves(init), jax.tree_util.tree_leaves(xs), list(consts))
    return jax.tree_util.tree_unflatten(c_tree, c), jax.tree_util.tree_unflatten(y_tree, ys)


_NOT_ARRAY_LEAF = (
    "`remat.scan` got a {kind} at {path}; every leaf of init and xs must be an array "
    "(jax.Array, numpy array or Python number). Close over other values in `f` instead."
)


def _check_array_leaves(tree: Any, name: str) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | complex):
            where = name + jax.tree_util.keystr(path)
            raise TypeError(_NOT_ARRAY_LEAF.format(kind=type(leaf).__name__, path=where))
