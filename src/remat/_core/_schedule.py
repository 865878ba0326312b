"""Scan schedules: how a `lax.scan` keeps what its backward pass needs.

A schedule is frozen, hashable configuration; `remat.scan` (see `_scan.py`) runs it.

- ``"none"``: a plain `lax.scan`; every step's residuals are kept.
- ``"per_step"``: every step's body is checkpointed with a policy; the carry of every
  step is still kept, so memory is O(N) carries.
- `Nested`: multi-level nested checkpointed scans, memory about O(levels * N**(1/levels)).
- `Binomial`: offline binomial checkpointing (Griewank 1992, "Achieving logarithmic growth of
  temporal and spatial complexity in reverse automatic differentiation"; Griewank & Walther
  2000, "Algorithm 799: Revolve"), at most ``snapshots`` stored carries, the fewest
  recomputations for that many.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SCHEDULE_NAMES = ("none", "per_step")

_BAD_SCHEDULE = (
    "`{where}` got schedule={got!r}; expected one of {names}, `remat.Nested(levels=...)` or "
    "`remat.Binomial(snapshots=...)`."
)
_BAD_LENGTHS = (
    "`remat.Nested` got lengths={got!r} for levels={levels}; expected a tuple of one "
    "positive int per level (block lengths, outermost first), e.g. "
    "`remat.Nested(levels=2, lengths=(4, 8))`, or lengths=None to choose them automatically."
)


@dataclasses.dataclass(frozen=True)
class Nested:
    """Multi-level nested checkpointed scans.

    Args:
      levels: number of nesting levels (``>= 1``; 1 is the same as ``"per_step"``).
      lengths: optional explicit block lengths, outermost first, one per level; their
        product must be at least the scan length. ``None`` picks them to minimise memory.

    Example:
      >>> import remat
      >>> remat.Nested(levels=2)
      Nested(levels=2, lengths=None)
    """

    levels: int = 2
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.levels, int) or isinstance(self.levels, bool) or self.levels < 1:
            raise ValueError(
                f"`remat.Nested` got levels={self.levels!r}; expected an int >= 1, e.g. "
                "`remat.Nested(levels=2)`."
            )
        if self.lengths is not None:
            lengths = self.lengths
            if isinstance(lengths, list | tuple):
                lengths = tuple(lengths)
            if (
                not isinstance(lengths, tuple)
                or len(lengths) != self.levels
                or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths)
            ):
                raise ValueError(_BAD_LENGTHS.format(got=self.lengths, levels=self.levels))
            object.__setattr__(self, "lengths", lengths)


@dataclasses.dataclass(frozen=True)
class Binomial:
    """Offline binomial (Revolve) checkpointing for a scan of known length.

    Args:
      snapshots: number of carries stored besides the initial one (``>= 1``).

    Example:
      >>> import remat
      >>> remat.Binomial(4)
      Binomial(snapshots=4)
    """

    snapshots: int

    def __post_init__(self):
        if (
            not isinstance(self.snapshots, int)
            or isinstance(self.snapshots, bool)
            or self.snapshots < 1
        ):
            raise ValueError(
                f"`remat.Binomial` got snapshots={self.snapshots!r}; expected an int >= 1 "
                "(the number of carries stored besides the initial one), e.g. "
                "`remat.Binomial(8)`."
            )


Schedule = str | Nested | Binomial


def check_schedule(schedule: object, where: str = "remat.scan") -> Schedule:
    """Validates a schedule and returns it; raises a ValueError that names ``where``."""
    if isinstance(schedule, Nested | Binomial):
        return schedule
    if isinstance(schedule, str) and schedule in SCHEDULE_NAMES:
        return schedule
    raise ValueError(_BAD_SCHEDULE.format(where=where, got=schedule, names=SCHEDULE_NAMES))


### JSON form (plan files)


def encode_schedule(schedule: Schedule) -> Any:
    """A schedule as JSON data (`decode_schedule` reads it back)."""
    if isinstance(schedule, Binomial):
        return {"binomial": schedule.snapshots}
    if isinstance(schedule, Nested):
        return {"nested": schedule.levels, "lengths": schedule.lengths}
    return schedule


def decode_schedule(data: Any) -> Schedule:
    """The schedule that `encode_schedule` wrote as ``data``.

    Example:
      >>> from remat._core._schedule import Nested, decode_schedule, encode_schedule
      >>> decode_schedule(encode_schedule(Nested(2)))
      Nested(levels=2, lengths=None)
    """
    if isinstance(data, dict) and "binomial" in data:
        return Binomial(int(data["binomial"]))
    if isinstance(data, dict) and "nested" in data:
        lengths = data.get("lengths")
        return Nested(int(data["nested"]), None if lengths is None else tuple(lengths))
    return data
