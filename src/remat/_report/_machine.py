"""Where a report was measured: this machine, or the TPU slice a program was compiled for."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Machine:
    """Where a report was measured.

    Attributes:
      backend: JAX's default backend (``"cpu"``, ``"gpu"``, ``"tpu"``).
      device_kind: the first device's kind, e.g. ``"cpu"`` or ``"NVIDIA H100 80GB HBM3"``.
      device_count: number of devices JAX sees.
      jax_version: ``jax.__version__``.
      host: the host's operating system and CPU, with its number of cores.

    Example:
      >>> from remat import Machine
      >>> Machine("gpu", "NVIDIA H100 80GB HBM3", 8, "0.10.2").describe()
      'gpu (NVIDIA H100 80GB HBM3 x8), jax 0.10.2'
    """

    backend: str
    device_kind: str
    device_count: int
    jax_version: str
    host: str = ""

    def describe(self) -> str:
        """One line, e.g. ``"cpu (cpu x1), jax 0.10.2, Linux x86_64, AMD EPYC, 2 cores"``."""
        text = f"{self.backend} ({self.device_kind} x{self.device_count}), jax {self.jax_version}"
        return f"{text}, {self.host}" if self.host else text


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_machine(target: Any = None) -> Machine:
    """The `Machine` this process runs on (JAX's default backend), or, for a compile
    ``target`` (a `remat.Target`), the slice it compiles for: its devices, with this host
    named as where it was compiled (a target is never run).

    Example:
      >>> from remat._report._report import current_machine
      >>> current_machine().host.endswith("cores")
      True
    """
    import jax

    host = f"{platform.system()} {platform.machine()}, {_cpu_model()}, {os.cpu_count()} cores"
    if target is not None:
        devices = target.devices("remat.compare")
        return Machine(
            backend=str(devices[0].platform),
            device_kind=str(devices[0].device_kind),
            device_count=len(devices),
            jax_version=jax.__version__,
            host=f"{target.name}, compiled (never run) on {host}",
        )
    device = jax.devices()[0]
    return Machine(
        backend=jax.default_backend(),
        device_kind=str(device.device_kind),
        device_count=jax.device_count(),
        jax_version=jax.__version__,
        host=host,
    )
