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


_NOT_ROLLED = (
    "`remat` left the repeated layers ({runs}) as written: the program has a "
    "`scan` of its own ({scan}), and remat rolls layers only in programs without one, so no "
    "strategy or plan reaches them. Put the layers in a scan (`jax.lax.scan`, `nn.scan`, "
    "`nnx.scan`), or compute what scans (a loss such as `optax.ctc_loss`) outside the "
    "function that remat is given."
)


def unrolled_beside_scans(closed_jaxpr: jcore.ClosedJaxpr, scans: list) -> str | None:
    """Why the repeated layers of a program that has scans of its own are not rolled, or
    None where it has none outside its scans (runs whose layers hold a scan are scans).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return jax.lax.scan(lambda c, v: (c + v, None), 0.0, x)[0]
      >>> closed = jax.make_jaxpr(f)([jnp.eye(3)] * 4, jnp.ones(3))
      >>> "left the repeated layers (4 at " in unrolled_beside_scans(closed, ["s"])
      True
    """
    if not scans:
        return None
    closed_jaxpr, runs = lifted_runs(closed_jaxpr)
    eqns = closed_jaxpr.jaxpr.eqns
    left = [
        f"{run.length} at {run.source}"
        for run in runs
        if run.path == ()
        and not any(_holds_scan(e) for e in eqns[run.start : run.start + run.length * run.period])
    ]
    if not left:
        return None
    scan = scans[0]
    where = getattr(scan, "source", None) or getattr(scan, "name", None) or "scan 0"
    return _NOT_ROLLED.format(runs=", ".join(left), scan=where)


def _holds_scan(eqn) -> bool:
    if eqn.primitive.name == "scan":
        return True
    return any(_holds_scan(e) for _, _, sub in subjaxprs(eqn) for e in sub.eqns)
