"""Shardings: where a program's values live, and how many bytes each device holds.

A `jax.jit` program over a `jax.sharding.Mesh` is compiled once for all devices (SPMD) and
every device runs the same partitioned program on its own shard. XLA's memory analysis of such
a program (`compiled.memory_analysis()`) is therefore **per device**, and so must be any memory
model that is compared against it: a value of global shape ``(8, 16)`` sharded four ways over
its first axis costs each device ``2 * 16 * itemsize`` bytes.

Shardings come from two places, and both are read here:

- the arguments (``jax.device_put(x, NamedSharding(mesh, spec))``, or a `jax.ShapeDtypeStruct`
  with ``sharding=``): `arg_shardings`;
- a function wrapped in ``jax.jit(f, in_shardings=..., out_shardings=...)``: compile it
  (``f.lower(*args).compile()``) and read ``compiled.input_shardings`` /
  ``compiled.output_shardings``, which `program_shardings` does. (The un-compiled
  ``jax.stages.Lowered`` only knows the output shardings, in ``out_info``.)

With `jax.sharding.AxisType.Explicit` mesh axes (the default of `jax.make_mesh` in JAX 0.10) a
value's sharding is part of its abstract value, ``jax.typeof(x).sharding``, so even the
intermediates of a traced jaxpr carry it; `per_device_bytes` reads it from there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from .._core._dtypes import itemsize

_NOT_SHAPED = (
    "`remat.per_device_bytes` got {got!r}, which has no shape and dtype; pass an array, a "
    "`jax.ShapeDtypeStruct` or an abstract value (`jax.typeof(x)`)."
)


def _sharding_of(value: Any) -> jax.sharding.Sharding | None:
    """The sharding an array, `ShapeDtypeStruct` or abstract value carries, if any."""
    sharding = getattr(value, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    return None


def shard_shape(shape: tuple[int, ...], sharding: jax.sharding.Sharding | None) -> tuple[int, ...]:
    """The shape of the piece of a ``shape``-d value that one device holds.

    Example:
      >>> from remat._shard._sharding import shard_shape
      >>> shard_shape((8, 16), None)
      (8, 16)
    """
    shape = tuple(int(d) for d in shape)
    if sharding is None:
        return shape
    try:
        return tuple(int(d) for d in sharding.shard_shape(shape))
    except (ValueError, TypeError, AttributeError):
        pass
    # A spec that does not divide the shape: XLA pads each piece to ceil(size / pieces).
    splits = spec_splits(sharding, len(shape))
    if splits is None:
        return shape  # a sharding we cannot read: count the value whole rather than guess
    return tuple(-(-d // k) for d, k in zip(shape, splits, strict=True))


def spec_splits(sharding: Any, ndim: int) -> tuple[int, ...] | None:
    """Per dimension, the product of the mesh axis sizes a `NamedSharding`'s spec names.

    None for a sharding that is not a `NamedSharding` (or whose mesh has no sizes).

    Example:
      >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
      >>> from remat._shard._sharding import spec_splits
      >>> spec_splits(NamedSharding(AbstractMesh((4, 2), ("a", "b")), P(("a", "b"))), 2)
      (8, 1)
    """
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return None
    try:
        sizes = dict(mesh.shape)
    except (TypeError, AttributeError):
        return None
    out = []
    for dim in range(ndim):
        part = spec[dim] if dim < len(spec) else None
        names = () if part is None else (part if isinstance(part, tuple) else (part,))
        out.append(math.prod(int(sizes.get(n, 1)) for n in names))
    return tuple(out)


def shard_count(shape: tuple[int, ...], sharding: jax.sharding.Sharding | None) -> int:
    """Into how many distinct pieces ``sharding`` cuts a value of ``shape`` (1 if replicated).

    Example:
      >>> from remat._shard._sharding import shard_count
      >>> shard_count((8, 16), None)
      1
    """
    whole = math.prod(int(d) for d in shape)
    piece = math.prod(shard_shape(shape, sharding))
    return max(1, whole // piece) if piece else 1


def per_device_bytes(aval: Any, sharding: jax.sharding.Sharding | None = None) -> int:
    """Bytes of ``aval`` that each device holds under ``sharding``.

    Args:
      aval: an array, a `jax.ShapeDtypeStruct` or an abstract value (anything with ``shape``
        and ``dtype``).
      sharding: how the value is laid out over devices. ``None`` uses the sharding the value
        carries (a placed array's ``.sharding``, a `ShapeDtypeStruct`'s ``sharding=``, or the
        sharding in an abstract value under explicit mesh axes), and counts the value whole
        (replicated, or on one device) when it carries none.

    Returns:
      ``prod(sharding.shard_shape(shape)) * itemsize``: the bytes of one device's shard.

    Raises:
      TypeError: if ``aval`` has no shape or dtype.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> import remat
      >>> remat.per_device_bytes(jax.ShapeDtypeStruct((8, 16), jnp.float32))
      512
    """
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(_NOT_SHAPED.format(got=aval))
    if sharding is None:
        sharding = _sharding_of(aval)
    return math.prod(shard_shape(tuple(shape), sharding)) * itemsize(dtype)


def arg_shardings(args: Any) -> Any:
    """The pytree of ``args`` with each leaf replaced by its sharding (or None if it has none).

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._shard._sharding import arg_shardings
      >>> arg_shardings({"w": 1.0})
      {'w': None}
    """
    return jax.tree_util.tree_map(_sharding_of, args)


def is_sharded(args: Any) -> bool:
    """Whether any leaf of ``args`` is laid out over more than one device.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._shard._sharding import is_sharded
      >>> is_sharded((jnp.ones(3),))
      False
    """
    shardings = (_sharding_of(x) for x in jax.tree_util.tree_leaves(args))
    return any(_device_count(s) > 1 for s in shardings if s is not None)


def _device_count(sharding: jax.sharding.Sharding) -> int:
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and hasattr(mesh, "size"):
        return int(mesh.size)  # also for an abstract mesh, which has no devices
    return len(sharding.device_set)


@dataclasses.dataclass(frozen=True)
class ProgramShardings:
    """How a compiled program lays out its inputs and outputs.

    Attributes:
      inputs: the flat tuple of input shardings, in the order of the flattened arguments.
      outputs: the flat tuple of output shardings.
      num_devices: how many devices the program runs on (its SPMD partition count).
    """

    inputs: tuple[jax.sharding.Sharding, ...]
    outputs: tuple[jax.sharding.Sharding, ...]
    num_devices: int


def compiled_shardings(compiled: jax.stages.Compiled) -> ProgramShardings:
    """Reads the input and output shardings and device count of a compiled program.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._shard._sharding import compiled_shardings
      >>> compiled = jax.jit(lambda x: 2 * x).lower(jnp.ones(3)).compile()
      >>> compiled_shardings(compiled).num_devices
      1
    """
    in_args, in_kwargs = compiled.input_shardings
    inputs = tuple(jax.tree_util.tree_leaves((in_args, in_kwargs)))
    outputs = tuple(jax.tree_util.tree_leaves(compiled.output_shardings))
    return ProgramShardings(inputs, outputs, num_devices(compiled))


def program_shardings(fn: Any, *args: Any) -> ProgramShardings:
    """Compiles ``jax.jit(fn)`` for ``args`` and returns its input/output shardings.

    ``fn`` may already be a `jax.jit` function (with ``in_shardings``/``out_shardings``); it is
    then compiled as it is, so the shardings read back are the ones it was given.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._shard._sharding import program_shardings
      >>> program_shardings(lambda x: x + 1, jnp.ones(3)).num_devices
      1
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return compiled_shardings(jitted.lower(*args).compile())


def num_devices(compiled: jax.stages.Compiled) -> int:
    """How many devices a compiled program is partitioned over (1 for an unsharded program).

    The union of the devices of its input and output shardings; for a program with neither,
    the devices its executable was loaded onto.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._shard._sharding import num_devices
      >>> num_devices(jax.jit(jnp.sin).lower(jnp.ones(3)).compile())
      1
    """
    devices: set[Any] = set()
    in_args, in_kwargs = compiled.input_shardings
    shardings = jax.tree_util.tree_leaves((in_args, in_kwargs, compiled.output_shardings))
    for sharding in shardings:
        if isinstance(sharding, jax.sharding.Sharding):
            devices |= set(sharding.device_set)
    if devices:
        return len(devices)
    try:
        return len(compiled.runtime_executable().local_devices())
    except Exception:  # executables without a runtime handle (e.g. deserialised)
        return 1


def mesh_of(args: Any) -> jax.sharding.Mesh | None:
    """The mesh of the first `NamedSharding` among ``args``' leaves, or None.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._shard._sharding import mesh_of
      >>> mesh_of((jnp.ones(3),)) is None
      True
    """
    for sharding in jax.tree_util.tree_leaves(arg_shardings(args)):
        if isinstance(sharding, jax.sharding.NamedSharding):
            return sharding.mesh
    return None
