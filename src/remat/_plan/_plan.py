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

Measured FLOPs are matmul FLOPs read from the optimised HLO with loop trip counts, exact for
every schedule (a `remat.Binomial` backward sweep names its data-dependent trip counts for
the reader, see `remat._core._flop_tags`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._core._budget import device_memory_bytes, read_budget
from .._core._offload import HOST_BANDWIDTH, offload_unavailable_reason, transfer_seconds
from .._core._warnings import RematWarning
from .._measure._step import Step, as_step
from ._args import (
    check_bool,
    check_device_memory,
    check_host_bandwidth,
    check_max_rounds,
    read_budgets,
)
from ._calibrate import prepare
from ._result import InfeasibleBudget, Plan
from ._rounds import plan_prepared
from ._unrolled import has_scans, plan_unrolled

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
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
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
      has_aux: ``fn`` returns ``(loss, aux)``, as in `jax.value_and_grad`; ``plan.fn``
        returns the same pair.
      optimizer: an optax ``GradientTransformation``: the budget is the peak of the whole
        training step (value and gradient, ``optimizer.update``, ``optax.apply_updates``,
        parameters and optimizer state donated), and ``plan.step(params, opt_state, *rest)``
        runs that step, returning ``(params, opt_state, loss)``. ``argnums`` must be one int.
      roll: for a program without any scan (layers in a Python loop), plan it with its
        repeated layers rolled into scans, unless it fits the budget as written (see
        `remat._plan._unrolled`); the budget's fraction and the FLOPs are relative to the
        program as written, and ``Plan.rolled`` says which was chosen. False plans only
        the program's own scans.

    For arguments sharded over a mesh (or a ``jax.jit`` with ``in_shardings``), the budget
    and every memory number are per device, as XLA's memory analysis of the SPMD program.

    Returns:
      A `remat.Plan`; ``plan.fn`` takes ``fn``'s arguments and returns the same values and
      gradients.

    Raises:
      InfeasibleBudget: when no plan's measured peak fits ``budget``; the message gives the
        smallest peak reached.
      ValueError: for an unparseable budget, or a function without a scan (and, with
        ``roll=True``, without repeated layers to roll; the message says why).

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
    # Every argument is checked before anything is traced or compiled.
    check_max_rounds(max_rounds)
    budget = read_budget(budget, sensible=True)
    check_bool(schedules, "schedules")
    check_bool(offload, "offload")
    device_memory = check_device_memory(device_memory)
    host_bandwidth = check_host_bandwidth(host_bandwidth)
    offload = _offload_wanted(offload, host_bandwidth)
    if device_memory is None:
        device_memory = device_memory_bytes()
    spec = _step_spec(argnums, has_aux, optimizer)
    bandwidth = host_bandwidth if offload else None
    _check_plan_args(args, spec)  # before anything is traced (`has_scans` traces)
    if roll and not has_scans(fn, args):
        (result,) = plan_unrolled(
            fn, args, [budget], spec, schedules, max_rounds, device_memory, bandwidth
        )
        if isinstance(result, InfeasibleBudget):
            raise result
        return _finished(result, spec)
    prepared = prepare(fn, args, spec, schedules, bandwidth)
    return _finished(plan_prepared(prepared, budget, max_rounds, device_memory), spec)


def _check_plan_args(args: Sequence[Any], spec: Any) -> None:
    """`remat.measure`'s checks of the arguments, named for `remat.plan`."""
    from .._measure._measure import _check_args

    argnums = spec if isinstance(spec, Step | int) else tuple(spec)
    try:
        _check_args(args, argnums, 0)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err).replace("`remat.measure`", "`remat.plan`")) from None


def _step_spec(argnums: Any, has_aux: bool, optimizer: Any) -> Any:
    """``argnums`` itself for a plain gradient step, else the `Step` that describes it."""
    if not has_aux and optimizer is None:
        return argnums
    argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    return as_step(Step(argnums, bool(has_aux), optimizer), "remat.plan")


def _finished(result: Plan, spec: Any) -> Plan:
    """The plan with its step's description as plain fields (``argnums`` as JSON data)."""
    if not isinstance(spec, Step):
        return result
    return dataclasses.replace(
        result, argnums=spec.argnums, has_aux=spec.has_aux, optimizer=spec.optimizer
    )


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
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
) -> list[Plan | InfeasibleBudget]:
    """`plan` at several budgets, sharing the tracing, modelling and calibration compiles.

    Returns one `Plan` per budget, or the `InfeasibleBudget` error where none fits.
    """
    if not callable(fn):
        raise TypeError(f"`plan_budgets` got fn={fn!r}, which is not callable; pass the loss.")
    read = read_budgets(budgets)  # every budget is checked before anything is compiled
    check_bool(schedules, "schedules", "plan_budgets")
    check_max_rounds(max_rounds, "plan_budgets")
    spec = _step_spec(argnums, has_aux, optimizer)
    if roll and not has_scans(fn, args):
        planned = plan_unrolled(fn, args, read, spec, schedules, max_rounds, None)
        return [p if isinstance(p, InfeasibleBudget) else _finished(p, spec) for p in planned]
    prep = prepare(fn, args, spec, schedules)
    out: list[Plan | InfeasibleBudget] = []
    for budget in read:
        try:
            out.append(_finished(plan_prepared(prep, budget, max_rounds), spec))
        except InfeasibleBudget as err:
            out.append(err)
    return out
