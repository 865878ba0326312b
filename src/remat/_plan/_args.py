"""Checks of `remat.plan`'s and `plan_budgets`' keyword arguments, before anything is traced.

Each error names the public function, the argument as the user gave it, and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._core._budget import Budget, read_budget
from .._core._errors import renamed
from .._core._strategy import PLANNABLE_NAMES, split_names

_NOT_BOOL = (
    "`{where}` got {name}={got!r}; pass True or False ({name} is a switch, and a "
    "{kind} is not read as one)."
)
_BAD_DEVICE_MEMORY = (
    "`{where}` got device_memory={got!r}; pass the device's memory as an int number of bytes "
    "(e.g. device_memory=16 * 2**30 for 16 GiB), or None to read it from the backend."
)
_TINY_DEVICE_MEMORY = (
    "`{where}` got device_memory={got!r}, which is {got} bytes; no accelerator has less than "
    "1 MiB. device_memory is in bytes: for {got} GiB pass device_memory={got} * 2**30."
)
_BAD_BANDWIDTH = (
    "`{where}` got host_bandwidth={got!r}; pass the device-to-host bandwidth as a positive "
    "number of bytes per second, e.g. host_bandwidth=25e9 (PCIe 4.0)."
)
_TINY_BANDWIDTH = (
    "`{where}` got host_bandwidth={got!r}, which is {got} bytes per second; host_bandwidth "
    "is in bytes per second: for {got} GB/s pass host_bandwidth={got}e9."
)
_BAD_BUDGETS = (
    "`remat.plan_budgets` got budgets={got!r}; pass a list of budgets, each as `remat.plan` "
    "takes it, e.g. budgets=['75%', '50%', '2GiB']."
)
_BAD_STRATEGIES = (
    "`{where}` got strategies={got!r}; pass a list of strategies to compile beside the "
    "plan, each 'full', 'dots', 'everything' or 'names:a,b' (values the program names with "
    "`checkpoint_name`), e.g. strategies=['names:query_proj,key_proj,value_proj']."
)


def check_strategies(value: Any, where: str = "remat.plan") -> tuple[str, ...]:
    """``value`` as a tuple of strategy strings (see `_BAD_STRATEGIES`); else a ValueError."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(_BAD_STRATEGIES.format(where=where, got=value))
    for s in value:
        if s in PLANNABLE_NAMES:
            continue
        if not (isinstance(s, str) and s.startswith("names:")):
            raise ValueError(_BAD_STRATEGIES.format(where=where, got=value))
        try:
            split_names(s, where)
        except ValueError:
            raise ValueError(_BAD_STRATEGIES.format(where=where, got=value)) from None
    return tuple(value)


def check_bool(value: Any, name: str, where: str = "remat.plan") -> bool:
    """``value`` if it is a bool; else a ValueError naming ``where`` and ``name``."""
    if not isinstance(value, bool):
        raise ValueError(_NOT_BOOL.format(where=where, name=name, got=value, kind=_kind(value)))
    return value


def check_device_memory(value: Any, where: str = "remat.plan") -> int | None:
    """``value`` (bytes, an int of at least 1 MiB) or None; else a ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(_BAD_DEVICE_MEMORY.format(where=where, got=value))
    if value < 2**20:
        raise ValueError(_TINY_DEVICE_MEMORY.format(where=where, got=value))
    return value


def check_host_bandwidth(value: Any, where: str = "remat.plan") -> float:
    """``value`` (bytes per second, positive and finite) as a float; else a ValueError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(_BAD_BANDWIDTH.format(where=where, got=value))
    if value < 1e6:
        raise ValueError(_TINY_BANDWIDTH.format(where=where, got=value))
    return float(value)


def check_max_rounds(value: Any, where: str = "remat.plan") -> int:
    """``value`` if it is an int >= 1; else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{where}` got max_rounds={value!r}; pass an int >= 1.")
    return value


def read_budgets(budgets: Any) -> list[Budget]:
    """Every budget of `remat.plan_budgets`, read before anything is compiled."""
    if isinstance(budgets, str | bytes) or not isinstance(budgets, Sequence) or not budgets:
        raise ValueError(_BAD_BUDGETS.format(got=budgets))
    out = []
    for budget in budgets:
        try:
            out.append(read_budget(budget, sensible=True))
        except ValueError as err:
            raise renamed(err, "`remat.plan`", "`remat.plan_budgets`")  # noqa: B904 (`renamed` chains)
    return out


def read_saved(value: Any, where: str = "remat.plan") -> Budget | None:
    """The cap on saved bytes (``saved=``) read as a budget (bytes, a size, or a fraction of
    what the un-checkpointed step saves), or None; else a ValueError naming ``saved=``."""
    if value is None:
        return None
    try:
        return read_budget(value, sensible=True)
    except ValueError:
        raise ValueError(
            f"`{where}` got saved={value!r}; pass the most bytes the step may save for its "
            'backward pass: bytes (an int), a size ("40MiB"), or a fraction of what the '
            'un-checkpointed step saves ("25%" or 0.25); or None for no cap.'
        ) from None


def _kind(value: Any) -> str:
    return "string" if isinstance(value, str) else type(value).__name__
