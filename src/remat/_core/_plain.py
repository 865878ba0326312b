"""Frozen dataclasses as plain JSON data and back (reports and plans are written as JSON).

Example:
  >>> import dataclasses
  >>> from remat._core._plain import from_plain, to_plain
  >>> @dataclasses.dataclass(frozen=True)
  ... class Point:
  ...     x: float
  ...     tags: tuple[str, ...] = ()
  >>> to_plain((Point(1.0, ("a",)), 4))
  [{'x': 1.0, 'tags': ['a']}, 4]
  >>> from_plain(Point, {"x": 1, "tags": ["a"]})
  Point(x=1.0, tags=('a',))
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def to_plain(value: Any) -> Any:
    """Dataclasses as dicts and tuples as lists, recursively: data `json.dumps` can write."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    return value


def from_plain(hint: Any, value: Any) -> Any:
    """Rebuilds a value of type ``hint`` (dataclasses, tuples, optionals) from JSON data."""
    if value is None:
        return None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        names = {f.name for f in dataclasses.fields(hint)}
        return hint(**{k: from_plain(hints[k], v) for k, v in value.items() if k in names})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return from_plain(arg, value)
        options = [a for a in args if a is not type(None)]
        return from_plain(options[0], value) if len(options) == 1 else _tuples(value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v) for v in value)
        if args:
            return tuple(from_plain(a, v) for a, v in zip(args, value, strict=True))
        return _tuples(value)
    if hint is float and isinstance(value, int):
        return float(value)
    return _tuples(value)


def _tuples(value: Any) -> Any:
    """JSON lists back to tuples (frozen dataclasses hold tuples), recursively."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
