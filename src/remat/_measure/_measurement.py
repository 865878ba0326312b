"""Plain data that `remat.measure` returns: what a compiled gradient step keeps and costs.

Kept apart from `_measure.py` (which compiles and reads XLA) so reports, the planner and the
linter can use the data without importing the measuring machinery.
"""

from __future__ import annotations

import dataclasses

# A checkpointed step whose peak is above this fraction of its plain twin's saves nothing.
SAVES_NOTHING_FRACTION = 0.98


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value that autodiff keeps from the forward pass for the backward pass.

    Attributes:
      shape: the shape of one copy (per scan step, when kept inside a scan).
      dtype: its dtype name, e.g. ``"float32"``.
      bytes: bytes of one copy (on one device, for a program sharded over several).
      multiplicity: how many copies are kept: the product of the lengths of the scans
        around it (1 outside any scan).
      primitive: the primitive that produced it (``"dot_general"``, ...), or ``"argument"``.
      name: its `checkpoint_name`, if any.
      source: ``"file.py:123"`` in the user's code, if known.

    Example:
      >>> from remat import Residual
      >>> r = Residual((128, 64), "float32", bytes=32768, multiplicity=8, primitive="add")
      >>> r.total_bytes  # one copy per step of a scan of length 8
      262144
    """

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    multiplicity: int = 1
    primitive: str = ""
    name: str | None = None
    source: str | None = None

    @property
    def total_bytes(self) -> int:
        """``bytes * multiplicity``."""
        return self.bytes * self.multiplicity


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds per step: median, min and max over ``repeats`` runs.

    Example:
      >>> from remat import Timing
      >>> t = Timing(median=0.0031, min=0.0029, max=0.0040, repeats=5)
      >>> f"{t.median * 1e3:.1f} ms"
      '3.1 ms'
    """

    median: float
    min: float
    max: float
    repeats: int


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What one compiled `jax.value_and_grad` step keeps and costs.

    Memory numbers are XLA's compiled memory analysis (per device for SPMD programs);
    FLOPs are read from the optimised HLO with loop trip counts (see `remat.measure`).

    Attributes:
      peak_bytes: peak memory of the step; see ``peak_source``.
      peak_source: ``"peak_memory_in_bytes"`` (the backend's own peak) or
        ``"temp+argument+output-alias"`` (the sum of the parts below).
      temp_bytes, argument_bytes, output_bytes, alias_bytes: XLA's memory analysis.
      residuals: what autodiff keeps for the backward pass, one `Residual` per value kept
        (per copy, with its multiplicity).
      residual_bytes: ``sum(r.bytes * r.multiplicity for r in residuals)``.
      flops: matmul and convolution FLOPs of the compiled gradient step, loop trip counts
        included; elementwise work is not counted.
      forward_flops: the same for ``jax.jit(fn)`` alone.
      recompute_requested: a `jax.checkpoint` in the traced program has a policy that does
        not save everything.
      recompute_eliminated: the traced gradient recomputes matmuls, but the compiled one has
        no more matmul FLOPs than the program without checkpoints (``plain_flops``).
      compile_seconds: seconds to lower and compile the step (with LLVM's optimisation off
        when it is not timed: `remat._measure._step.ANALYSIS_OPTIONS`).
      seconds: step time over timed runs, or None when timing was skipped.
      strategy: label of the strategy measured (``"none"``: the program as written).
      backend, num_devices: where the step was compiled.
      plain_flops: compiled FLOPs of the program without checkpoints, when `measure`
        compiled it (the program asks for recomputation); None otherwise.
      plain_peak_bytes: the compiled peak of the program without checkpoints, when `measure`
        compiled it (the program asks for recomputation); None otherwise.
      host_bytes: what the step keeps in host memory (values offloaded to it: XLA's
        ``host_temp_size_in_bytes``), not part of ``peak_bytes``; 0 on CPU.
      scans_applied: how many scans the strategy checkpoints (the whole function counts
        as one in a program without scans); 0 for ``"none"``.
      scans_as_written: how many of the scans the strategy selects it leaves as the program
        wrote them: scans that checkpoint already, whose checkpoints `remat.apply` keeps
        unless ``override=True`` (see ``as_written``).

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):  # 4 layers stacked with a scan
      ...     h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
      ...     return h.sum()
      >>> m = remat.measure(loss, jnp.ones((4, 8, 8)), jnp.ones((2, 8)), repeats=0)
      >>> m.residual_bytes == sum(r.total_bytes for r in m.residuals)
      True
      >>> m.flops >= m.forward_flops, m.seconds  # repeats=0: not timed
      (True, None)
    """

    peak_bytes: int
    peak_source: str  # "peak_memory_in_bytes" or "temp+argument+output-alias"
    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    residuals: tuple[Residual, ...]
    residual_bytes: int
    flops: float
    forward_flops: float
    recompute_requested: bool
    recompute_eliminated: bool
    compile_seconds: float
    seconds: Timing | None
    strategy: str = "none"
    backend: str = "cpu"
    num_devices: int = 1
    plain_flops: float | None = None
    plain_peak_bytes: int | None = None
    host_bytes: int = 0
    scans_applied: int = 0
    scans_as_written: int = 0

    @property
    def as_written(self) -> bool:
        """The strategy was applied nowhere: every scan it selects kept the program's own
        checkpoints, so this measures the program as written, whatever its label says
        (``override=True`` applies the strategy there).

        Example:
          >>> import remat
          >>> m = remat.Measurement(8, "x", 8, 0, 0, 0, (), 0, 1.0, 1.0, True, False, 0.0,
          ...                       None, strategy="full", scans_as_written=1)
          >>> m.as_written
          True
        """
        return self.scans_as_written > 0 and self.scans_applied == 0

    @property
    def saves_nothing(self) -> bool:
        """The checkpoints recompute (the compiled FLOPs are above ``plain_flops``), but the
        compiled peak is not at least 2% below the peak of the same program without them
        (``plain_peak_bytes``).

        This is the common case of `nn.remat` around each layer of a model whose layers run in
        a Python loop: outside a loop XLA merges the recomputation away or schedules it early,
        and the step keeps about as much as before (measured: -2% to +1% of the peak for a
        third more FLOPs). 2% is the margin: a smaller saving is not worth a checkpoint.

        Example:
          >>> import remat
          >>> m = remat.Measurement(100, "x", 0, 0, 0, 0, (), 0, 4.0, 1.0, True, False, 0.0,
          ...                       None, plain_flops=3.0, plain_peak_bytes=99)
          >>> m.saves_nothing
          True
        """
        return (
            self.recompute_requested
            and self.plain_peak_bytes is not None
            and self.plain_flops is not None
            and self.flops > self.plain_flops
            and self.peak_bytes > SAVES_NOTHING_FRACTION * self.plain_peak_bytes
        )
