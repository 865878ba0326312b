"""Calibrating a sharded program on its scans compiled alone, placed as in the step.

A program over a mesh is calibrated as a one-device program is (`_calibrate.scan_fit`): each
scan compiled alone at three save sets and as written, its phases read, every candidate
checked alone before the step is compiled. A scan-alone program sees the step's shardings
only through its inputs, so they are placed where XLA puts the scan's inputs in the step
(`remat._shard._scan_shardings`). Those are read from the un-checkpointed step's forward loop
(`remat._measure._loop_state`), compiled first: where XLA's partitioner splits them otherwise
than `remat._shard._shard_counts` estimates (e.g. an activation's model dimension split
instead of its batch), the read splits replace the estimate, for the cost model's per-device
bytes too. Where the step is not read (the compiler refused it, or it has several scans), the
estimate places them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._measure._loop_state import loop_splits
from .._measure._phases import loop_phases
from .._shard._scan_shardings import ScanPlacement, scan_placement
from .._shard._sharding import mesh_of


def placeable(args: Sequence[Any]) -> bool:
    """Whether the arguments name a mesh (a `jax.sharding.NamedSharding`) the scan-alone
    programs can be placed on; a program whose shardings a `jax.jit` declares has none."""
    return mesh_of(args) is not None


def step_reader(infos: Sequence[Any], splits: dict[int, list[Any]], phases: bool):
    """What to read from the un-checkpointed step's dump: ``(phases, splits)``, the step's
    `LoopPhases` (with ``phases``, else None) and per scan the splits of its inputs in the
    step (`remat._measure._loop_state.loop_splits`; ``splits``: the estimated ones)."""

    def read(dump: Any) -> tuple[Any, list[Any]]:
        read = [loop_splits(dump, i, splits.get(i.position)) for i in infos]
        return (loop_phases(dump) if phases else None), read

    return read


def read_splits(splits: dict[int, list[Any]], infos: Sequence[Any], read: Sequence[Any]):
    """``splits`` with each input's split read from the step in place of the estimate."""
    out = dict(splits)
    for info, got in zip(infos, read, strict=True):
        if got is not None:
            own = splits[info.position]
            out[info.position] = [g if g is not None else s for g, s in zip(got, own, strict=True)]
    return out


def placement(infos: Sequence[Any], splits: dict[int, list[Any]], args: Any) -> ScanPlacement:
    """Where each scan-alone program's inputs go (see the module docstring)."""
    return scan_placement(infos, splits, mesh_of(args))
