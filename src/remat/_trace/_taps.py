"""Taps on the values `remat._trace._tag.eval_tagged` names: read them, or give them.

Inside ``with tapped(given, seen):`` a body evaluated by `eval_tagged` uses ``given[name]``
in place of the value it computes for ``name`` (the computation is left for XLA to remove
when nothing else reads it), and records every named value in ``seen``.
`remat._trace._one_loop` recomputes the values a layer did not save this way, from those it
did.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

_TAPS: contextvars.ContextVar[tuple[dict[str, Any], dict[str, Any]] | None] = (
    contextvars.ContextVar("remat_taps", default=None)
)


@contextlib.contextmanager
def tapped(given: dict[str, Any], seen: dict[str, Any]) -> Iterator[None]:
    """Named values given (``name -> value``) and recorded in ``seen``, while inside."""
    token = _TAPS.set((given, seen))
    try:
        yield
    finally:
        _TAPS.reset(token)


def tapping() -> bool:
    """Whether a body evaluated here is tapped (inside `tapped`)."""
    return _TAPS.get() is not None


def tap(name: str, value: Any) -> Any:
    """``value`` for ``name``, as the taps inside which it is evaluated say (see `tapped`)."""
    taps = _TAPS.get()
    if taps is None:
        return value
    given, seen = taps
    value = given.get(name, value)
    seen[name] = value
    return value
