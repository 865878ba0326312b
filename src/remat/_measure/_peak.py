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
- **TPU**: the HBM the program allocates, read from the TPU compiler's buffer assignment
  (``peak_source="hbm-buffer-assignment"``): every TPU program remat compiles goes through
  `remat._measure._hbm.compile_measured`, which has XLA dump it and sums the allocations in
  memory space 0 (HBM: arguments, outputs, the preallocated temporaries, constants). That is
  what the compiler checks against the chip ("Ran out of memory on HBM"): a program whose
  ``temp + argument + output - alias`` is 16139 MiB compiles on a v5e (16128 MiB for a
  program) with 16107 MiB of HBM in its buffer assignment. Neither figure of XLA's memory
  analysis is the HBM. ``temp_size_in_bytes`` counts bytes that no allocation of the buffer
  assignment holds, so the sum is above the HBM: by
  0.2-64 MiB on scanned MLPs over four chips and by 0.79 GiB on a 2-layer
  Llama-3-8B step with FSDP on a v5e-16, 0.98 GiB at 4 layers, at least 3.84 GiB at 32 (a
  program the compiler accepts at 19.59 GiB by the sum). ``peak_memory_in_bytes`` adds the
  VMEM (128 MiB on a v5e) in on some programs (a checkpointed loop: 212 MiB against 144 MiB
  of HBM) and is below the HBM on others (the 2-layer Llama step: 7.63 GiB against 8.11).
  A TPU program compiled elsewhere (no dump read) falls back to the sum, which is at or
  above the HBM on every program measured. docs/tpu.md has the measurements.
- **GPU**: the backend's own ``peak_memory_in_bytes`` (from buffer assignment's heap
  simulation, which knows when buffers die) when it is at least ``temp + argument - alias``
  (the temporaries buffer and the arguments coexist, so a smaller figure cannot be a peak);
  otherwise the sum above. The choice between the two figures is tested with memory
  analyses written by hand (``tests/_measure/test_peak.py``). On an H100 (JAX 0.11.2,
  ``benchmarks/gpu_bench.py``) the backend's figure passed the floor on every program, and
  with the arrays already on the device added it was the allocator's peak within 0.01 MiB
  (a 4.9 GiB step) and 7.5 MiB (17.7 GiB); on a 200 MiB step the allocator peaked 75 MiB
  above it. ``peak_source`` says which figure was taken.
- A backend without memory analysis gives zeros and ``peak_source="unavailable"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ._hbm import compiled_hbm

SUM = "temp+argument+output-alias"
BUFFER_ASSIGNMENT = "hbm-buffer-assignment"
BACKEND = "peak_memory_in_bytes"
UNAVAILABLE = "unavailable"


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of one compiled program, with its peak.

    Attributes:
      peak_bytes: the peak; see ``peak_source``.
      peak_source: ``"temp+argument+output-alias"``, ``"hbm-buffer-assignment"`` (TPU),
        ``"peak_memory_in_bytes"`` or ``"unavailable"``.
      temp_bytes, argument_bytes, output_bytes, alias_bytes: XLA's figures.
      host_bytes: the program's temporaries in host memory (``host_temp_size_in_bytes``:
        values offloaded with ``save_and_offload_only_these_names``; 0 on CPU, where "host"
        is the device's own memory). Not part of the peak.

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
    host_bytes: int = 0

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
        hbm: int | None = None,
    ) -> CompiledMemory:
        """The peak of these parts on ``platform`` (see the module docstring); ``hbm``: a
        TPU program's HBM from its buffer assignment, where it was read."""
        total = temp + argument + output - alias
        floor = temp + argument - alias
        if platform == "tpu" and hbm is not None:
            return cls(hbm, BUFFER_ASSIGNMENT, temp, argument, output, alias)
        if platform not in ("cpu", "tpu") and backend_peak > 0 and backend_peak >= floor:
            peak, source = backend_peak, BACKEND
        else:
            peak, source = total, SUM
        return cls(peak, source, temp, argument, output, alias)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (the memory keyword arguments of `remat.Measurement`)."""
        return dataclasses.asdict(self)


def compiled_platform(compiled: Any) -> str:
    """The platform a compiled program is for (``"cpu"``, ``"tpu"``, ...), read from its
    input shardings' devices: a program compiled for a `remat.Target` is ``"tpu"`` on a host
    whose default backend is CPU.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._peak import compiled_platform
      >>> compiled_platform(jax.jit(jnp.sin).lower(jnp.ones(4)).compile())
      'cpu'
    """
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
    memory = CompiledMemory.from_parts(
        temp=int(stats.temp_size_in_bytes),
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        backend_peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
        platform=compiled_platform(compiled),
        hbm=compiled_hbm(compiled),
    )
    host = int(getattr(stats, "host_temp_size_in_bytes", 0) or 0)
    return dataclasses.replace(memory, host_bytes=host)


def peak_bytes(compiled: Any) -> int:
    """``compiled_memory(compiled).peak_bytes``: the compiled program's peak, in bytes.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._peak import peak_bytes
      >>> peak_bytes(jax.jit(jnp.sin).lower(jnp.ones(256)).compile()) >= 2048
      True
    """
    return compiled_memory(compiled).peak_bytes
