"""A compiler's refusal of a program that does not fit the device's memory.

A compiler that knows its device's memory refuses a program over it at compile time. XLA's TPU
compiler raises ``RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for
HLO temporaries (20.80G) exceeds available HBM (15.75G).`` (libtpu 0.0.42.1; ``G`` is GiB,
given to two decimals: 20.80G is 1.3 x 16 GiB of arguments). The CPU backend never refuses.
`refusal_of` reads such an error: how many bytes the program asked for and how many the
compiler gives a program, where the message states them.
"""

from __future__ import annotations

import dataclasses
import re

import jax

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"\(\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\s*\)"
# "... required for HLO temporaries (20.80G) exceeds available HBM (15.75G)"
_ASKED = re.compile(r"required[^()]*" + _SIZE + r"[^()]*exceeds available[^()]*" + _SIZE)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A compile refused for memory.

    Attributes:
      asked_bytes: the memory the program needs, as the compiler states it (to the
        precision it prints: 0.01 GiB on TPU), or None where the message does not say.
      available_bytes: the memory the compiler gives a program on that device (15.75 GiB of
        a v5e's 16 GiB), or None where the message does not say.
      message: the compiler's first line.

    Example:
      >>> from remat._measure._refusal import Refusal
      >>> Refusal(2**30, 2**29, "RESOURCE_EXHAUSTED: ...").over_bytes
      536870912
    """

    asked_bytes: int | None
    available_bytes: int | None
    message: str

    @property
    def over_bytes(self) -> int | None:
        """How far over the device's memory the program is, where both are stated."""
        if self.asked_bytes is None or self.available_bytes is None:
            return None
        return self.asked_bytes - self.available_bytes


def refusal_of(err: BaseException) -> Refusal | None:
    """The `Refusal` an exception from a compile reports, or None when it is anything else
    (a compile that failed for another reason is not a refusal for memory).

    Example:
      >>> import jax
      >>> from remat._measure._refusal import refusal_of
      >>> err = jax.errors.JaxRuntimeError(
      ...     "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
      ...     "HLO temporaries (20.80G) exceeds available HBM (15.75G).")
      >>> r = refusal_of(err)
      >>> round(r.asked_bytes / 2**30, 2), round(r.available_bytes / 2**30, 2)
      (20.8, 15.75)
      >>> refusal_of(ValueError("RESOURCE_EXHAUSTED: memory")) is None  # not the compiler's
      True
    """
    if not isinstance(err, jax.errors.JaxRuntimeError):
        return None
    text = str(err).strip()
    if not text.startswith("RESOURCE_EXHAUSTED") or "memory" not in text.lower():
        return None
    first = text.splitlines()[0]
    m = _ASKED.search(first)
    if m is None:
        return Refusal(None, None, first)
    return Refusal(_bytes(m[1], m[2]), _bytes(m[3], m[4]), first)


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit.upper()])


def refusal_message(asked: int, available: int) -> str:
    """The TPU compiler's wording of a refusal, for ``asked`` and ``available`` bytes, in KiB
    to two decimals (tests use it to stand in for the TPU compiler on CPU).

    Example:
      >>> from remat._measure._refusal import refusal_message
      >>> refusal_message(3 * 2**20, 2**20)[:50]
      'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the '
    """
    return (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        f"temporaries ({asked / 2**10:.2f}K) exceeds available HBM ({available / 2**10:.2f}K)."
    )
