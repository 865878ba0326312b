"""`remat.load_plan`: reads a plan that `Plan.to_json` wrote, checks it is for this program, and
applies it."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from .._core._errors import brief
from .._core._plain import PlainError, check_plain, edited_fields, from_plain
from .._core._schedule import Binomial, Nested, Schedule
from .._measure._measurement import Measurement
from .._trace._eqx import has_modules, taking_modules, with_modules_split
from .._trace._roll_rewrite import roll_unscanned
from .._trace._tag import ScanChoice, rewrite
from ._options import SavedValue, ScanPlan
from ._result import PLAN_FORMAT, Plan, fingerprint

_CHANGED = (
    "`remat.load_plan` refuses the plan in {path}: it was made for a different program (its "
    "fingerprint {saved} is not {now}, the fingerprint of the function traced at these "
    "arguments). The model, its shapes or dtypes changed; run `remat.plan` again."
)
_OTHER_JAX = (
    "{where} refuses the plan in {source}: it was made with JAX {saved_jax}, and this is JAX "
    "{now_jax}, which traces the same function to a different program (fingerprint {saved} "
    "against {now}). A plan holds for the JAX that made it: plan again with this JAX "
    "(`remat.plan(loss, *args, budget=...)`, from `jax.ShapeDtypeStruct`s if the values are "
    "too large here), or use JAX {saved_jax}."
)
_BAD_FILE = "`remat.load_plan` cannot read {path}: {why}. Write it with `Plan.to_json(path)`."
_BAD_FIELD = (
    "`remat.load_plan` refuses the plan in {path}: {why}. A plan file is read as "
    "`Plan.to_json` wrote it; write it again with `Plan.to_json(path)` (or run `remat.plan`)."
)
_EDITED = (
    "`remat.load_plan` refuses the plan in {path}: {fields} changed after `Plan.to_json` "
    "wrote it (the file's checksum does not match). A plan is checked on the compiled "
    "program when it is made; an edited one is not. Run `remat.plan` again for another plan."
)
_NOT_CALLABLE = (
    "`remat.load_plan` got fn={got}, which is not callable; pass the function the plan was "
    "made for: `remat.load_plan(path, loss, *args)`."
)
_FORMATS = (1, PLAN_FORMAT)

# The plan's top-level fields as `to_dict` writes them (``fn`` is not written; ``scans``,
# ``schedule`` and ``measured`` have forms of their own, checked below).
_TOP = {
    "format": int,
    "fingerprint": str,
    "budget_bytes": int,
    "predicted_peak_bytes": int,
    "baseline_peak_bytes": int,
    "baseline_flops": float,
    "solve_seconds": float,
    "rounds": int,
    "scans": Any,
    "measured": Measurement | None,
}
_OPTIONAL = {
    "argnums": int | tuple[int, ...],
    "has_aux": bool,
    "rolled": bool,
    "scan_fingerprint": str,
    "scan_structure": str,
    "written": tuple[str, ...],
    "jax_version": str,
}
# Least values beyond "not negative", by field name.
_MINIMUM = {"budget_bytes": 1, "length": 1, "multiplicity": 1, "num_devices": 1}
_SCHEDULE_KINDS = ("per_step", "none")


def load_plan(
    path: str | os.PathLike, fn: Callable[..., Any], *args: Any, optimizer: Any = None
) -> Plan:
    """Loads a plan written by `Plan.to_json` and applies it to ``fn``, without solving.

    Args:
      path: the JSON file.
      fn: the function the plan was made for.
      *args: its arguments (the same shapes and dtypes as when planning).
      optimizer: the optax ``GradientTransformation`` the plan was made with, if any (it is
        not written to the file); `Plan.step` runs it.

    Returns:
      The `remat.Plan`, with ``fn`` rewritten as the plan says.

    The file must be what `Plan.to_json` wrote: a plan file (format 2) carries a checksum of
    its contents, and a file edited since (a save list, the scans, a schedule, the budget) is
    refused with the field that changed. Files of format 1 (written by remat 0.1.0) have no
    checksum; they still load, with every field checked for its type and range.

    Raises:
      ValueError: if the file cannot be read or is not a plan; if a field is missing, of the
        wrong type or out of range, or was edited after `Plan.to_json` wrote it (the message
        names the field and the file); or if ``fn`` traced at ``args`` is not the program
        the plan was made for (its fingerprint changed).

    Example:
      >>> import jax, jax.numpy as jnp, remat, tempfile, os
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
      ...     return (x**2).sum()
      >>> ws, x = jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8))
      >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
      >>> _ = remat.plan(loss, ws, x, budget=1.0).to_json(path)
      >>> p = remat.load_plan(path, loss, ws, x)
      >>> bool(jnp.allclose(p.fn(ws, x), loss(ws, x)))
      True
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    plan = read_plan(path, optimizer)
    user, split = fn, has_modules(args)
    fn, args = with_modules_split(fn, args)  # Equinox modules, as `remat.plan` split them
    if plan.rolled:
        fn = roll_unscanned(fn)  # the plan's positions are those of the rolled scans
    now = fingerprint(fn, *args)
    if plan.fingerprint != now:
        other = other_jax(plan, "`remat.load_plan`", path, plan.fingerprint, now)
        if other:
            raise ValueError(other)
        raise ValueError(_CHANGED.format(path=path, saved=plan.fingerprint, now=now))
    planned = rewrite(fn, scan_choices(plan))
    if split:  # called with the modules, as ``fn`` is
        planned = taking_modules(planned, user)
    return dataclasses.replace(plan, fn=planned)


def scan_choices(plan: Plan) -> dict[int, ScanChoice]:
    """What the plan asks of each scan, by position (see `remat._trace._tag.rewrite`)."""
    return {
        s.position: ScanChoice(
            names=s.names,
            schedule=s.schedule,
            offload=s.offloaded,
            pattern=s.pattern,
            kept_calls=s.kept_calls,
        )
        for s in plan.scans
    }


def read_plan(path: str | os.PathLike, optimizer: Any = None) -> Plan:
    """The plan in ``path``, checked as `load_plan` checks it, with ``fn`` None (not applied
    to any function yet: `remat.apply(fn, path)` applies it)."""
    data = _read(path)
    scans = tuple(
        ScanPlan(
            position=s["position"],
            source=s["source"],
            length=s["length"],
            schedule=_schedule(s["schedule"]),
            names=tuple(s["names"]),
            saved=tuple(from_plain(SavedValue, v) for v in s["saved"]),
            recompute_flops=float(s["recompute_flops"]),
            offloaded=tuple(s.get("offloaded", ())),
            pattern=tuple(tuple(names) for names in s.get("pattern", ())),
            kept_calls=bool(s.get("kept_calls", False)),
        )
        for s in data["scans"]
    )
    argnums = data.get("argnums", 0)
    return Plan(
        fn=None,
        scans=scans,
        budget_bytes=int(data["budget_bytes"]),
        predicted_peak_bytes=int(data["predicted_peak_bytes"]),
        measured=from_plain(Measurement, data["measured"]),
        baseline_peak_bytes=int(data["baseline_peak_bytes"]),
        baseline_flops=float(data["baseline_flops"]),
        solve_seconds=float(data["solve_seconds"]),
        rounds=int(data["rounds"]),
        fingerprint=data["fingerprint"],
        argnums=tuple(argnums) if isinstance(argnums, list) else argnums,
        has_aux=bool(data.get("has_aux", False)),
        optimizer=optimizer,
        rolled=bool(data.get("rolled", False)),
        scan_fingerprint=data.get("scan_fingerprint", ""),
        scan_structure=data.get("scan_structure", ""),
        written=tuple(data.get("written", ())),
        jax_version=data.get("jax_version", ""),
    )


def other_jax(plan: Plan, where: str, source: Any, saved: str, now: str) -> str:
    """The refusal of a plan whose fingerprint ``saved`` is not ``now`` because another JAX
    made it ("" when the JAX versions agree, or the plan does not say which made it)."""
    if not plan.jax_version or plan.jax_version == jax.__version__:
        return ""
    return _OTHER_JAX.format(
        where=where, source=source, saved_jax=plan.jax_version, now_jax=jax.__version__,
        saved=saved, now=now,
    )  # fmt: skip


def _read(path: str | os.PathLike) -> dict[str, Any]:
    """The file's data, once it is known to be a whole plan as `Plan.to_json` wrote it."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as err:
        raise ValueError(_BAD_FILE.format(path=path, why=err.strerror or err)) from None
    except UnicodeDecodeError as err:
        why = f"it is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})"
        raise ValueError(_BAD_FILE.format(path=path, why=why)) from None
    except ValueError as err:
        raise ValueError(_BAD_FILE.format(path=path, why=f"it is not JSON ({err})")) from None
    if not isinstance(data, dict):
        why = f"it holds a JSON {type(data).__name__}, not a plan"
        raise ValueError(_BAD_FILE.format(path=path, why=why))
    fmt = data.get("format")
    if isinstance(fmt, bool) or fmt not in _FORMATS:
        why = f"field 'format' is {fmt!r}, expected one of {_FORMATS}"
        raise ValueError(_BAD_FILE.format(path=path, why=why))
    try:
        _check_fields(data)
    except PlainError as err:
        raise ValueError(_BAD_FIELD.format(path=path, why=err)) from None
    if fmt >= 2:
        body = {k: v for k, v in data.items() if k != "checksum"}
        edited = edited_fields(body, data["checksum"])
        if edited:
            fields = ", ".join(f"field {f!r}" for f in edited)
            raise ValueError(_EDITED.format(path=path, fields=fields))
    return data


def _check_fields(data: dict[str, Any]) -> None:
    """Raises `PlainError` for the first field of a plan file of the wrong type or range."""
    known = {**_TOP, **_OPTIONAL}
    if data["format"] >= 2:
        known["checksum"] = Any
        if "checksum" not in data:
            raise PlainError("checksum", "is missing")
    for name in _TOP:
        if name not in data:
            raise PlainError(name, "is missing")
    for name, value in data.items():
        if name not in known:
            raise PlainError(name, "is not a field of a plan file")
        if name != "scans":
            check_plain(known[name], value, name, _MINIMUM)
    scans = data["scans"]
    # A plan that keeps the program as written (it fits unchanged) has no scans and took no
    # round; every other plan has at least one of each.
    as_written = data["format"] >= 2 and data["rounds"] == 0 and scans == []
    if data["rounds"] == 0 and not as_written:
        raise PlainError("rounds", "is 0, expected at least 1 for a plan with scans")
    if not as_written and (not isinstance(scans, list) or not scans):
        shown = "an empty list" if scans == [] else f"{scans!r:.40}"
        raise PlainError("scans", f"is {shown}, expected a list of at least one scan")
    for i, scan in enumerate(scans):
        if not isinstance(scan, dict) or "schedule" not in scan:
            raise PlainError(f"scans[{i}]", "is not a scan (an object with a 'schedule')")
        # The schedule has a JSON form of its own, checked by `_schedule`.
        check_plain(ScanPlan, {**scan, "schedule": "per_step"}, f"scans[{i}]", _MINIMUM)
        _schedule(scan["schedule"], f"scans[{i}].schedule")
        _check_pattern(scan, f"scans[{i}]")
        earlier = [s["position"] for s in scans[:i]]
        if scan["position"] in earlier:
            j = earlier.index(scan["position"])
            raise PlainError(f"scans[{i}].position", f"is {scan['position']}, as is scans[{j}]'s")
    if isinstance(data.get("argnums"), list) and not data["argnums"]:
        raise PlainError("argnums", "is an empty list, expected an int or a list of ints")


def _check_pattern(scan: dict[str, Any], field: str) -> None:
    """A per-layer scan's pattern: its period divides the length, ``per_step``, and its names
    are the scan's saved names."""
    pattern = scan.get("pattern") or []
    if not pattern:
        return
    if scan["schedule"] != "per_step" or scan["length"] % len(pattern):
        raise PlainError(
            f"{field}.pattern",
            f"has {len(pattern)} positions for a scan of {scan['length']} steps with schedule "
            f"{scan['schedule']!r}; a pattern is for a 'per_step' scan, its positions a "
            "divisor of the length",
        )
    if sorted({n for names in pattern for n in names}) != sorted(scan["names"]):
        raise PlainError(f"{field}.pattern", "saves other names than the scan's 'names'")


def _schedule(data: Any, field: str = "schedule") -> Schedule:
    """The schedule `encode_schedule` wrote as ``data``; a `PlainError` for anything else."""
    if isinstance(data, str) and data in _SCHEDULE_KINDS:
        return data
    shape_ok = isinstance(data, dict) and (
        set(data) == {"binomial"} or set(data) == {"nested", "lengths"}
    )
    if shape_ok:
        try:
            if "binomial" in data:
                return Binomial(data["binomial"])
            lengths = data["lengths"]
            lengths = tuple(lengths) if isinstance(lengths, list) else lengths
            return Nested(data["nested"], lengths)
        except ValueError as err:
            raise PlainError(field, f"is {data!r}: {str(err).split('; ')[0]}") from None
    raise PlainError(
        field,
        f"is {data!r}, expected one of {_SCHEDULE_KINDS}, {{'nested': levels, 'lengths': "
        "null or a list}} or {'binomial': snapshots}",
    )
