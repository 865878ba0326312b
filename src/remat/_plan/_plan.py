"""`remat.plan`: the cheapest checkpointing of a gradient step that fits a memory budget.

Trace → cost model → solve → rewrite → compile and measure:

1. ``fn`` is traced and each scan not inside another scan gets a cost model (`_costmodel`):
   its body as a graph of values with bytes, FLOPs and what the backward pass needs.
2. Each scan gets a few schedules (``per_step``, `remat.Nested`, `remat.Binomial`), and one
   mixed-integer program (`_milp`, Checkmate-style; Jain et al., MLSys 2020) chooses, for all
   scans together, the schedule and the set of values to save that recompute the fewest
   FLOPs within the budget.
3. The memory model (see `SLICE_WEIGHT`) is calibrated on the compiled program: the peak
   with every needed value saved gives the memory outside the scans; the peak with nothing
   saved gives how much of a step's materialised recomputed values is live at once.
   Each `remat.Nested` and `remat.Binomial` option is compiled once more: what it keeps
   beyond the per-step fits is charged to it (`option_offsets`).
4. The chosen plan is compiled and measured (`remat.measure`); if its peak is over the
   budget, the model's budget is tightened by the error and the program solved again, a
   bounded number of times. This is done with each calibrated fit of the memory model (a
   third compiled point gives a second fit), keeping the cheapest measured plan. If nothing fits, `InfeasibleBudget` says how close it came.

Measured FLOPs are matmul FLOPs read from the optimised HLO with loop trip counts; the
backward loop of a `remat.Binomial` schedule has no static trip count, so for plans that use
it the measured FLOPs are a lower bound (the model's ``recompute_flops`` are not).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._core._budget import device_memory_bytes, read_budget
from .._core._offload import HOST_BANDWIDTH, offload_unavailable_reason, transfer_seconds
from .._core._warnings import RematWarning
from ._calibrate import prepare
from ._compile import tally
from ._memo import Knowledge, key_of, recall, remember
from ._progress import Progress
from ._result import InfeasibleBudget, Plan, fingerprint
from ._rounds import plan_prepared

_NO_OFFLOAD = "`remat.plan` got offload=True, but {reason}; planning without offloading."


def plan(
    fn: Callable[..., Any],
    *args: Any,
    budget: int | float | str,
    argnums: int | Sequence[int] = 0,
    schedules: bool = True,
    max_rounds: int = 4,
    device_memory: int | None = None,
    offload: bool = False,
    host_bandwidth: float = HOST_BANDWIDTH,
    verbose: bool = True,
) -> Plan:
    """Plans the cheapest checkpointing of ``jax.value_and_grad(fn)`` within ``budget``.

    Chooses, for every scan of ``fn`` (layer stacks, recurrences) that is not inside another
    scan, which values of its body to save and which to recompute in the backward pass, and
    how to schedule the scan (``per_step``, `remat.Nested`, `remat.Binomial`), so that the
    recomputed FLOPs are fewest and the peak memory fits the budget; then compiles the plan
    and measures it, re-solving with a tighter model budget if the measured peak is over.

    Args:
      fn: a function returning a scalar loss; its scans are planned.
      *args: its arguments (pytrees of arrays).
      budget: bytes (``int``), a size with a unit (``"6GiB"``, ``"512MiB"``), or a fraction
        of the un-checkpointed peak (``0.5`` or ``"50%"``).
      argnums: which positional arguments are differentiated, as in `jax.grad`.
      schedules: also consider `Nested` and `Binomial` schedules (else only ``per_step``);
        each is compiled once to calibrate what it keeps. A `Binomial` step saves all its
        residuals while it is reversed; below the memory of recomputing every step, only
        these schedules fit.
      max_rounds: the most solve-and-measure rounds.
      device_memory: the device's memory in bytes; a budget above it is refused. ``None``
        reads it from the backend (``memory_stats()['bytes_limit']``) where it says (GPU,
        TPU); the CPU backend does not, and then no upper limit is checked.
      offload: also consider keeping saved values in host memory (see `remat._core._offload`),
        at a cost of ``2 * bytes / host_bandwidth`` seconds each, weighed against
        recomputation at the device's measured matmul rate. Only where the device has a
        host memory space of its own; elsewhere (e.g. on CPU) a `RematWarning` says why and
        the plan is made without offloading.
      host_bandwidth: device-to-host bytes per second, each way (default 25e9, PCIe 4.0).
      verbose: show what the plan is doing on stderr (tracing, calibrating, solving,
        verifying round k, with the elapsed time) once it has taken more than 2 s; only
        where stderr is a terminal.

    What is learned about a program (the baseline, the calibration, every plan compiled) is
    kept in memory by its fingerprint: planning it again at another budget compiles the
    whole step once more at most, and never returns a plan worse than one compiled before.

    For arguments sharded over a mesh (or a ``jax.jit`` with ``in_shardings``), the budget
    and every memory number are per device, as XLA's memory analysis of the SPMD program.

    Returns:
      A `remat.Plan`; ``plan.fn`` takes ``fn``'s arguments and returns the same values and
      gradients.

    Raises:
      InfeasibleBudget: when no plan's measured peak fits ``budget``; the message gives the
        smallest peak reached.
      ValueError: for an unparseable budget, or a function without a scan.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
      ...     return (x**2).sum()
      >>> ws, x = jnp.ones((8, 16, 16)) * 0.1, jnp.ones((256, 16))
      >>> p = remat.plan(loss, ws, x, budget="60%")
      >>> p.measured_peak_bytes <= p.budget_bytes
      True
      >>> "measured peak" in p.explain()
      True
      >>> g = jax.grad(p.fn)(ws, x)
      >>> bool(jnp.allclose(g, jax.grad(loss)(ws, x), rtol=1e-5, atol=1e-6))
      True
    """
    if not callable(fn):
        raise TypeError(f"`remat.plan` got fn={fn!r}, which is not callable; pass the loss.")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"`remat.plan` got max_rounds={max_rounds!r}; pass an int >= 1.")
    budget = read_budget(budget)  # a malformed budget fails before compiling
    offload = _offload_wanted(offload, host_bandwidth)
    if device_memory is None:
        device_memory = device_memory_bytes()
    progress = Progress(verbose)
    since = (tally(), time.perf_counter())
    try:
        know = knowledge(fn, args, argnums, schedules, host_bandwidth if offload else None,
                         progress)  # fmt: skip
        return plan_prepared(
            know.prepared, budget, max_rounds, device_memory, know, progress, since
        )
    finally:
        progress.close()


def knowledge(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None,
    progress: Any = None,
) -> Knowledge:
    """What is known about the program ``fn`` traces to at ``args``: from memory (`_memo`)
    when it was planned before in this process, else prepared (`prepare`) and remembered."""
    argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    key = None
    with contextlib.suppress(Exception):  # not traceable as given: `prepare` says why
        key = key_of(fingerprint(fn, *args), argnums, schedules, host_bandwidth)
    know = recall(key, fn, args) if key is not None else None
    if know is None:
        know = Knowledge(prepare(fn, args, argnums, schedules, host_bandwidth, progress))
        if key is not None:
            remember(key, know)
    return know


def _offload_wanted(offload: bool, host_bandwidth: float) -> bool:
    """Whether to offer offloading: asked for, and the device has host memory to use."""
    transfer_seconds(0, host_bandwidth)  # validates the bandwidth
    if not offload:
        return False
    reason = offload_unavailable_reason()
    if reason is not None:
        warnings.warn(_NO_OFFLOAD.format(reason=reason), RematWarning, stacklevel=3)
        return False
    return True


def plan_budgets(
    fn: Callable[..., Any],
    *args: Any,
    budgets: Sequence[Any],
    argnums: int | Sequence[int] = 0,
    schedules: bool = True,
    max_rounds: int = 4,
    verbose: bool = True,
) -> list[Plan | InfeasibleBudget]:
    """`plan` at several budgets, sharing the tracing, the calibration and every compiled
    plan (a plan compiled for one budget competes at the others).

    Returns one `Plan` per budget, or the `InfeasibleBudget` error where none fits.
    """
    budgets = [read_budget(b) for b in budgets]
    progress = Progress(verbose)
    out: list[Plan | InfeasibleBudget] = []
    since: tuple[Any, ...] | None = (tally(), time.perf_counter())
    try:
        know = knowledge(fn, args, argnums, schedules, None, progress)
        for budget in budgets:  # the first plan's stats include the shared preparation
            try:
                out.append(
                    plan_prepared(know.prepared, budget, max_rounds, None, know, progress, since)
                )
            except InfeasibleBudget as err:
                out.append(err)
            since = None
    finally:
        progress.close()
    return out
