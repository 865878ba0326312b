"""Every compile the planner runs, and `remat.measure`'s numbers from one compile.

Two kinds of program are compiled, and each compile is tallied by kind (see `tally`):

- ``"step"``: the whole step (``jax.value_and_grad(fn)``, or the training step with an
  optimizer: `remat._measure._step.lower_step`): the un-checkpointed baseline and each plan
  the rounds verify. These are as expensive as the user's own compile.
- ``"scan"``: one scan on its own, a few steps long (`remat._plan._body`): the cheap points
  the memory model is calibrated on and each candidate is checked on before it is verified.

Both are compiled with `COMPILER_OPTIONS`: the planner reads XLA's memory analysis and the
optimised HLO, never runs the executable, and both are decided before the LLVM backend runs.
A scan alone compiled for the CPU also leaves XLA's fusion emitters off (`scan_options`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from .._measure._hbm import compile_measured
from .._measure._measurement import Measurement
from .._measure._step import ANALYSIS_OPTIONS, argnums_of, as_step, loss_of, lower_step

# The planner never runs what it compiles: LLVM's optimisation off (see `ANALYSIS_OPTIONS`).
COMPILER_OPTIONS = ANALYSIS_OPTIONS

STEP = "step"
SCAN = "scan"

# A scan-alone program for the CPU is compiled with XLA's older fusion emitters and its LLVM
# module in one piece: its memory analysis, buffer assignment (so its loop phases) and
# optimised HLO are the same, in about a fifth of the compile time (the four calibration
# programs of a Llama-3-8B-shaped layer: 0.36-0.46 s of CPU each instead of 1.85-2.51 s,
# `benchmarks/plan_time_ab.py --scan-options`; tests/_plan/test_compiles.py checks the small
# stacks). Not for the step: without the fusion emitters its memory analysis can differ by a
# few bytes (192 of the 256 GiB of temporaries of that Llama-3-8B step), and a plan is
# measured as the user compiles it; one LLVM module gains the step nothing.
SCAN_CPU_OPTIONS = {
    **COMPILER_OPTIONS,
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,
}

# Compiles run at once by `compile_each` (XLA compiles outside the GIL; one core each).
WORKERS = max(1, min(4, os.cpu_count() or 1))


@dataclasses.dataclass
class Tally:
    """Compiles run so far in this process, per kind, and the seconds they took."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def snapshot(self) -> tuple[dict[str, int], dict[str, float]]:
        return dict(self.counts), dict(self.seconds)


_TALLY = Tally()
_LOCK = threading.Lock()


def tally() -> tuple[dict[str, int], dict[str, float]]:
    """``(compiles per kind, seconds per kind)`` run by the planner in this process so far.

    Example:
      >>> from remat._plan._compile import tally
      >>> counts, seconds = tally()
      >>> isinstance(counts, dict) and isinstance(seconds, dict)
      True
    """
    return _TALLY.snapshot()


def scan_options(platform: str | None = None) -> dict[str, Any]:
    """The options a scan-alone program compiles with on ``platform`` (``"cpu"``, ``"tpu"``,
    ...; None: this machine's default backend): `SCAN_CPU_OPTIONS` on the CPU, else
    `COMPILER_OPTIONS`.

    Example:
      >>> from remat._plan._compile import COMPILER_OPTIONS, scan_options
      >>> scan_options()["xla_cpu_use_fusion_emitters"]  # this machine: the CPU
      False
      >>> scan_options("tpu") is COMPILER_OPTIONS
      True
    """
    platform = jax.default_backend() if platform is None else platform
    return SCAN_CPU_OPTIONS if platform == "cpu" else COMPILER_OPTIONS


def compile_lowered(
    lowered: Any,
    kind: str,
    read: Callable[[Any], Any] | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compiles a lowered program with ``options`` (default `COMPILER_OPTIONS`), tallied as
    ``kind``: the one place the planner compiles (tests wrap it to count). With ``read``,
    XLA's dump is written and ``(compiled, read(dump))`` returned (``read`` takes a
    `remat._measure._xla_dump.Dump`)."""
    options = COMPILER_OPTIONS if options is None else options
    start = time.perf_counter()
    try:
        compiled, dump = _compile(lowered, options, read is not None)
    except jax.errors.JaxRuntimeError as err:
        # A jaxlib without one of `SCAN_CPU_OPTIONS`: the step's options give the same
        # memory and HLO, more slowly.
        if options is COMPILER_OPTIONS or "No such compile option" not in str(err):
            raise
        compiled, dump = _compile(lowered, COMPILER_OPTIONS, read is not None)
    seconds = time.perf_counter() - start
    with _LOCK:
        _TALLY.counts[kind] = _TALLY.counts.get(kind, 0) + 1
        _TALLY.seconds[kind] = _TALLY.seconds.get(kind, 0.0) + seconds
    return compiled if read is None else (compiled, read(dump))


def _compile(lowered: Any, options: dict[str, Any], dump: bool) -> tuple[Any, Any]:
    """``(compiled, XLA's dump or None)``; a program with a ``compile_measured`` method of its
    own (`remat._plan._body._Refusable`) is compiled by it."""
    if not dump:
        own = getattr(lowered, "compile_measured", None)
        return (compile_measured(lowered, options) if own is None else own(options)), None
    from .._measure._xla_dump import compile_with_dump

    return compile_with_dump(lowered, options)


def compile_each(
    lowerings: Iterable[Callable[[], Any]],
    kind: str,
    read: Callable[[Any], Any] | None = None,
    options: dict[str, Any] | None = None,
) -> list[Any]:
    """Each program compiled (`compile_lowered`, with ``read`` and ``options``), in order:
    ``lowerings`` are called in turn on this thread (lowering holds the GIL) while up to
    `WORKERS` of the programs already lowered compile (XLA compiles outside the GIL)."""
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        pending = [
            pool.submit(compile_lowered, lower(), kind, read, options) for lower in lowerings
        ]
        return [p.result() for p in pending]


def compile_step(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> tuple[Any, float]:
    """The compiled step of ``fn`` (``argnums`` may be a `remat._measure._step.Step`: aux
    outputs, an optimizer's step) and the seconds the compile took."""
    return _timed_compile(lower_step(fn, args, argnums))


def _timed_compile(lowered: Any, read: Callable[[Any], Any] | None = None) -> tuple[Any, float]:
    start = time.perf_counter()
    compiled = compile_lowered(lowered, STEP, read)
    return compiled, time.perf_counter() - start


def peak_of(m: Measurement) -> int:
    """The peak memory of a measurement: its ``peak_bytes`` (see `remat._measure._peak`)."""
    return m.peak_bytes


def compile_measure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    label: str,
    baseline: Measurement | None,
    meanwhile: Callable[[], Any] | None = None,
    read: Callable[[Any], Any] | None = None,
) -> Any:
    """`remat.measure`'s numbers for ``fn`` from a single compile of its gradient step.

    ``argnums`` may be a `remat._measure._step.Step` (aux outputs, an optimizer's step).
    ``meanwhile`` is called on this thread while XLA compiles the step (e.g. other, smaller
    programs lowered and compiled beside it); with it, ``(measurement, its result)`` is
    returned. With ``read`` (not beside ``meanwhile``), XLA's dump of the step is written and
    ``(measurement, read(dump))`` returned.

    Memory and FLOPs are read as `remat.measure` reads them; ``forward_flops`` is the traced
    matmul count (checkpointing does not change the forward pass), and the recomputation is
    judged eliminated when the plan's matmul FLOPs are not above the un-checkpointed step's.
    """
    from .._measure._hlo import hlo_flops
    from .._measure._measure import build_measurement
    from .._measure._residuals import saved_residuals
    from .._trace._checkpoints import traced_dot_flops

    lowered = lower_step(fn, args, argnums)
    # XLA compiles outside the GIL: the residuals are traced meanwhile.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_timed_compile, lowered, read)
        beside = meanwhile() if meanwhile is not None else None
        residuals = saved_residuals(
            loss_of(fn, as_step(argnums)), *args, argnums=argnums_of(argnums)
        )
        if baseline is None:
            forward = traced_dot_flops(jax.make_jaxpr(fn)(*args).jaxpr)
        else:  # checkpointing does not change the forward pass
            forward = baseline.forward_flops
        compiled, seconds = pending.result()
    if read is not None:
        compiled, beside = compiled
    flops = hlo_flops(compiled.as_text())
    requested = baseline is not None
    measurement = build_measurement(
        compiled,
        residuals=residuals,
        flops=flops,
        forward_flops=forward,
        recompute_requested=requested,
        compile_seconds=seconds,
        strategy=label,
        plain_flops=None if baseline is None else baseline.flops,
    )
    return measurement if meanwhile is None and read is None else (measurement, beside)


def light_peak(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> int:
    """The peak of the compiled gradient step (one compile, nothing else)."""
    from .._measure._peak import peak_bytes

    compiled, _ = compile_step(fn, args, argnums)
    return peak_bytes(compiled)
