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
import hashlib
import json
import math
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


### Checking JSON data before it is rebuilt (files that users may have edited)


class PlainError(ValueError):
    """JSON data that does not have the type or range its dataclass field needs.

    Attributes:
      field: where, e.g. ``"scans[0].saved[1].bytes"``.
      why: what is wrong with it, e.g. ``"is 'x', expected an int"``.
    """

    def __init__(self, field: str, why: str):
        super().__init__(f"field {field!r} {why}")
        self.field = field
        self.why = why


_KIND = {int: "an int", float: "a number", str: "a string", bool: "true or false"}


def check_plain(hint: Any, value: Any, field: str, minimum: dict[str, int] | None = None) -> None:
    """Checks that JSON ``value`` is what `to_plain` writes for a value of type ``hint``.

    Numbers must be finite and not negative; ``minimum`` maps a field's last name (``"length"``)
    to a larger least value. A dataclass must have every field without a default and no other.

    Raises:
      PlainError: naming the first field (``field`` and the path below it) that is wrong.

    Example:
      >>> import dataclasses
      >>> from remat._core._plain import check_plain
      >>> @dataclasses.dataclass(frozen=True)
      ... class Point:
      ...     x: int
      >>> check_plain(Point, {"x": "3"}, "point")
      Traceback (most recent call last):
      ...
      remat._core._plain.PlainError: field 'point.x' is '3', expected an int
    """
    minimum = minimum or {}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise PlainError(field, f"is {_shown(value)}, expected an object")
        hints = typing.get_type_hints(hint)
        fields = dataclasses.fields(hint)
        for f in fields:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if f.name in value:
                check_plain(hints[f.name], value[f.name], f"{field}.{f.name}", minimum)
            elif required:
                raise PlainError(f"{field}.{f.name}", "is missing")
        extra = sorted(set(value) - {f.name for f in fields})
        if extra:
            raise PlainError(f"{field}.{extra[0]}", "is not a field of this file's format")
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_plain(arg, value, field, minimum)
            except PlainError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise PlainError(field, f"is {_shown(value)}, not of type {_hint_name(hint)}")
    if origin is tuple:
        if not isinstance(value, list):
            raise PlainError(field, f"is {_shown(value)}, expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            for i, v in enumerate(value):
                check_plain(args[0], v, f"{field}[{i}]", minimum)
        elif args:
            if len(value) != len(args):
                raise PlainError(field, f"has {len(value)} items, expected {len(args)}")
            for i, (a, v) in enumerate(zip(args, value, strict=True)):
                check_plain(a, v, f"{field}[{i}]", minimum)
        return
    if hint is Any:
        return
    if hint in (int, float):
        ok = isinstance(value, int) if hint is int else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or not math.isfinite(value):
            raise PlainError(field, f"is {_shown(value)}, expected {_KIND[hint]}")
        least = minimum.get(field.rsplit(".", 1)[-1].split("[")[0], 0)
        if value < least:
            raise PlainError(field, f"is {value!r}, expected at least {least}")
        return
    if hint in (str, bool) and not isinstance(value, hint):
        raise PlainError(field, f"is {_shown(value)}, expected {_KIND[hint]}")


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _hint_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("NoneType", "None")


### Checksums of JSON data (plan files)


def canonical_json(value: Any) -> str:
    """The one spelling of JSON data that checksums are taken of (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def checksum(data: dict[str, Any], depth: int = 3) -> dict[str, Any]:
    """A checksum of ``data``: the sha256 of its canonical JSON (``"body"``), and a short
    digest of every value down to ``depth`` levels (``"fields"``, by path), so that a check
    can say which field was edited.

    Example:
      >>> from remat._core._plain import checksum, edited_fields
      >>> data = {"budget": 100, "scans": [{"saved": ["a"]}]}
      >>> stamp = checksum(data)
      >>> edited_fields({"budget": 100, "scans": [{"saved": ["b"]}]}, stamp)
      ['scans[0].saved']
    """
    fields: dict[str, str] = {}
    _digests(data, "", depth, fields)
    return {"body": _sha(canonical_json(data)), "fields": fields}


def edited_fields(data: dict[str, Any], stamp: Any) -> list[str]:
    """The fields of ``data`` that differ from what `checksum` recorded in ``stamp`` (the
    deepest differing paths), ``["checksum"]`` when only the checksum itself was edited, or
    ``[]`` when ``data`` is what was stamped."""
    if (
        isinstance(stamp, dict)
        and isinstance(stamp.get("fields"), dict)
        and stamp.get("body") == _sha(canonical_json(data))
    ):
        return []
    now: dict[str, str] = {}
    _digests(data, "", 3, now)
    recorded = stamp.get("fields") if isinstance(stamp, dict) else None
    if not isinstance(recorded, dict):
        return ["checksum"]
    changed = {p for p in set(now) | set(recorded) if now.get(p) != recorded.get(p)}
    both = {p for p in changed if p in now and p in recorded}
    # An added or removed field shows as a change of the value holding it.
    candidates = both or changed
    deepest = [
        p
        for p in sorted(candidates)
        if not any(q != p and q.startswith(p) and q[len(p)] in ".[" for q in candidates)
    ]
    return deepest or ["checksum"]


def _digests(value: Any, path: str, depth: int, out: dict[str, str]) -> None:
    if path:
        out[path] = _sha(canonical_json(value))[:16]
    if depth == 0:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _digests(v, f"{path}.{k}" if path else str(k), depth - 1, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _digests(v, f"{path}[{i}]", depth - 1, out)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
