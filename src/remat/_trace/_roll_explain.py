"""Saying in one line why nothing in a program rolls: `explain_no_roll`."""

from __future__ import annotations

import numpy as np
from jax.extend import core as jcore

from ._jaxpr_walk import subjaxprs
from ._roll_dataflow import _Mismatch
from ._roll_detect import _candidates, _search, _stretches
from ._roll_lift import lifted_runs
from ._roll_tokens import _Tokens
from ._scan_info import _source


def _where(e) -> str:
    src = _source(e)
    return f" ({src})" if src else ""


def _describe(a, b) -> str:
    """What differs between two equations compared as corresponding layer positions."""
    if a.primitive != b.primitive:
        return f"{a.primitive.name} vs {b.primitive.name}"
    ia = [str(v.aval.str_short()) for v in a.invars]
    ib = [str(v.aval.str_short()) for v in b.invars]
    if ia != ib:
        pairs = [(x, y) for x, y in zip(ia, ib, strict=False) if x != y] or [(ia, ib)]
        x, y = pairs[0]
        return f"{a.primitive.name} input {x} vs {y}"
    oa = [str(v.aval.str_short()) for v in a.outvars]
    ob = [str(v.aval.str_short()) for v in b.outvars]
    if oa != ob:
        return f"{a.primitive.name} output {oa} vs {ob}"
    if a.effects or b.effects:  # an effectful equation never repeats (`_Tokens.strict_key`)
        return (
            f"{a.primitive.name} has a side effect (jax.debug.print, jax.debug.callback, io), "
            "which is never rolled; take it out of the layer, or run the layers in a "
            "`jax.lax.scan` yourself"
        )
    return f"{a.primitive.name} parameters differ"


def explain_no_roll(closed_jaxpr: jcore.ClosedJaxpr) -> str:
    """One line saying why nothing in a program can be rolled into a scan.

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.

    Returns:
      The reason, e.g. ``"layer at eqn 120 (model.py:33) differs from the one before it:
      dot_general input f32[64,128] vs f32[64,256]"``; when runs are found, a line that
      says how many.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_explain import explain_no_roll
      >>> explain_no_roll(jax.make_jaxpr(lambda x: jnp.sin(x).sum())(jnp.ones(3)))
      'no repeated structure found: no sequence of equations repeats (2 equations)'
    """
    closed_jaxpr, runs = lifted_runs(closed_jaxpr)
    if runs:
        layers = ", ".join(f"{r.length} layers at eqn {r.start}" for r in runs)
        return f"{len(runs)} run(s) roll: {layers}"
    jaxpr = closed_jaxpr.jaxpr
    eqns = jaxpr.eqns
    mismatches: list[_Mismatch] = []
    _search(jaxpr, _Tokens(), mismatches)
    if mismatches:
        m = mismatches[0]
        a, b = eqns[m.index], eqns[m.other]
        what = m.what if m.what not in ("parameters",) else _describe(a, b)
        return (
            f"layer at eqn {m.index}{_where(a)} differs from the one before it: "
            f"{what if m.what != 'dataflow' else 'it reads its inputs differently'}"
        )
    # Same primitives in the same order, different shapes: compare by primitive name only.
    names = [e.primitive.name for e in eqns]
    ids: dict[str, int] = {}
    coarse = np.array([ids.setdefault(n, len(ids)) for n in names], np.int64)
    best = None
    for p in _candidates(coarse):
        for lo, hi in _stretches(coarse, p):
            if best is None or hi - lo > best[1] - best[0]:
                best = (lo, hi, p)
    if best is not None:
        lo, hi, p = best
        tokens = _Tokens()
        for i in range(lo + p, hi):
            a, b = eqns[i], eqns[i - p]
            if tokens.loose_key(a) != tokens.loose_key(b):
                return (
                    f"layer at eqn {i}{_where(a)} differs from the one before it: {_describe(a, b)}"
                )
    return f"no repeated structure found: no sequence of equations repeats ({len(eqns)} equations)"


_NESTED = (
    "`remat` left the repeated layers ({runs}) as written: each layer holds a `scan` of its "
    "own, and one rolled scan would fold those into one and move the positions of the "
    "program's scans. Each of their scans is planned and checkpointed as any other; to "
    "checkpoint the rest of each layer too, put the layers in a scan yourself "
    "(`jax.lax.scan`, `nn.scan`, `nnx.scan`)."
)


def nested_not_rolled(runs: list) -> str | None:
    """Why runs of repeated layers that each hold a scan are left as written, or None
    where there are none (``runs``: the `Run`s `_roll_rewrite.numbered_runs` leaves).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import numbered_runs
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jax.lax.scan(lambda c, v: (jnp.tanh(c * v), None), x, w)[0]
      ...     return x.sum()
      >>> _, _, left = numbered_runs(jax.make_jaxpr(f)([jnp.ones((2, 3))] * 3, jnp.ones(3)), 3)
      >>> "left the repeated layers (3 at " in nested_not_rolled(left)
      True
    """
    if not runs:
        return None
    return _NESTED.format(runs=", ".join(f"{run.length} at {run.source}" for run in runs))


def holds_scan(eqn) -> bool:
    """Whether ``eqn`` is a scan or has one in any of its sub-programs."""
    if eqn.primitive.name == "scan":
        return True
    return any(holds_scan(e) for _, _, sub in subjaxprs(eqn) for e in sub.eqns)
