"""Where a scan's values live inside a sharded step: shardings for the scan compiled alone.

The planner calibrates its memory model on each scan compiled alone (`remat._plan._body`).
On one device the scan-alone program's memory is the scan's share of the step's. On a mesh
it is only where its inputs are split as XLA splits them inside the step: a scan alone with
its inputs whole holds every value whole. `scan_placement` gives each scan's body inputs and
outputs a `jax.sharding.NamedSharding` on the step's mesh from per-dimension splits (read
from the compiled step, else estimated: see `remat._plan._sharded`): each split dimension is
given the mesh axes whose sizes multiply to its split (the first such in the mesh's order,
each axis used once per value); the outputs' splits propagate through the body
(`remat._shard._shard_counts`). XLA then propagates the inputs' shardings into the
scan-alone program's body as it does in the step.

Example:
  >>> import jax
  >>> from remat._shard._scan_shardings import spec_for
  >>> mesh = jax.sharding.AbstractMesh((4, 2), ("fsdp", "tensor"))
  >>> spec_for((4, 1, 2), mesh), spec_for((8, 1), mesh), spec_for((1, 3), mesh)
  (P('fsdp', None, 'tensor'), P(('fsdp', 'tensor'), None), P(None, None))
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class ScanShardings:
    """The shardings of one scan's body values on the step's mesh.

    Attributes:
      inputs: one per body input (``consts + carry + xs``, the per-step slices of ``xs``).
      outputs: one per body output (``carry + ys``, one step's ``ys``).
    """

    inputs: tuple[NamedSharding, ...]
    outputs: tuple[NamedSharding, ...]


@dataclasses.dataclass(frozen=True)
class ScanPlacement:
    """Each scan's `ScanShardings` by its `remat.list_scans` position, on ``mesh``."""

    mesh: Any
    scans: tuple[tuple[int, ScanShardings], ...]

    def of(self, position: int) -> ScanShardings | None:
        return dict(self.scans).get(position)


def spec_for(splits: Sequence[int], mesh: Any) -> P:
    """A `PartitionSpec` cutting each dimension into its ``splits`` over ``mesh``'s axes: a
    split is given the fewest unused axes whose sizes multiply to it, the first in the mesh's
    order; a split no such axes give is left whole."""
    free = [(name, int(size)) for name, size in mesh.shape.items()]
    spec: list[Any] = []
    for split in splits:
        axes = _axes_for(int(split), free) if split > 1 else None
        if not axes:
            spec.append(None)
            continue
        free = [a for a in free if a[0] not in axes]
        spec.append(axes[0] if len(axes) == 1 else tuple(axes))
    return P(*spec)


def _axes_for(split: int, free: list[tuple[str, int]]) -> tuple[str, ...] | None:
    for k in range(1, len(free) + 1):
        for combo in itertools.combinations(free, k):
            product = 1
            for _, size in combo:
                product *= size
            if product == split:
                return tuple(name for name, _ in combo)
    return None


def scan_placement(infos: Sequence[Any], splits: dict[int, Any], mesh: Any) -> ScanPlacement:
    """Each scan's `ScanShardings` on ``mesh``: its body's inputs split as ``splits`` says (per
    scan position, one per-dimension split per body input, as
    `remat._shard._shard_counts.scan_input_splits` gives them), its outputs as the splits
    propagate through the body (`remat._shard._shard_counts`)."""
    from ._shard_counts import _Env, _run

    def place(splits_: Sequence[int]) -> NamedSharding:
        return NamedSharding(mesh, spec_for(splits_, mesh))

    scans = []
    for info in infos:
        ins = list(splits[info.position])
        outs = _run(info.jaxpr, ins, _Env())
        scans.append((info.position, ScanShardings(
            inputs=tuple(place(s) for s in ins), outputs=tuple(place(s) for s in outs),
        )))  # fmt: skip
    return ScanPlacement(mesh, tuple(scans))


def stacked(sharding: NamedSharding) -> NamedSharding:
    """``sharding`` of one step's value, for the value stacked over the steps (leading axis
    whole)."""
    return NamedSharding(sharding.mesh, P(None, *sharding.spec))


def on_mesh(spec: jax.ShapeDtypeStruct, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    """``spec`` placed with ``sharding`` (its spec padded to the value's rank)."""
    padded = P(*sharding.spec, *([None] * (len(spec.shape) - len(sharding.spec))))
    return jax.ShapeDtypeStruct(
        spec.shape, spec.dtype, sharding=NamedSharding(sharding.mesh, padded)
    )
