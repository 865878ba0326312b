"""`remat.plan`: the cheapest checkpointing of a gradient step that fits a memory budget.

Trace → cost model → solve → rewrite → compile and measure:

1. ``fn`` is traced and each scan not inside another scan gets a cost model (`_costmodel`):
   its body as a graph of values with bytes, FLOPs and what the backward pass needs.
2. Each scan gets a few schedules (``per_step``, `remat.Nested`, `remat.Binomial`, and
   per-layer save sets alternating every other layer: `_perlayer`), and one
   mixed-integer program (`_milp`, Checkmate-style; Jain et al., MLSys 2020) chooses, for all
   scans together, the schedule and the set of values to save that recompute the fewest
   FLOPs within the budget.
3. The un-checkpointed step is compiled once (the budget's reference); the memory model is
   calibrated on each scan compiled on its own, a few steps long (`_calibrate.scan_fit`):
   what a step adds, the scan's fixed memory, and how much of one step's saved and
   recomputed values is live at once. A `remat.Nested` or `remat.Binomial` option is
   charged what it keeps beyond the fit the first time a candidate uses it.
4. Each candidate is checked on its scans alone, then the whole step is compiled and
   measured (`_rounds`): the first verified plan gives the memory outside the scans; a
   candidate over the budget is excluded and the program solved again, at most two rounds
   compiling the step when a plan that fits is known. Every point compiled for the program
   (calibration points included) competes, and what was learned is kept by the program's
   fingerprint (`_memo`) for the next budget. If nothing fits, `InfeasibleBudget` says how
   close it came.

Measured FLOPs are matmul FLOPs read from the optimised HLO with loop trip counts, exact for
every schedule (a `remat.Binomial` backward sweep names its data-dependent trip counts for
the reader, see `remat._core._flop_tags`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._core._budget import device_memory_bytes, read_budget
from .._core._errors import brief
from .._core._offload import (
    HOST_BANDWIDTH,
    compiling_for,
    offload_unavailable_reason,
    transfer_seconds,
)
from .._core._warnings import RematWarning
from .._measure._step import Step, argnums_of, as_step
from .._shard._target import as_target, compile_device, offload_rates, placement
from .._trace._eqx import has_modules, taking_modules, with_modules_split
from .._trace._traced import traced_once
from ._args import (
    check_bool,
    check_device_memory,
    check_host_bandwidth,
    check_max_rounds,
    check_strategies,
    read_budgets,
    read_saved,
)
from ._calibrate import check_inputs, prepare
from ._compile import tally
from ._memo import Knowledge, kept, key_of
from ._mixes import finished
from ._progress import Progress
from ._result import InfeasibleBudget, Plan, fingerprint
from ._rounds import plan_prepared
from ._unrolled import plan_unrolled, plans_rolled

_NO_OFFLOAD = "`remat.plan` got offload=True, but {reason}; planning without offloading."


def plan(
    fn: Callable[..., Any],
    *args: Any,
    budget: int | float | str,
    argnums: int | Sequence[int] = 0,
    schedules: bool = True,
    per_layer: bool = False,
    max_rounds: int = 4,
    device_memory: int | None = None,
    offload: bool = False,
    host_bandwidth: float | None = None,
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
    verbose: bool = True,
    target: Any = None,
    strategies: Sequence[str] = (),
    saved: int | float | str | None = None,
) -> Plan:
    """Plans the cheapest checkpointing of ``jax.value_and_grad(fn)`` within ``budget``.

    Chooses, for every scan of ``fn`` (layer stacks, recurrences) that is not inside another
    scan, which values of its body to save and which to recompute in the backward pass, and
    how to schedule the scan (``per_step``, `remat.Nested`, `remat.Binomial`), so that the
    recomputed FLOPs are fewest and the peak memory fits the budget; then compiles the plan
    and measures it, re-solving with a tighter model budget if the measured peak is over.

    Args:
      fn: a function returning a scalar loss; its scans are planned.
      *args: its arguments: pytrees of arrays, or of `jax.ShapeDtypeStruct` s (with
        ``sharding=`` on a mesh) for a model too large to hold here. The planner compiles
        and reads memory and FLOPs, and never runs the step, so a plan made from shapes is
        the plan made from arrays of those shapes (``plan.to_json`` carries it to the
        machine that holds the values; ``explain()`` names the backend it was checked on).
      budget: bytes (``int``), a size with a unit (``"6GiB"``, ``"512MiB"``), or a fraction
        of the un-checkpointed peak (``0.5`` or ``"50%"``).
      argnums: which positional arguments are differentiated, as in `jax.grad`.
      schedules: also consider `Nested` and `Binomial` schedules (else one ``per_step``
        save set per scan); each is compiled once to calibrate what it keeps. A `Binomial`
        step saves all its residuals while it is reversed; below the memory of recomputing
        every step, only these schedules fit.
      per_layer: also consider mixes of two save sets over the layers of a scan: ``c`` of
        its ``L`` layers saving one set and the others another, for every ``c`` (15 counts
        spread over the scan beyond 16 layers), run as two segments of the scan, one loop
        each (`Plan.position_policy`; `remat._plan._perlayer`,
        `remat._trace._periodic.segments`). They compete only against the uniform plan
        verified first, so they never recompute more. Off by default: a per-layer scan
        differentiates in reverse mode only (its custom VJP), its step compiles two loop
        bodies instead of one, and planning with it takes longer (`benchmarks/perlayer_bench.py`).
      max_rounds: the most solve-and-measure rounds.
      device_memory: the device's memory in bytes; a budget above it is refused. ``None``
        reads it from the backend (``memory_stats()['bytes_limit']``) where it says (GPU,
        TPU); the CPU backend does not, and then no upper limit is checked. With a
        ``target``: its chip's memory (`remat.Target.hbm_bytes`).
      offload: also consider keeping saved values in host memory (see `remat._core._offload`),
        at a cost of ``2 * bytes / host_bandwidth`` seconds each, weighed against
        recomputation at the device's measured matmul rate (on a ``target``: its chip's peak
        bf16 rate, `remat.Target.flops_per_second`). Only where the device has a host memory
        space of its own; elsewhere (e.g. on CPU) a `RematWarning` says why and the plan is
        made without offloading.
      host_bandwidth: device-to-host bytes per second, each way; ``None``: a ``target``
        chip's host link (`remat.Target.host_bandwidth`, 1.5e10), else 25e9 (PCIe 4.0).
      has_aux: ``fn`` returns ``(loss, aux)``, as in `jax.value_and_grad`; ``plan.fn``
        returns the same pair.
      optimizer: an optax ``GradientTransformation``: the budget is the peak of the whole
        training step (value and gradient, ``optimizer.update``, ``optax.apply_updates``,
        parameters and optimizer state donated), and ``plan.step(params, opt_state, *rest)``
        runs that step, returning ``(params, opt_state, loss)``. ``argnums`` must be one int.
      roll: for a program with layers in a Python loop (beside scans of its own or not),
        plan it with its repeated layers rolled into scans, numbered after its own, unless
        it fits the budget as written (see `remat._plan._unrolled`); the budget's fraction
        and the FLOPs are relative to the program as written, and ``Plan.rolled`` says which
        was chosen. False plans only the program's own scans.
      verbose: show what the plan is doing on stderr (tracing, calibrating, solving,
        verifying round k, with the elapsed time) once it has taken more than 2 s; only
        where stderr is a terminal.
      target: plan for this TPU slice instead of this machine's devices: a `remat.Target`
        or its name (``"tpu:v5e:2x2"``); the arguments are placed on it
        (`remat.Target.place`) and every calibration and verification compile is the TPU
        compiler's. The plan applies to the step run on that slice.
      strategies: save sets to compile and measure beside the plan's own candidates, each
        on every scan: ``"full"``, ``"dots"``, ``"everything"``, or ``"names:a,b"`` (the
        values the program names ``a`` and ``b`` with ``jax.ad_checkpoint.checkpoint_name``).
        The plan returned is never dearer, by measured FLOPs, than the cheapest of them
        that fits. Give the save sets you would otherwise use (MaxText's ``remat_policy``
        presets): near a TPU chip's memory the compiler recomputes values of its own
        accord, by amounts no cost model sees, so a save set the model ranks dearer can
        compile cheaper (docs/tpu.md). One whose model FLOPs already reach the cheapest
        plan measured is not compiled.
      saved: also cap the bytes the step saves for its backward pass (its residuals beside
        the arguments, `remat.Measurement.residuals`: what torch's activation memory budget
        counts): bytes, a size (``"40MiB"``), or a fraction of what the un-checkpointed step
        saves (``"25%"``). The plan is the cheapest found that fits both the budget and the
        cap, whose candidates are compiled and their residuals read (`remat._plan._saved`);
        ``None``: no cap. Among plans that cost the same FLOPs the smaller peak is returned
        in any case.

    What is learned about a program (the baseline, the calibration, every plan compiled) is
    kept in memory by its fingerprint: planning it again at another budget compiles the
    whole step once more (twice only when the plan it compiles measures over the budget),
    and never returns a plan worse than one compiled before.

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
        raise TypeError(f"`remat.plan` got fn={brief(fn)}, which is not callable; pass the loss.")
    compile_target = as_target(target, "remat.plan")
    # Every argument is checked before anything is traced or compiled.
    check_max_rounds(max_rounds)
    budget = read_budget(budget, sensible=True)
    check_bool(schedules, "schedules")
    check_bool(per_layer, "per_layer")
    check_bool(offload, "offload")
    check_bool(verbose, "verbose")
    strategies = check_strategies(strategies)
    saved = read_saved(saved, "remat.plan")
    device_memory = check_device_memory(device_memory)
    if host_bandwidth is not None:
        host_bandwidth = check_host_bandwidth(host_bandwidth)
    if device_memory is None:
        device_memory = (
            device_memory_bytes() if compile_target is None else compile_target.hbm_bytes
        )
    spec = _step_spec(argnums, has_aux, optimizer)
    if compile_target is not None:
        args = compile_target.place(args, argnums_of(spec), "remat.plan")
    if host_bandwidth is None:
        rates = offload_rates(compile_device(args))
        host_bandwidth = rates[1] if rates else HOST_BANDWIDTH
    offload = _offload_wanted(offload, host_bandwidth, compile_device(args))
    bandwidth = host_bandwidth if offload else None
    user = fn if has_modules(args) else None  # Equinox modules, split (see `_trace._eqx`)
    fn, args = with_modules_split(fn, args)
    check_inputs(fn, args, spec)  # before `plans_rolled` traces ``fn``
    progress = Progress(verbose)
    since = (tally(), time.perf_counter())
    with (
        no_cyclic_gc(),
        traced_once(),
        compiling_for(compile_device(args)),
        contextlib.closing(progress),
    ):
        if roll and plans_rolled(fn, args):
            (result,) = plan_unrolled(fn, args, [budget], spec, schedules, max_rounds,
                                      device_memory, bandwidth, progress,
                                      per_layer=per_layer, strategies=strategies,
                                      saved=saved)  # fmt: skip
            if isinstance(result, InfeasibleBudget):
                raise result
            return _finished(result, spec, user)
        know = knowledge(fn, args, spec, schedules, bandwidth, progress, per_layer)
        with finished(know):  # no thread of it left running (`_mixes`)
            plan_ = plan_prepared(know.prepared, budget, max_rounds, device_memory, know,
                                  progress, since, strategies, saved)  # fmt: skip
        return _finished(plan_, spec, user)


def knowledge(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None,
    progress: Any = None,
    per_layer: bool = False,
) -> Knowledge:
    """What is known about the program ``fn`` traces to at ``args``: from memory (`_memo`)
    when it was planned before in this process, else prepared (`prepare`) and remembered.
    ``argnums`` may be a `Step` (aux outputs, an optimizer's step): it is part of the key."""
    if not isinstance(argnums, Step):
        argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    return kept(
        lambda: key_of(
            fingerprint(fn, *args), argnums, schedules, host_bandwidth, placement(args), per_layer
        ),
        fn,
        args,
        # The per-layer options are found beside the uniform rounds (`_mixes`).
        lambda: Knowledge(
            prepare(
                fn,
                args,
                argnums,
                schedules,
                host_bandwidth,
                progress,
                per_layer=per_layer,
                later=True,
            )
        ),
    )


@contextlib.contextmanager
def no_cyclic_gc():
    """Python's cyclic garbage collector paused while a plan traces and lowers (restored as
    it was after). Tracing makes many short-lived objects, and each full collection walks
    every object of the process (the model's, JAX's caches, compiled programs): on the demo
    GPT planned in a process that had compiled a few steps before, 0.7 s of 7.3 s."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _step_spec(argnums: Any, has_aux: bool, optimizer: Any) -> Any:
    """``argnums`` itself for a plain gradient step, else the `Step` that describes it."""
    if not has_aux and optimizer is None:
        return argnums
    argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    return as_step(Step(argnums, bool(has_aux), optimizer), "remat.plan")


def _finished(result: Plan, spec: Any, user: Callable[..., Any] | None = None) -> Plan:
    """The plan with its step's description as plain fields (``argnums`` as JSON data), and
    ``plan.fn`` taking Equinox modules as ``user`` (the caller's ``fn``, when its arguments
    held modules, split for planning: `_trace._eqx`) takes them."""
    if user is not None:
        result = dataclasses.replace(result, fn=taking_modules(result.fn, user))
    if not isinstance(spec, Step):
        return result
    return dataclasses.replace(
        result, argnums=spec.argnums, has_aux=spec.has_aux, optimizer=spec.optimizer
    )


def _offload_wanted(offload: bool, host_bandwidth: float, device: Any = None) -> bool:
    """Whether to offer offloading: asked for, and the device the step compiles for (the
    arguments', e.g. a `remat.Target`'s; default this machine's) has host memory to use."""
    transfer_seconds(0, host_bandwidth)  # validates the bandwidth
    if not offload:
        return False
    reason = offload_unavailable_reason(device)
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
    per_layer: bool = False,
    max_rounds: int = 4,
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
    verbose: bool = True,
    target: Any = None,
    strategies: Sequence[str] = (),
    saved: int | float | str | None = None,
) -> list[Plan | InfeasibleBudget]:
    """`remat.plan` at several budgets at once, sharing the tracing, the calibration and
    every compiled plan (a plan compiled for one budget competes at the others).

    Cheaper than one `remat.plan` call per budget, and a budget that cannot be met does not
    stop the others: its entry is the `remat.InfeasibleBudget` error instead of a plan.

    Args:
      fn: the loss, as for `remat.plan`.
      *args: its arguments.
      budgets: the budgets, each as `remat.plan`'s ``budget`` (bytes, ``"512MiB"``,
        ``"50%"`` or a fraction of the un-checkpointed peak); all are checked before anything
        is compiled.
      argnums, schedules, per_layer, max_rounds, has_aux, optimizer, roll, verbose, target,
        strategies, saved: as for `remat.plan` (``target`` compiles for a TPU slice; each of
        ``strategies`` is compiled once, and competes at every budget; ``saved`` caps every
        budget's plan).

    Returns:
      One entry per budget, in order: a `remat.Plan`, or the `remat.InfeasibleBudget` error
      (not raised) where no plan fits.

    Raises:
      ValueError: a budget that is not a budget (before anything is compiled).

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):  # 6 layers stacked with a scan
      ...     return jax.lax.scan(lambda c, w: (jnp.sin(c @ w), None), x, ws)[0].sum()
      >>> ws, x = jnp.full((6, 16, 16), 0.1), jnp.ones((256, 16))
      >>> plans = remat.plan_budgets(loss, ws, x, budgets=["90%", "1KiB"], verbose=False)
      >>> plans[0].measured_peak_bytes <= plans[0].budget_bytes
      True
      >>> type(plans[1]).__name__, "cannot fit budget" in str(plans[1])
      ('InfeasibleBudget', True)
    """
    if not callable(fn):
        raise TypeError(
            f"`remat.plan_budgets` got fn={brief(fn)}, which is not callable; pass the loss."
        )
    compile_target = as_target(target, "remat.plan_budgets")
    read = read_budgets(budgets)  # every budget is checked before anything is compiled
    check_bool(schedules, "schedules", "remat.plan_budgets")
    check_bool(per_layer, "per_layer", "remat.plan_budgets")
    check_max_rounds(max_rounds, "remat.plan_budgets")
    check_bool(verbose, "verbose", "remat.plan_budgets")
    strategies = check_strategies(strategies, "remat.plan_budgets")
    saved = read_saved(saved, "remat.plan_budgets")
    spec = _step_spec(argnums, has_aux, optimizer)
    if compile_target is not None:
        args = compile_target.place(args, argnums_of(spec), "remat.plan_budgets")
    user = fn if has_modules(args) else None
    fn, args = with_modules_split(fn, args)
    check_inputs(fn, args, spec)
    progress = Progress(verbose)
    out: list[Plan | InfeasibleBudget] = []
    since: tuple[Any, ...] | None = (tally(), time.perf_counter())
    with (
        no_cyclic_gc(),
        traced_once(),
        compiling_for(compile_device(args)),
        contextlib.closing(progress),
    ):
        if roll and plans_rolled(fn, args):
            planned = plan_unrolled(fn, args, read, spec, schedules, max_rounds, None, None,
                                    progress, per_layer=per_layer,
                                    strategies=strategies, saved=saved)  # fmt: skip
            return [p if isinstance(p, InfeasibleBudget) else _finished(p, spec, user)
                    for p in planned]  # fmt: skip
        know = knowledge(fn, args, spec, schedules, None, progress, per_layer)
        with finished(know):  # no thread of it left running (`_mixes`)
            for budget in read:  # the first plan's stats include the shared preparation
                try:
                    plan_ = plan_prepared(know.prepared, budget, max_rounds, None, know,
                                          progress, since, strategies, saved)  # fmt: skip
                    out.append(_finished(plan_, spec, user))
                except InfeasibleBudget as err:
                    out.append(err)
                since = None
    return out
