"""`remat.load_plan`: reads a plan that `Plan.to_json` wrote, checks it is for this program, and
applies it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core._plain import from_plain
from .._core._schedule import decode_schedule
from .._measure._measurement import Measurement
from .._trace._roll_rewrite import roll_unscanned
from .._trace._tag import ScanChoice, rewrite
from ._options import SavedValue, ScanPlan
from ._result import PLAN_FORMAT, Plan, fingerprint

_CHANGED = (
    "`remat.load_plan` refuses the plan in {path}: it was made for a different program (its "
    "fingerprint {saved} is not {now}, the fingerprint of the function traced at these "
    "arguments). The model, its shapes or dtypes changed; run `remat.plan` again."
)
_BAD_FILE = "`remat.load_plan` cannot read {path}: {why}. Write it with `Plan.to_json(path)`."


def load_plan(path: str | os.PathLike, fn: Callable[..., Any], *args: Any) -> Plan:
    """Loads a plan written by `Plan.to_json` and applies it to ``fn``, without solving.

    Args:
      path: the JSON file.
      fn: the function the plan was made for.
      *args: its arguments (the same shapes and dtypes as when planning).

    Returns:
      The `remat.Plan`, with ``fn`` rewritten as the plan says.

    Raises:
      ValueError: if the file is not a plan, or ``fn`` traced at ``args`` is not the
        program the plan was made for (its fingerprint changed).

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
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {PLAN_FORMAT}")
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(_BAD_FILE.format(path=path, why=err)) from err
    if data.get("rolled", False):
        fn = roll_unscanned(fn)  # the plan's positions are those of the rolled scans
    now = fingerprint(fn, *args)
    if data["fingerprint"] != now:
        raise ValueError(_CHANGED.format(path=path, saved=data["fingerprint"], now=now))
    scans = tuple(
        ScanPlan(
            position=s["position"],
            source=s["source"],
            length=s["length"],
            schedule=decode_schedule(s["schedule"]),
            names=tuple(s["names"]),
            saved=tuple(from_plain(SavedValue, v) for v in s["saved"]),
            recompute_flops=float(s["recompute_flops"]),
            offloaded=tuple(s.get("offloaded", ())),
        )
        for s in data["scans"]
    )
    choices = {
        s.position: ScanChoice(names=s.names, schedule=s.schedule, offload=s.offloaded)
        for s in scans
    }
    argnums = data.get("argnums", 0)
    return Plan(
        fn=rewrite(fn, choices),
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
        rolled=bool(data.get("rolled", False)),
    )
