"""Memory budgets: bytes, a size with a unit, or a fraction of the un-checkpointed peak.

The one parser of budgets: `read_budget` reads the form, `Budget.to_bytes` gives bytes.
"""

from __future__ import annotations

import dataclasses
import math
import re

# Binary and decimal units; a bare "K"/"M"/"G" is read as binary, as `nvidia-smi` and XLA print.
MIB = 2.0**20  # bytes in a MiB, for tables and plots

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")

_BAD_BUDGET = (
    "`remat.plan` got budget={got!r}, which is not a memory budget. Pass bytes as an int "
    "(e.g. 6_000_000_000), a size with a unit ('6GiB', '512MiB', '1.5GB'), or a fraction of "
    "the un-checkpointed peak as a float in (0, 1] or a percentage ('50%')."
)
_NOT_POSITIVE = (
    "`remat.plan` got budget={got!r}, which is {why}; a budget must be a positive amount of "
    "memory, e.g. budget='50%' or budget='2GiB'."
)
_TOO_LARGE = (
    "`remat.plan` got budget={got!r}, which is too large to be a number of bytes. Pass bytes "
    "as an int (e.g. 6_000_000_000), a size with a unit ('6GiB'), or a fraction ('50%')."
)
_TINY_FRACTION = (
    "`remat.plan` got budget={got!r}, a fraction of {fraction:.3g} of the un-checkpointed peak; "
    "no checkpointing comes near that (the parameters and gradients alone stay). A budget is "
    "a fraction in [{least}, 1] (e.g. 0.5 or '50%') or a size with a unit (e.g. '2GiB')."
)
_TINY_BYTES = (
    "`remat.plan` got budget={got!r}, which is {bytes} bytes; no gradient step fits in less "
    "than {least} bytes. Did you mean a size with a unit ('{n}GiB', '{n}MiB') or a percentage "
    "('{n}%')? Bytes are an int, e.g. budget=6_000_000_000."
)
# Below these a budget is a mistaken unit (1e-9 for 1 GB, 5 for '5GiB', 50 for '50%').
_LEAST_FRACTION = 1e-3
_LEAST_BYTES = 2**10

_OVER_DEVICE = (
    "`remat.plan` got budget={got!r} = {bytes} bytes, more than the device's memory "
    "({device} bytes); no plan can use more memory than the device has. Pass a budget of at "
    "most {device} bytes, or a fraction such as budget='90%'."
)


def _bytes_example(budget: float) -> str:
    """The float as bytes when it reads as bytes (6e9), else a size that does."""
    return f"{int(budget):_}" if budget >= 2**20 else "6_000_000_000"


def device_memory_bytes(device=None) -> int | None:
    """The memory the backend says ``device`` may use (``memory_stats()['bytes_limit']``).

    None where the backend does not say (the CPU backend reports no memory stats).

    Example:
      >>> import jax
      >>> from remat._core._budget import device_memory_bytes
      >>> limit = device_memory_bytes(jax.devices()[0])
      >>> limit is None or limit > 0
      True
    """
    import jax

    device = device if device is not None else jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


def format_bytes(n: float) -> str:
    """Formats a byte count with a binary unit, e.g. ``'1.50 MiB'``.

    Example:
      >>> from remat._core._budget import format_bytes
      >>> format_bytes(3 * 2**19)
      '1.50 MiB'
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclasses.dataclass(frozen=True)
class Budget:
    """A memory budget as read from the user: bytes, or a fraction of the un-checkpointed peak.

    `read_budget` makes one (checking its form before anything is compiled); `to_bytes` turns
    it into bytes once the un-checkpointed peak is measured.

    Attributes:
      spec: the budget as given (``6_000_000``, ``"512MiB"``, ``0.5``, ``"50%"``), for messages.
      bytes: the budget in bytes, for an absolute budget.
      fraction: the fraction of the un-checkpointed peak, for a relative budget.
    """

    spec: int | float | str
    bytes: int | None = None
    fraction: float | None = None

    def to_bytes(self, baseline_peak: int | None = None, device_memory: int | None = None) -> int:
        """The budget in bytes, given the un-checkpointed peak (needed for a fraction) and the
        device's memory (a budget above it is an error), as `parse_budget` documents."""
        if self.fraction is None:
            value = self.bytes
        elif baseline_peak is None:
            raise ValueError(
                f"`remat.plan` got the fractional budget {self.spec!r} but no un-checkpointed "
                "peak to take it of; pass `baseline_peak`, or give the budget in bytes."
            )
        else:
            value = int(self.fraction * baseline_peak)
        if value <= 0:
            raise ValueError(_NOT_POSITIVE.format(got=self.spec, why="zero or negative"))
        if device_memory is not None and value > device_memory:
            raise ValueError(_OVER_DEVICE.format(got=self.spec, bytes=value, device=device_memory))
        return value


def read_budget(budget: int | float | str, sensible: bool = False) -> Budget:
    """Reads a memory budget's form (see `parse_budget`), without turning a fraction into bytes.

    A string without a unit reads as the number it spells: ``"0.5"`` is half the peak, like
    ``0.5``; ``"4096"`` is bytes. With ``sensible`` (what `remat.plan` reads from a user), a
    budget that can only be a mistaken unit is refused too: under 1 KiB (``5`` for ``"5GiB"``,
    ``50`` for ``"50%"``) or a fraction under 0.001 (``1e-9``).

    Raises:
      ValueError: for a budget that is not a number or a size, or is zero or negative.

    Example:
      >>> from remat._core._budget import read_budget
      >>> read_budget("50%")
      Budget(spec='50%', bytes=None, fraction=0.5)
      >>> read_budget("1KiB").to_bytes()
      1024
    """
    if isinstance(budget, bool) or not isinstance(budget, int | float | str):
        raise ValueError(_BAD_BUDGET.format(got=budget))
    if isinstance(budget, str) and _SIZE.match(budget) and not _SIZE.match(budget).group(2):
        number = float(budget)  # a unitless string reads as the number it spells
        if not math.isfinite(number):
            raise ValueError(_TOO_LARGE.format(got=budget))
        if 0 < number <= 1 and not number.is_integer():
            return _fraction(budget, number, sensible)
    if isinstance(budget, int):
        value = budget
    elif isinstance(budget, float):
        if not math.isfinite(budget):
            raise ValueError(_BAD_BUDGET.format(got=budget))
        if budget > 1.0:
            raise ValueError(
                f"`remat.plan` got budget={budget!r}; a float budget is a fraction of the "
                "un-checkpointed peak and must be in (0, 1], e.g. budget=0.5 for half of it. "
                f"For bytes pass an int, e.g. budget={_bytes_example(budget)}."
            )
        return _fraction(budget, budget, sensible)
    else:
        percent = _PERCENT.match(budget)
        size = _SIZE.match(budget)
        if percent:
            fraction = float(percent.group(1)) / 100.0
            if fraction > 1.0:
                raise ValueError(
                    f"`remat.plan` got budget={budget!r}, more than 100% of the "
                    "un-checkpointed peak; checkpointing only lowers memory. Pass at most "
                    "'100%' (or no budget to keep the program as it is)."
                )
            return _fraction(budget, fraction, sensible)
        if not (size and size.group(2).lower() in _UNITS):
            raise ValueError(_BAD_BUDGET.format(got=budget))
        value = float(size.group(1)) * _UNITS[size.group(2).lower()]
        if not math.isfinite(value):
            raise ValueError(_TOO_LARGE.format(got=budget))
    if value <= 0:
        raise ValueError(_NOT_POSITIVE.format(got=budget, why="zero or negative"))
    if sensible and value < _LEAST_BYTES:
        n = f"{value:g}"
        raise ValueError(_TINY_BYTES.format(got=budget, bytes=int(value), least=_LEAST_BYTES, n=n))
    return Budget(spec=budget, bytes=int(value))


def _fraction(budget: float | str, fraction: float, sensible: bool) -> Budget:
    if fraction <= 0:
        raise ValueError(_NOT_POSITIVE.format(got=budget, why="not above zero"))
    if sensible and fraction < _LEAST_FRACTION:
        raise ValueError(
            _TINY_FRACTION.format(got=budget, fraction=fraction, least=_LEAST_FRACTION)
        )
    return Budget(spec=budget, fraction=fraction)


def parse_budget(
    budget: int | float | str,
    baseline_peak: int | None = None,
    device_memory: int | None = None,
) -> int:
    """Turns a memory budget into bytes.

    Args:
      budget: bytes (``int``), a size with a unit (``"6GiB"``, ``"512MiB"``, ``"1.5GB"``), a
        fraction of the un-checkpointed peak (a ``float`` in ``(0, 1]``, e.g. ``0.5``), or a
        percentage (``"50%"``).
      baseline_peak: the un-checkpointed peak in bytes; needed for fractions and percentages.
      device_memory: the device's memory in bytes, if known; a budget above it is an error.

    Returns:
      The budget in bytes, a positive ``int``.

    Raises:
      ValueError: for a budget that is not a number or a size, zero or negative, a fraction
        without ``baseline_peak``, or more than ``device_memory``.

    Example:
      >>> from remat._core._budget import parse_budget
      >>> parse_budget("512MiB")
      536870912
      >>> parse_budget("50%", baseline_peak=1000)
      500
      >>> parse_budget(0.25, baseline_peak=1000)
      250
    """
    return read_budget(budget).to_bytes(baseline_peak, device_memory)
