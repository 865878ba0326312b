"""Host offloading: a third choice beside saving a residual on the device and recomputing it.

An offloaded residual is copied to host memory in the forward pass and back in the backward
pass (`jax.checkpoint_policies.save_and_offload_only_these_names`): it costs no device memory
between the passes, but two transfers over the host link. The planner prices that as

    seconds = 2 * bytes / host_bandwidth

(one copy out, one copy back; per device, since every device moves its own shard), with
``host_bandwidth`` defaulting to `HOST_BANDWIDTH` = 25 GB/s, about what one accelerator gets
from a PCIe 4.0 x16 link in practice. Pass the measured number of your machine where it
matters.

When is offloading possible? The rule, read from the device's memory spaces
(`jax.Device.addressable_memories`, `jax.Device.default_memory`):

1. the device can address a ``pinned_host`` memory space, and
2. its own (default) memory is a different space, of kind ``device``, and
3. that device memory is not itself host memory. A CPU device's ``device`` memory *is* host
   RAM: it lists ``device``, ``pinned_host`` and ``unpinned_host`` like an accelerator does,
   but they are the same RAM, and XLA:CPU keeps "offloaded" residuals in the program's
   ordinary temporaries (measured: the temp bytes of an offloading gradient step equal those
   of the step that saves the same values on the device, and ``host_temp_size_in_bytes`` is
   0). So a device whose memories all belong to the ``cpu`` platform offers nothing to
   offload to.

Which device? The one the program compiles for: a `remat.Target`'s TPU chip where
`remat.measure`, `remat.compare`, `remat.lint` or `remat.plan` compile for one (they hold
`compiling_for` around their work, so that an ``"offload:a,b"`` strategy met while tracing is
checked against the chip, whose host memory takes it), this machine's first device otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp

# Bytes per second between device and host memory, per device. PCIe 4.0 x16 moves ~25 GB/s in
# each direction in practice (32 GB/s nominal); NVLink-C2C hosts (GH200) are an order faster.
HOST_BANDWIDTH = 25e9

_HOST_KINDS = ("pinned_host", "unpinned_host")
_COMPILE_DEVICE: contextvars.ContextVar[jax.Device | None] = contextvars.ContextVar(
    "remat_compile_device", default=None
)


@contextlib.contextmanager
def compiling_for(device: jax.Device | None) -> Iterator[None]:
    """Within the block, offloading is checked against ``device`` (a target's chip) instead of
    this machine's first device; None leaves the check as it is.

    Example:
      >>> import jax
      >>> from remat._core._offload import compile_device_now, compiling_for
      >>> with compiling_for(jax.devices("cpu")[0]):
      ...     compile_device_now().platform
      'cpu'
    """
    token = _COMPILE_DEVICE.set(device if device is not None else _COMPILE_DEVICE.get())
    try:
        yield
    finally:
        _COMPILE_DEVICE.reset(token)


def compile_device_now() -> jax.Device:
    """The device programs compile for here: the innermost `compiling_for`'s, else this
    machine's first device."""
    device = _COMPILE_DEVICE.get()
    return device if device is not None else jax.devices()[0]


def offload_unavailable_reason(device: jax.Device | None = None) -> str | None:
    """Why ``device`` (default: `compile_device_now`) has no host memory to offload to, or
    None when it has one.

    Example:
      >>> import jax
      >>> from remat._core._offload import offload_unavailable_reason
      >>> print(offload_unavailable_reason(jax.devices("cpu")[0]))
      cpu device 0 has memory spaces device, pinned_host, unpinned_host, but its device memory is host RAM: nothing to offload to
    """
    device = device if device is not None else compile_device_now()
    label = f"{device.platform} device {device.id}"
    try:
        memories = list(device.addressable_memories())
        own = device.default_memory()
    except Exception:  # backends without memory-space support
        return f"{label} exposes no memory spaces"
    kinds = sorted({m.kind for m in memories})
    listed = ", ".join(kinds)
    if "pinned_host" not in kinds:
        return f"{label} has memory spaces {listed}, none of them pinned_host"
    if own.kind in _HOST_KINDS:
        return f"{label}'s own memory is already host memory ({own.kind})"
    if all(getattr(m, "platform", device.platform) == "cpu" for m in memories):
        return f"{label} has memory spaces {listed}, but its device memory is host RAM: nothing to offload to"
    return None


def offload_available(device: jax.Device | None = None) -> bool:
    """Whether ``device`` (default: `compile_device_now`) has a host memory space to offload to.

    See the module docstring for the rule.

    Example:
      >>> import jax
      >>> from remat._core._offload import offload_available
      >>> offload_available(jax.devices("cpu")[0])
      False
    """
    return offload_unavailable_reason(device) is None


def transfer_seconds(num_bytes: float, host_bandwidth: float = HOST_BANDWIDTH) -> float:
    """Seconds to offload ``num_bytes`` and fetch them back: ``2 * num_bytes / host_bandwidth``.

    Args:
      num_bytes: bytes offloaded (per device).
      host_bandwidth: bytes per second of the device-host link, each way.

    Returns:
      The transfer time the planner charges for offloading these bytes.

    Raises:
      ValueError: if ``host_bandwidth`` is not positive.

    Example:
      >>> from remat._core._offload import transfer_seconds
      >>> transfer_seconds(25e9)
      2.0
    """
    if not host_bandwidth > 0:
        raise ValueError(
            f"`remat.plan` got host_bandwidth={host_bandwidth!r}; it must be a positive number "
            "of bytes per second (default 25e9)."
        )
    return 2.0 * float(num_bytes) / float(host_bandwidth)


@functools.cache
def device_flops_per_second(size: int = 1024, repeats: int = 5) -> float:
    """The default device's measured float32 matmul rate, FLOP/s (cached per process).

    The planner uses it to put transfer seconds and recomputed FLOPs in one objective.

    Example:
      >>> from remat._core._offload import device_flops_per_second
      >>> device_flops_per_second(64, 1) > 0
      True
    """
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    jax.block_until_ready(matmul(a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(matmul(a))
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / max(best, 1e-9)
