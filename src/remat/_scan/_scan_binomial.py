"""`remat.scan`'s `Binomial` schedule: Revolve under every JAX transformation.

The scan ``c_{i+1}, y_i = f(c_i, x_i)`` is one `jax.custom_jvp` function, the *sweep*,
whose outputs are ``(c_n, ys, buf)``: ``buf`` holds the carries that Revolve's first sweep
stores (Griewank 1992; Griewank & Walther 2000; see `_revolve.py`). Its JVP rule returns the
sweep itself for the primal and, for the tangent, one `linear_call` (see `_scan_linear.py`)
whose two directions are:

- forward: the JVP of the sweep, a tangent scan that stores nothing per step, so `jax.jvp`,
  `jax.linearize` and `jax.jacfwd` keep O(snapshots) carries;
- transpose: Revolve's backward sweep, from the inputs and ``buf`` (the only residuals that
  reverse mode keeps): the rest of the schedule, compiled at trace time into a table of
  unit actions (advance one step, reverse one step), run by one `lax.scan` over that table.
  The body runs ``revolve_cost(N, snapshots) + N + 1`` times per gradient.

Every piece is a JAX function, so the rules compose: `vmap` batches the table scans;
forward-over-reverse (`jax.hessian`) runs the JVP of the backward sweep; reverse-over-
reverse differentiates the backward sweep in a twin form whose table scan is split into
``~sqrt(T)`` checkpointed blocks, and the sweep's own rule (called again inside itself)
keeps the outer pass on Revolve too, so memory stays sublinear in N at second order.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from .._core._flop_tags import branch_scope, trip_scope
from .._core._strategy import resolve_policy
from ._revolve import revolve_schedule
from ._scan_linear import linear_call

ADVANCE, REVERSE, NOTHING = 0, 1, 2


@functools.cache
def _plan(n: int, snapshots: int):
    """Compiles `revolve_schedule` into the forward stores and a table of unit actions.

    Returns ``(stores, first, slots, table, macros)``: ``stores`` maps a carry index to the buffer
    row the forward sweep writes it to (the schedule's first sweep, plus the input of the
    last step, which the backward sweep starts from, in row ``slots`` unless a snapshot
    already holds it); ``first`` is that row; ``table`` is an int32 array whose rows
    ``(restore, index, kind, store)`` each mean: make slot ``restore`` current (-1: keep
    the current carry); then advance the carry by step ``index`` (kind 0) or reverse step
    ``index`` (kind 1); then copy the carry into slot ``store`` (-1: none). Slot ``j >= 1``
    is buffer row ``j - 1``; slot 0 is the initial carry. ``macros`` is the same schedule in
    fewer, longer rows (see `_macro_rows`).
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

    rows: list[list[int]] = []
    restore, index = -1, n - 1
    for kind, arg in actions[first_reverse:]:
        if kind == "restore":
            restore, index = arg, slot_index[arg]
        elif kind == "advance":
            for _ in range(arg):
                rows.append([restore, index, ADVANCE, -1])
                restore, index = -1, index + 1
        elif kind == "store":
            assert rows[-1][2] == ADVANCE  # Revolve stores right after an advance
            rows[-1][3] = arg
            slot_index[arg] = index
        else:
            assert arg == index
            rows.append([restore, index, REVERSE, -1])
            restore = -1
    units = np.array(rows, dtype=np.int32).reshape(-1, 4)
    return stores, first, slots, units, _macro_rows(units)


def _macro_rows(units: np.ndarray) -> np.ndarray:
    """The unit rows merged into macro rows ``(restore, start, advance, store, reverse)``.

    A macro row restores slot ``restore`` (-1: none), whose index is ``start``; advances
    ``advance`` steps; stores into slot ``store`` (-1: none); and, if ``reverse``, reverses
    step ``start + advance``. The evaluated backward sweep runs the advances of one row in a
    tight inner loop, without a per-step branch.
    """
    macros: list[list[int]] = []
    row = None
    for restore, index, kind, store in units.tolist():
        # A new macro row at a restore, after a store or a reversal, or at the first row.
        if row is None or restore >= 0 or row[3] >= 0 or row[4]:
            row = [restore, index, 0, -1, 0]
            macros.append(row)
        if kind == ADVANCE:
            row[2] += 1
            row[3] = store
        else:
            row[4] = 1
    return np.array(macros, dtype=np.int32).reshape(-1, 5)


def _inexact(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _pick(leaves, mask):
    return [a for a, m in zip(leaves, mask, strict=True) if m]


def _merge(diff, full, mask):
    it = iter(diff)
    return [next(it) if m else a for a, m in zip(full, mask, strict=True)]


def _float0_fill(diff, full, mask):
    """Tangents for ``full``: ``diff`` where inexact, float0 zeros elsewhere."""
    zeros = [np.zeros(np.shape(a), jax.dtypes.float0) for a in full]
    return _merge(diff, zeros, mask)


def _tangent_fill(diff, full, mask):
    """Tangents for ``full``: ``diff`` where ``mask`` (None: zero), else zeros (float0 for
    integers)."""
    it = iter(diff)
    out = []
    for a, m in zip(full, mask, strict=True):
        d = next(it) if m else None
        if d is None:
            d = jnp.zeros_like(a) if _inexact(a) else np.zeros(np.shape(a), jax.dtypes.float0)
        out.append(d)
    return out


def _split(leaves, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(list(leaves[start : start + size]))
        start += size
    return out


def _closure_convert(f, init, x0):
    """``f`` as ``g(carry, x, *consts)`` with every value it closes over among ``consts``.

    `jax.closure_convert` hoists only the closed-over values that could carry a tangent, and
    leaves integer arrays and PRNG keys closed over; under an outer `jax.jit` those are
    tracers, which must not stay inside the jaxprs the linear primitive stages out. Here
    every constant of the traced body is an explicit input (non-float ones get no tangent).
    """
    closed, out_shape = jax.make_jaxpr(f, return_shape=True)(init, x0)
    out_tree = jax.tree_util.tree_structure(out_shape)
    jaxpr = closed.jaxpr

    def converted(carry, x, *consts):
        outs = jax.core.eval_jaxpr(jaxpr, consts, *jax.tree_util.tree_leaves((carry, x)))
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return converted, list(closed.consts)


def binomial_scan(f, init, xs, n: int, reverse: bool, unroll, snapshots: int, policy: Any):
    """Runs ``lax.scan(f, init, xs, length=n, reverse=reverse)`` with Revolve's backward.

    ``init`` must already have the body's carry types (`remat.scan` checks and promotes it).
    """
    init = jax.tree_util.tree_map(jnp.asarray, init)
    x0 = jax.tree_util.tree_map(lambda a: a[0], xs)
    converted, consts = _closure_convert(f, init, x0)
    c_tree = jax.tree_util.tree_structure(init)
    x_tree = jax.tree_util.tree_structure(xs)
    c0 = jax.tree_util.tree_leaves(init)
    x_leaves = jax.tree_util.tree_leaves(xs)
    k_leaves = list(consts)
    y_tree = None

    def step(c_leaves, xl, kl):
        nonlocal y_tree
        carry = jax.tree_util.tree_unflatten(c_tree, c_leaves)
        x = jax.tree_util.tree_unflatten(x_tree, xl)
        carry, y = converted(carry, x, *kl)
        y_leaves, y_tree = jax.tree_util.tree_flatten(y)
        return jax.tree_util.tree_leaves(carry), y_leaves

    if policy is not None:
        resolved = resolve_policy(policy, "remat.scan")
        if resolved is not None:
            step = jax.checkpoint(step, policy=resolved, prevent_cse=False)

    _, y_avals = jax.eval_shape(step, c0, [a[0] for a in x_leaves], k_leaves)
    c_mask = [_inexact(a) for a in c0]
    x_mask = [_inexact(a) for a in x_leaves]
    k_mask = [_inexact(a) for a in k_leaves]
    y_mask = [_inexact(a) for a in y_avals]
    stores, first, slots, table, macros = _plan(n, snapshots)
    # The backward loops' trip counts depend on the table; their totals, known here, are
    # named for the HLO FLOP counter so that measured FLOPs are exact.
    # The differentiable twin runs the table in ~sqrt(T) blocks of ~sqrt(T) rows.
    block_rows = max(1, math.isqrt(len(table)))
    blocks = -(-len(table) // block_rows)
    padded_rows = blocks * block_rows
    kinds = [int((table[:, 2] == k).sum()) for k in (ADVANCE, REVERSE, NOTHING)]
    kinds[2] += padded_rows - len(table)
    row_kinds = branch_scope(kinds, padded_rows)
    advance_trips = trip_scope(int(macros[:, 2].sum()), len(macros))
    reversed_count = int(macros[:, 4].sum())
    macro_reverses = branch_scope([len(macros) - reversed_count, reversed_count], len(macros))
    rows = slots + (first == slots)  # snapshot rows, plus one for the last step's input
    store_at = np.array(sorted(stores), dtype=np.int32)
    store_row = np.array([stores[i] for i in sorted(stores)], dtype=np.int32)
    row_of_index = np.full(n, -1, dtype=np.int32)
    row_of_index[store_at] = store_row

    def position(i):  # execution step i reads xs[position(i)]
        return n - 1 - i if reverse else i

    def x_at(xl, i):
        return [lax.dynamic_index_in_dim(a, position(i), keepdims=False) for a in xl]

    def sweep(c0, xl, kl):
        """The scan, writing the carries of the schedule's first sweep into ``buf``."""
        buf = [jnp.zeros((rows, *a.shape), a.dtype) for a in c0]

        def body(state, x):
            i, c, buf = state
            hit = store_at == i
            row = jnp.sum(jnp.where(hit, store_row, 0))
            buf = [
                b.at[row].set(jnp.where(hit.any(), a, b[row])) for b, a in zip(buf, c, strict=True)
            ]
            c, y = step(list(c), x, kl)
            return (i + 1, tuple(c), buf), y

        (_, c, buf), ys = lax.scan(
            body, (jnp.int32(0), tuple(c0), buf), xl, length=n, reverse=reverse, unroll=unroll
        )
        return list(c), ys, buf

    sizes_res = (len(c0), len(x_leaves), len(k_leaves), len(c0))
    sizes_out = (sum(c_mask), sum(y_mask), sum(c_mask))

    def tangent(res, lin, masks):
        """The JVP of the sweep; ``lin`` holds the tangents the ``masks`` select."""
        c0, xl, kl, _ = _split(res, sizes_res)
        dc, dx, dk = _split(lin, [sum(m) for m in masks])
        tangents = tuple(
            _tangent_fill(d, full, m)
            for d, full, m in zip((dc, dx, dk), (c0, xl, kl), masks, strict=True)
        )
        _, (tc, tys, tbuf) = jax.jvp(sweep, (c0, xl, kl), tangents)
        return _pick(tc, c_mask) + _pick(tys, y_mask) + _pick(tbuf, c_mask)

    def backward(res, cts, masks, differentiable=False):
        """Revolve's backward sweep: the transpose of `tangent`, for the same ``masks``."""
        lc, lx, lk = masks
        c0, xl, kl, buf = _split(res, sizes_res)
        ct_c, ct_ys, ct_buf = _split(cts, sizes_out)  # None: a zero cotangent
        ct_c = [
            jnp.zeros_like(a) if ct is None else ct
            for ct, a in zip(ct_c, _pick(c0, c_mask), strict=True)
        ]
        y_rows = [a for a, m in zip(y_avals, y_mask, strict=True) if m]
        row_of = jnp.asarray(row_of_index)

        def reverse_step(i, cur, lam, ct_k):
            x = x_at(xl, i)

            def diff_step(cd, xd, kd):
                c_out, y = step(_merge(cd, cur, c_mask), _merge(xd, x, lx), _merge(kd, kl, lk))
                return _pick(c_out, c_mask), _pick(y, y_mask)

            _, vjp = jax.vjp(diff_step, _pick(cur, c_mask), _pick(x, lx), _pick(kl, lk))
            ct_y = [
                jnp.zeros(y.shape, y.dtype)
                if a is None
                else lax.dynamic_index_in_dim(a, position(i), keepdims=False)
                for a, y in zip(ct_ys, y_rows, strict=True)
            ]
            g_c, g_x, g_k = vjp((lam, ct_y))
            # A carry that the forward sweep also wrote to ``buf`` gets that output's cotangent
            # (zero, and skipped, unless the buffer is used: at second order).
            r = row_of[i]
            g_c = [
                g if cb is None else g + jnp.where(r >= 0, cb[jnp.clip(r, 0, rows - 1)], 0)
                for g, cb in zip(g_c, ct_buf, strict=True)
            ]
            return g_c, g_x, [a + g for a, g in zip(ct_k, g_k, strict=True)]

        def row_body(state, row):
            cur, buf, lam, ct_k, ct_x = state
            restore, index, kind, store = row[0], row[1], row[2], row[3]
            j = jnp.clip(restore - 1, 0, rows - 1)
            held = [jnp.where(restore == 0, a, b[j]) for a, b in zip(c0, buf, strict=True)]
            cur = [jnp.where(restore >= 0, h, c) for h, c in zip(held, cur, strict=True)]
            no_gx = [jnp.zeros(a.shape[1:], a.dtype) for a in _pick(xl, lx)]

            def advance(args):
                cur, lam, ct_k = args
                return step(cur, x_at(xl, index), kl)[0], lam, ct_k, no_gx

            def reverse(args):
                cur, lam, ct_k = args
                lam, g_x, ct_k = reverse_step(index, cur, lam, ct_k)
                return cur, lam, ct_k, g_x

            def nothing(args):
                return (*args, no_gx)

            with jax.named_scope(row_kinds):  # exact FLOPs: see `remat._core._flop_tags`
                cur, lam, ct_k, g_x = lax.switch(
                    kind, [advance, reverse, nothing], (cur, lam, ct_k)
                )
            j = jnp.clip(store - 1, 0, rows - 1)
            buf = [
                b.at[j].set(jnp.where(store >= 1, c, b[j])) for b, c in zip(buf, cur, strict=True)
            ]
            return (cur, buf, lam, ct_k, ct_x), g_x

        def macro_sweep(state):
            """The evaluated sweep: `lax.fori_loop`s over macro rows and their advances."""

            def advance(cur, start, count):
                def body(t, c):
                    return step(c, x_at(xl, start + t), kl)[0]

                with jax.named_scope(advance_trips):  # exact FLOPs (`_core._flop_tags`)
                    return lax.fori_loop(0, count, body, cur)

            def reverse(args):
                i, cur, lam, ct_k, ct_x = args
                lam, g_x, ct_k = reverse_step(i, cur, lam, ct_k)
                ct_x = [
                    lax.dynamic_update_index_in_dim(a, g.astype(a.dtype), position(i), 0)
                    for a, g in zip(ct_x, g_x, strict=True)
                ]
                return lam, ct_k, ct_x

            def macro(p, state):
                cur, buf, lam, ct_k, ct_x = state
                restore, start, count, store, rev = (table_m[p, j] for j in range(5))
                j = jnp.clip(restore - 1, 0, rows - 1)
                held = [jnp.where(restore == 0, a, b[j]) for a, b in zip(c0, buf, strict=True)]
                cur = [jnp.where(restore >= 0, h, c) for h, c in zip(held, cur, strict=True)]
                cur = advance(cur, start, count)
                j = jnp.clip(store - 1, 0, rows - 1)
                buf = [
                    b.at[j].set(jnp.where(store >= 1, c, b[j]))
                    for b, c in zip(buf, cur, strict=True)
                ]
                with jax.named_scope(macro_reverses):
                    lam, ct_k, ct_x = lax.cond(
                        rev == 1,
                        reverse,
                        lambda args: tuple(args[2:]),
                        (start + count, cur, lam, ct_k, ct_x),
                    )
                return cur, buf, lam, ct_k, ct_x

            table_m = jnp.asarray(macros)
            _, _, lam, ct_k, ct_x = lax.fori_loop(0, macros.shape[0], macro, state)
            return _pick(_merge(lam, c0, c_mask), lc) + ct_x + ct_k

        state = (
            [b[first] for b in buf],
            buf,
            list(ct_c),
            [jnp.zeros_like(a) for a in _pick(kl, lk)],
            [jnp.zeros_like(a) for a in _pick(xl, lx)],
        )
        if not differentiable:
            return macro_sweep(state)
        # Reverse mode runs through this twin: the T table rows run in ~sqrt(T) checkpointed
        # blocks of ~sqrt(T) rows, so it keeps O(sqrt(T)) block states and rows' residuals
        # (T is about N times the repetition number): sublinear in N. Each step's x
        # cotangent is an output row, not a carried buffer.
        padded = np.full((padded_rows, 4), -1, dtype=np.int32)
        padded[:, 2] = NOTHING
        padded[: len(table)] = table
        k_zeros = state[3]

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def block(carry, rows_):
            # The params cotangent starts at zero in each block and is summed outside it,
            # so the stored block inputs do not include it (its sum needs no residuals).
            (cur, buf, lam, g_k, _), gx = lax.scan(row_body, (*carry, k_zeros, []), rows_)
            return (cur, buf, lam), g_k, gx

        def outer(carry, rows_):
            *carry, ct_k = carry
            carry, g_k, gx = block(tuple(carry), rows_)
            return (*carry, [a + g for a, g in zip(ct_k, g_k, strict=True)]), gx

        (_, _, lam, ct_k), gx = lax.scan(
            outer, state[:4], jnp.asarray(padded.reshape(blocks, block_rows, 4))
        )
        reversed_rows = np.nonzero(table[:, 2] == REVERSE)[0]
        order = reversed_rows[np.argsort([position(int(i)) for i in table[reversed_rows, 1]])]
        ct_x = [g.reshape(blocks * block_rows, *g.shape[2:])[order] for g in gx]
        return _pick(_merge(lam, c0, c_mask), lc) + ct_x + ct_k

    @jax.custom_jvp
    def run(c0, xl, kl):
        return sweep(c0, xl, kl)

    def run_jvp(primals, tangents):
        c0, xl, kl = primals
        # Only the tangents that are not symbolic zeros are linear inputs: reverse mode then
        # computes no cotangent for what it does not differentiate (e.g. data xs).
        masks = tuple(
            tuple(m and type(t) is not SymbolicZero for t, m in zip(ts, mask, strict=True))
            for ts, mask in zip(tangents, (c_mask, x_mask, k_mask), strict=True)
        )
        # The primal through `run` itself: an outer transformation sees this same rule.
        c, ys, buf = run(c0, xl, kl)
        out = linear_call(
            functools.partial(tangent, masks=masks),
            functools.partial(backward, masks=masks),
            [*c0, *xl, *kl, *buf],
            [
                t
                for ts, mask in zip(tangents, masks, strict=True)
                for t, m in zip(ts, mask, strict=True)
                if m
            ],
            transpose_diff=functools.partial(backward, masks=masks, differentiable=True),
        )
        tc, tys, tbuf = _split(out, sizes_out)
        return (c, ys, buf), (
            _float0_fill(tc, c, c_mask),
            _float0_fill(tys, ys, y_mask),
            _float0_fill(tbuf, buf, c_mask),
        )

    run.defjvp(run_jvp, symbolic_zeros=True)

    c, ys, _ = run(c0, x_leaves, k_leaves)
    return jax.tree_util.tree_unflatten(c_tree, c), jax.tree_util.tree_unflatten(y_tree, ys)
