"""Compiling and measuring a plan: `remat.measure`'s numbers from one compile."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._measure._measurement import Measurement
from .._measure._step import argnums_of, as_step, loss_of, lower_step


def peak_of(m: Measurement) -> int:
    """The peak memory of a measurement: its ``peak_bytes`` (see `remat._measure._peak`)."""
    return m.peak_bytes


def compile_measure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    label: str,
    baseline: Measurement | None,
) -> Measurement:
    """`remat.measure`'s numbers for ``fn`` from a single compile of its gradient step.

    ``argnums`` may be a `remat._measure._step.Step` (aux outputs, an optimizer's step).

    Memory and FLOPs are read as `remat.measure` reads them; ``forward_flops`` is the traced
    matmul count (checkpointing does not change the forward pass), and the recomputation is
    judged eliminated when the plan's matmul FLOPs are not above the un-checkpointed step's.
    """
    from .._measure._hlo import hlo_flops
    from .._measure._measure import measure_compiled
    from .._measure._residuals import saved_residuals
    from .._shard._sharding import num_devices
    from .._trace._checkpoints import traced_dot_flops

    start = time.perf_counter()
    compiled = lower_step(fn, args, argnums).compile()
    seconds = time.perf_counter() - start
    flops = hlo_flops(compiled.as_text())
    residuals = saved_residuals(loss_of(fn, as_step(argnums)), *args, argnums=argnums_of(argnums))
    forward = traced_dot_flops(jax.make_jaxpr(fn)(*args).jaxpr)
    requested = baseline is not None
    return Measurement(
        **measure_compiled(compiled),
        residuals=residuals,
        residual_bytes=sum(r.total_bytes for r in residuals),
        flops=flops,
        forward_flops=forward,
        recompute_requested=requested,
        recompute_eliminated=False,
        compile_seconds=seconds,
        seconds=None,
        strategy=label,
        backend=jax.default_backend(),
        num_devices=num_devices(compiled),
        plain_flops=None if baseline is None else baseline.flops,
    )


def light_peak(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> int:
    """The peak of the compiled gradient step (one compile, nothing else)."""
    from .._measure._peak import peak_bytes

    return peak_bytes(lower_step(fn, args, argnums).compile())
