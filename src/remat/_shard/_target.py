"""Compile targets: a TPU slice named in a few characters, compiled for from this machine.

XLA's TPU compiler runs without a TPU: with libtpu installed (``pip install 'remat[tpu]'``),
`jax.experimental.topologies.get_topology_desc` describes the devices of any TPU slice, and
a program whose arguments are `jax.ShapeDtypeStruct` s sharded over those devices lowers and
compiles for them (``jax.jit(f).lower(*shapes).compile()``), with the TPU compiler's own
memory analysis and optimised HLO. Nothing runs; this is how MaxText's ``train_compile.py``
checks a configuration for out-of-memory before launching it.

A `Target` names such a slice (``"tpu:v5e:2x2"``, or the Cloud TPU name ``"tpu:v5e-16"``;
`parse_target` reads both) and `Target.place` puts a program's arguments on it: every
argument becomes a `jax.ShapeDtypeStruct` sharded over one mesh axis, ``"fsdp"``, that spans
all the slice's chips, as fully sharded data parallelism does (see `Target.place`).

Several processes may compile for TPU at once here: libtpu's single-process lock file (meant
for a machine with TPU chips) is skipped (``ALLOW_MULTIPLE_LIBTPU_LOAD=1``) when the first
target is built, since a deviceless compile claims no chip.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

# High-bandwidth memory per chip, as Google's Cloud TPU pages list it (GiB). A budget of
# "the chip's memory" is this; the compiler itself keeps a little of it back (15.75 GiB of a
# v5e's 16 are usable by a program, as its out-of-memory error says).
HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
# The HBM the TPU compiler gives one program per chip, as its out-of-memory refusal states it
# ("exceeds available HBM (15.75G)"; libtpu 0.0.42.1, deviceless, `chip_config_name`
# "default"), GiB to two decimals. A v4's 32 GiB are shared by its two TensorCores: the
# default chip config compiles for one of them.
USABLE_HBM_GIB = {"v4": 15.25, "v5e": 15.75, "v5p": 95.74, "v6e": 31.25}
# Peak bf16 matmul FLOP/s per chip (TFLOP/s), as Google's Cloud TPU system architecture
# pages list them (v4: 275, v5e: 197, v5p: 459, v6e (Trillium): 918). The planner prices
# recomputation at this rate on a target, so an offloaded value is weighed against the
# fastest the chip could recompute it.
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0}
# Bytes per second between one chip and its host, each way (PCIe). Google does not list it
# per chip; "How to Scale Your Model" (jax-ml.github.io/scaling-book, "How to Think About
# TPUs") works its examples with 1.5e10 for a v6e's PCIe link, and gives 16-32 GB/s for the
# host link of current TPUs. 1.5e10 is used for every generation: an estimate, on the side
# of slower transfers (pass ``host_bandwidth=`` to `remat.plan` with your own measurement).
HOST_LINK_BYTES_PER_SECOND = 1.5e10
# `jax.Device.device_kind` of each chip's devices.
_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v6 lite": "v6e"}
# TensorCores per chip: a Cloud TPU name ``v5p-8`` counts cores, ``v5e-16`` chips.
_CORES_PER_CHIP = {"v4": 2, "v5e": 1, "v5p": 2, "v6e": 1}
# The chips of one host in the slices Cloud TPU sells (x, y, z); a deviceless compile only
# uses it to number processes.
_HOST_BOUNDS = (2, 2, 1)
MESH_AXIS = "fsdp"

_GRAMMAR = (
    "a TPU slice is named 'tpu:CHIP:TOPOLOGY' (e.g. 'tpu:v5e:2x2', 'tpu:v5p:2x2x2') or "
    "'tpu:CHIP-N' as Cloud TPU names it (e.g. 'tpu:v5e-16', 'tpu:v5p-8'), with CHIP one of "
    "{chips}"
)
_BAD_NAME = "`{where}` got target={got!r}, which is not a compile target: " + _GRAMMAR + "."
_BAD_TYPE = (
    "`{where}` got target={got!r} (a {kind}); pass a `remat.Target` or its name, e.g. "
    "target='tpu:v5e:2x2'."
)
_NO_LIBTPU = (
    "`{where}` got target={got!r}, which compiles with XLA's TPU compiler, but libtpu is not "
    "installed in this Python environment ({python}). Install it with `pip install "
    "'remat[tpu]'` (jax[tpu]: the libtpu wheel, about 700 MB from PyPI); no TPU is needed to "
    "compile for one."
)
_TOPOLOGY_FAILED = (
    "`{where}` got target={got!r}, but the TPU compiler refused that slice: {error}. " + _GRAMMAR
)
_RUN_ON_TARGET = (
    "`{where}` got target={got!r} with repeats={repeats}; a target is compiled for, never run "
    "here. Pass repeats=0 (the default with a target)."
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A TPU slice to compile for from this machine (see the module docstring).

    Attributes:
      chip: ``"v4"``, ``"v5e"``, ``"v5p"`` or ``"v6e"``.
      topology: the chips along each axis, e.g. ``(2, 2)`` for a v5e-4 or ``(2, 2, 2)`` for
        a v5p-16.
      num_slices: slices joined over the data-centre network (multislice).

    Example:
      >>> from remat._shard._target import Target, parse_target
      >>> t = parse_target("tpu:v5e-16")
      >>> t, t.name, t.num_chips, t.hbm_bytes // 2**30
      (Target(chip='v5e', topology=(4, 4), num_slices=1), 'tpu:v5e:4x4', 16, 16)
    """

    chip: str
    topology: tuple[int, ...]
    num_slices: int = 1

    def __post_init__(self) -> None:
        if self.chip not in HBM_GIB:
            raise ValueError(_BAD_NAME.format(where="remat.Target", got=self.chip, chips=_chips()))
        object.__setattr__(self, "topology", tuple(int(d) for d in self.topology))
        if not self.topology or any(d < 1 for d in self.topology) or self.num_slices < 1:
            raise ValueError(
                f"`remat.Target` got topology={self.topology!r}, num_slices={self.num_slices!r}; "
                "both are positive: chips along each axis, e.g. (2, 2), and slices (default 1)."
            )

    @property
    def name(self) -> str:
        """The name `parse_target` reads back, e.g. ``'tpu:v5e:2x2'``."""
        shape = "x".join(str(d) for d in self.topology)
        slices = f":{self.num_slices}slices" if self.num_slices > 1 else ""
        return f"tpu:{self.chip}:{shape}{slices}"

    @property
    def num_chips(self) -> int:
        """Chips in all slices."""
        return int(np.prod(self.topology)) * self.num_slices

    @property
    def hbm_bytes(self) -> int:
        """One chip's high-bandwidth memory, in bytes (`HBM_GIB`): a budget that fills a chip."""
        return HBM_GIB[self.chip] * 2**30

    @property
    def usable_bytes(self) -> int:
        """The HBM the TPU compiler gives one program on a chip (`USABLE_HBM_GIB`): it
        refuses a program above it."""
        return int(USABLE_HBM_GIB[self.chip] * 2**30)

    @property
    def flops_per_second(self) -> float:
        """One chip's peak bf16 matmul rate (`PEAK_TFLOPS`), FLOP/s."""
        return PEAK_TFLOPS[self.chip] * 1e12

    @property
    def host_bandwidth(self) -> float:
        """Bytes per second between one chip and its host, each way
        (`HOST_LINK_BYTES_PER_SECOND`, an estimate)."""
        return HOST_LINK_BYTES_PER_SECOND

    def devices(self, where: str = "remat.Target") -> list[Any]:
        """The slice's devices, from the TPU compiler's description of its topology.

        Raises:
          RuntimeError: libtpu is not installed (the message says how to install it), or
            the compiler does not know this slice.
        """
        return list(_devices(self, where))

    def mesh(self, where: str = "remat.Target") -> jax.sharding.Mesh:
        """A one-axis mesh (``"fsdp"``) over every device of the slice."""
        devices = self.devices(where)
        return jax.sharding.Mesh(np.array(devices), (MESH_AXIS,))

    def place(
        self, args: Sequence[Any], argnums: int | Sequence[int] = 0, where: str = "remat.Target"
    ) -> tuple[Any, ...]:
        """``args`` as `jax.ShapeDtypeStruct` s on this slice, sharded as FSDP shards them.

        A leaf that already has a sharding on the slice's devices is kept as it is (build
        your own with `Target.mesh` or `Target.devices`). Every other leaf keeps its shape
        and dtype and is sharded over the ``"fsdp"`` axis of `Target.mesh`: a differentiated
        argument (``argnums``: the parameters) along its largest dimension that the number
        of devices divides, any other argument (data) along its first dimension when the
        number of devices divides it; a leaf with no such dimension is replicated.

        Example:
          >>> import jax, jax.numpy as jnp
          >>> from remat._shard._target import Target, _placed_spec
          >>> _placed_spec((16, 4096, 1024), 4, param=True), _placed_spec((6, 10), 4, param=False)
          (P(None, 'fsdp', None), P())
        """
        mesh = self.mesh(where)
        own = set(mesh.devices.flat)
        n = mesh.devices.size
        wanted = {argnums} if isinstance(argnums, int) else set(argnums)

        def one(leaf: Any, param: bool) -> Any:
            sharding = getattr(leaf, "sharding", None)
            on_target = isinstance(sharding, jax.sharding.Sharding) and (
                set(sharding.device_set) <= own
            )
            if on_target and isinstance(leaf, jax.ShapeDtypeStruct):
                return leaf
            shape, dtype = tuple(np.shape(leaf)), _dtype(leaf)
            spec = _placed_spec(shape, n, param)
            return jax.ShapeDtypeStruct(
                shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec)
            )

        return tuple(
            jax.tree_util.tree_map(functools.partial(one, param=i in wanted), a)
            for i, a in enumerate(args)
        )


def _dtype(leaf: Any) -> Any:
    from .._core._dtypes import dtype_of

    return dtype_of(leaf)


def _placed_spec(shape: tuple[int, ...], n: int, param: bool) -> jax.sharding.PartitionSpec:
    """The `Target.place` rule for one leaf of ``shape`` over ``n`` devices."""
    P = jax.sharding.PartitionSpec
    if n == 1 or not shape:
        return P()
    if param:
        dims = [d for d in range(len(shape)) if shape[d] % n == 0]
        if not dims:
            return P()
        d = max(dims, key=lambda i: (shape[i], -i))
    elif shape[0] % n == 0:
        d = 0
    else:
        return P()
    return P(*(MESH_AXIS if i == d else None for i in range(len(shape))))


def _chips() -> str:
    return ", ".join(HBM_GIB)


_NAME = re.compile(r"^tpu:(v[0-9a-z]+):([0-9]+(?:x[0-9]+){1,2})(?::([0-9]+)slices)?$")
_CLOUD = re.compile(r"^tpu:(v[0-9a-z]+)-([0-9]+)$")


def parse_target(target: Any, where: str = "remat.Target") -> Target:
    """A `Target` from its name (``"tpu:v5e:2x2"``, ``"tpu:v5p-8"``) or a `Target`.

    A Cloud TPU name counts TensorCores for v4 and v5p (two per chip: ``v5p-8`` is 4 chips,
    2x2x1) and chips for v5e and v6e (``v5e-16`` is 4x4); it is laid out as Cloud TPU lays
    out that slice: 2D for v5e and v6e (``1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16``), 3D for
    v4 and v5p (``2x2x1``, then doubling the axes in turn: ``2x2x2, 2x2x4, 2x4x4, 4x4x4,
    ...``).

    Raises:
      ValueError: for any other name, with the grammar.
      TypeError: for anything but a string or a `Target`.

    Example:
      >>> from remat._shard._target import parse_target
      >>> parse_target("tpu:v5p-8").name, parse_target("tpu:v5e:2x2").num_chips
      ('tpu:v5p:2x2x1', 4)
    """
    if isinstance(target, Target):
        return target
    if not isinstance(target, str):
        raise TypeError(_BAD_TYPE.format(where=where, got=target, kind=type(target).__name__))
    text = target.strip().lower()
    bad = ValueError(_BAD_NAME.format(where=where, got=target, chips=_chips()))
    if m := _NAME.match(text):
        chip, shape, slices = m[1], m[2], m[3]
        if chip not in HBM_GIB:
            raise bad
        topology = tuple(int(d) for d in shape.split("x"))
        return Target(chip, topology, int(slices) if slices else 1)
    if m := _CLOUD.match(text):
        chip, count = m[1], int(m[2])
        if chip not in HBM_GIB or count % _CORES_PER_CHIP[chip]:
            raise bad
        topology = _cloud_layout(chip, count // _CORES_PER_CHIP[chip])
        if topology is None:
            raise bad
        return Target(chip, topology)
    raise bad


def _cloud_layout(chip: str, chips: int) -> tuple[int, ...] | None:
    if chips < 1 or chips & (chips - 1):
        return None  # Cloud TPU slices are powers of two
    if _CORES_PER_CHIP[chip] == 1:  # 2D: 1x1, 2x2 for 4, then the second axis doubles first
        if chips == 1:
            return (1, 1)
        if chips == 2:
            return (1, 2)
        x = 2 ** ((chips.bit_length() - 1) // 2)
        return (x, chips // x)
    if chips < 4:
        return None
    shape = [2, 2, 1]
    axis = 2
    while int(np.prod(shape)) < chips:
        shape[axis] *= 2
        axis = (axis - 1) % 3
    return tuple(shape)


def libtpu_available() -> bool:
    """Whether libtpu (XLA's TPU compiler) is installed: `Target.devices` needs it."""
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu(target: Target, where: str) -> None:
    """Raises the `_NO_LIBTPU` error (how to install libtpu) where it is not installed."""
    if not libtpu_available():
        import sys

        raise RuntimeError(_NO_LIBTPU.format(where=where, got=target.name, python=sys.executable))


def _devices(target: Target, where: str) -> tuple[Any, ...]:
    require_libtpu(target, where)
    try:
        return _topology_devices(target)
    except Exception as err:  # the compiler's own words for what it refused
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            _TOPOLOGY_FAILED.format(where=where, got=target.name, error=first, chips=_chips())
        ) from err


@functools.cache
def _topology_devices(target: Target) -> tuple[Any, ...]:
    """The slice's devices, built once per process and target: every mesh and placement of
    a target is on the same device objects (a sharding built by `Target.mesh` in the user's
    model and one `Target.place` makes inside `remat.plan` are one program's devices)."""
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    axes = (*target.topology, 1, 1)[:3]
    bounds = tuple(min(d, b) for d, b in zip(axes, _HOST_BOUNDS, strict=True))
    name = f"{target.chip}:{'x'.join(str(d) for d in target.topology)}"
    topology = topologies.get_topology_desc(
        platform="tpu",
        topology_name=name,
        chip_config_name="default",
        chips_per_host_bounds=bounds,
        num_slices=target.num_slices,
    )
    return tuple(topology.devices)


def check_repeats(target: Target | None, repeats: int | None, where: str) -> int:
    """``repeats`` with a target's default (0: a target is never run); raises for timing one."""
    if target is None:
        return 5 if repeats is None else repeats
    if repeats:
        raise ValueError(_RUN_ON_TARGET.format(where=where, got=target.name, repeats=repeats))
    return 0


def as_target(target: Any, where: str) -> Target | None:
    """`parse_target` for a ``target=`` argument; None stays None (compile for this machine)."""
    return None if target is None else parse_target(target, where)


def placement(args: Sequence[Any]) -> tuple[str, int]:
    """Where a program of these arguments compiles: the platform and number of devices of
    their shardings (a `Target`'s, a mesh's), or this machine's default backend.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._shard._target import placement
      >>> placement((jnp.ones(3),)) == (jax.default_backend(), 1)
      True
    """
    device = compile_device(args)
    if device is None:
        return jax.default_backend(), 1
    devices = set()
    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.Sharding):
            devices |= set(sharding.device_set)
    return str(device.platform), len(devices)


def compile_device(args: Sequence[Any]) -> Any:
    """A device the arguments are placed on (the first leaf with a sharding), or None.

    Programs the planner builds beside the step (a scan alone) compile for this device, so
    that they go to the same compiler as the step (a `Target`'s TPU compiler).
    """
    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.Sharding):
            return min(sharding.device_set, key=lambda d: d.id)
    return None


def chip_of(device: Any) -> str | None:
    """The TPU chip (``"v5e"``, ...) of ``device``, or None for any other device."""
    if getattr(device, "platform", None) != "tpu":
        return None
    return _DEVICE_KINDS.get(getattr(device, "device_kind", None) or "")


def offload_rates(device: Any) -> tuple[float, float] | None:
    """``(matmul FLOP/s, host bytes/s)`` of a TPU chip (`PEAK_TFLOPS`,
    `HOST_LINK_BYTES_PER_SECOND`), what the planner prices offloading with on a target; None
    for a device that is not a TPU chip listed there (its rate is measured by running).

    Example:
      >>> import types
      >>> from remat._shard._target import offload_rates
      >>> offload_rates(types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite"))
      (197000000000000.0, 15000000000.0)
    """
    chip = chip_of(device)
    if chip is None:
        return None
    return PEAK_TFLOPS[chip] * 1e12, HOST_LINK_BYTES_PER_SECOND


def usable_bytes(device: Any) -> int | None:
    """The HBM the TPU compiler gives one program on ``device`` (`USABLE_HBM_GIB`), or None
    for a device that is not a TPU chip listed there.

    Example:
      >>> import jax
      >>> from remat._shard._target import usable_bytes
      >>> usable_bytes(jax.devices("cpu")[0]) is None
      True
    """
    chip = chip_of(device)
    return None if chip is None else int(USABLE_HBM_GIB[chip] * 2**30)
