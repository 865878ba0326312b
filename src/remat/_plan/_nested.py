"""The scans nested inside planned scans, in words (an `InfeasibleBudget`'s message names
them: the planner checkpoints the outer scan's steps, never the scans inside a step)."""

from __future__ import annotations

from typing import Any


def nested_scans(infos: Any) -> str | None:
    """The scans inside the bodies of the planned scans ``infos`` (`ScanInfo`s), in words
    (``"the 4-step scan inside scan 0"``), or None where there are none.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._rewrite import list_scans
      >>> inner = lambda h, w: jax.lax.scan(lambda g, v: (jnp.tanh(g * v), None), h, w)
      >>> loss = lambda ws, x: jnp.sum(jax.lax.scan(inner, x, ws)[0])
      >>> nested_scans(list_scans(loss, jnp.ones((2, 4, 3)), jnp.ones(3)))
      'the 4-step scan inside scan 0'
    """
    found = [
        (length, info.position)
        for info in infos
        if info.jaxpr is not None
        for length in _scan_lengths(info.jaxpr.jaxpr)
    ]
    if not found:
        return None
    words = [f"the {length}-step scan inside scan {position}" for length, position in found]
    return ", ".join(words)


def _scan_lengths(jaxpr: Any) -> list[int]:
    """The lengths of the scans in ``jaxpr`` and in its sub-programs, outermost only."""
    out: list[int] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append(eqn.params["length"])
            continue
        for value in eqn.params.values():
            for v in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    out.extend(_scan_lengths(inner))
    return out
