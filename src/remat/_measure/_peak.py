"""The one peak-memory figure of a compiled program, used by every part of remat.

`remat.measure`, `remat.compare`, every verification round of `remat.plan`, the per-device
figures of sharded programs, `remat.lint` and the benchmarks all read memory through
`compiled_memory`, so that a strategy, a plan and a report can never disagree about how much
memory a step takes.

Which figure, per backend:

- **CPU**: ``temp + argument + output - alias``. XLA's CPU backend (jaxlib 0.10) reports a
  ``peak_memory_in_bytes`` of about ``argument + output`` that leaves the temporaries out; on a
  program whose outputs (its gradients) outweigh its temporaries, that number is larger than
  ``temp + argument - alias`` yet still blind to the temporaries, so it reports the same peak
  for every checkpointing strategy. It is never used on CPU. The sum is exact for what XLA
  allocates: the temporaries are one preallocated buffer that lives for the whole run, and
  the arguments (less what is donated into the outputs) and outputs are live at its end.
- **GPU / TPU**: the backend's own ``peak_memory_in_bytes`` (from buffer assignment's heap
  simulation, which knows when buffers die) when it is at least ``temp + argument - alias``
  (the temporaries buffer and the arguments coexist, so a smaller figure cannot be a peak);
  otherwise the sum above. What has been checked: the choice between the two figures, with
  memory analyses written by hand for each backend (``tests/_measure/test_peak.py``); what
  has not: that a GPU's or TPU's ``peak_memory_in_bytes`` passes that floor and is the
  peak a device reaches, since no run on either device has been compared with it. So
  ``peak_source`` says which figure was taken, for a reader to check on the device.
- A backend without memory analysis gives zeros and ``peak_source="unavailable"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

SUM = "temp+argument+output-alias"
BACKEND = "peak_memory_in_bytes"
UNAVAILABLE = "unavailable"


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of one compiled program, with its peak.

    Attributes:
      peak_bytes: the peak; see ``peak_source``.
      peak_source: ``"temp+argument+output-alias"``, ``"peak_memory_in_bytes"`` or
        ``"unavailable"``.
      temp_bytes, argument_bytes, output_bytes, alias_bytes: XLA's figures.

    Example:
      >>> from remat._measure._peak import CompiledMemory
      >>> m = CompiledMemory.from_parts(temp=100, argument=40, output=30, alias=10)
      >>> m.peak_bytes, m.peak_source
      (160, 'temp+argument+output-alias')
    """

    peak_bytes: int
    peak_source: str
    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int

    @classmethod
    def from_parts(
        cls,
        *,
        temp: int,
        argument: int,
        output: int,
        alias: int,
        backend_peak: int = 0,
        platform: str = "cpu",
    ) -> CompiledMemory:
        """The peak of these parts on ``platform`` (see the module docstring)."""
        total = temp + argument + output - alias
        floor = temp + argument - alias
        if platform != "cpu" and backend_peak > 0 and backend_peak >= floor:
            peak, source = backend_peak, BACKEND
        else:
            peak, source = total, SUM
        return cls(peak, source, temp, argument, output, alias)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (the memory keyword arguments of `remat.Measurement`)."""
        return dataclasses.asdict(self)


def _platform(compiled: Any) -> str:
    try:
        shardings = jax.tree_util.tree_leaves(compiled.input_shardings)
        for sharding in shardings:
            for device in sharding.device_set:
                return str(device.platform)
    except Exception:  # a compiled object without shardings: fall back to the default
        pass
    return jax.default_backend()


def compiled_memory(compiled: Any) -> CompiledMemory:
    """The memory of a compiled program, with the one peak figure remat uses everywhere.

    Args:
      compiled: a `jax.stages.Compiled`, e.g. ``jax.jit(f).lower(*args).compile()``.

    Returns:
      A `CompiledMemory`. Per device for a program compiled over several devices (SPMD).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._peak import compiled_memory
      >>> m = compiled_memory(jax.jit(jnp.sin).lower(jnp.ones(256)).compile())
      >>> m.argument_bytes, m.output_bytes, m.peak_source
      (1024, 1024, 'temp+argument+output-alias')
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return CompiledMemory(0, UNAVAILABLE, 0, 0, 0, 0)
    return CompiledMemory.from_parts(
        temp=int(stats.temp_size_in_bytes),
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        backend_peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
        platform=_platform(compiled),
    )


def peak_bytes(compiled: Any) -> int:
    """``compiled_memory(compiled).peak_bytes``: the compiled program's peak, in bytes.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._peak import peak_bytes
      >>> peak_bytes(jax.jit(jnp.sin).lower(jnp.ones(256)).compile()) >= 2048
      True
    """
    return compiled_memory(compiled).peak_bytes
