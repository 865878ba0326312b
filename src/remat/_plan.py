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

import dataclasses
import hashlib
import io
import json
import os
import re
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from ._budget import device_memory_bytes, format_bytes, parse_budget
from ._costmodel import ScanModel, model_scans
from ._io import atomic_write_text
from ._measure import _check_args, _check_scalar
from ._measurement import Measurement
from ._milp import Node, Option, solve
from ._offload import HOST_BANDWIDTH, offload_unavailable_reason, transfer_seconds
from ._plan_json import PLAN_FORMAT, encode_schedule, plain
from ._plan_measure import compile_measure, light_peak, peak_of
from ._plan_options import (
    Candidate,
    ScanPlan,
    assemble,
    candidates,
    decode,
    fixed_choice,
    offload_costs,
)
from ._schedule import Binomial, Nested, Schedule
from ._shard_counts import scan_input_splits
from ._tag import planned_scans, rewrite
from ._warnings import RematWarning

_NO_OFFLOAD = "`remat.plan` got offload=True, but {reason}; planning without offloading."
_ABSTRACT = (
    "`remat.plan` got a `jax.ShapeDtypeStruct` argument; the planner traces the function with "
    "its arguments' values' shapes and shardings, so pass arrays (on a mesh: "
    "`jax.device_put(x, sharding)`, or `jax.make_array_from_process_local_data`)."
)
_NO_SCAN = (
    "`remat.plan` found no `scan` in {name}. The planner chooses what each scan step saves; "
    "put the layers in a `jax.lax.scan` (or `flax.linen.scan` / `nnx.scan`), or use "
    "`remat.apply(fn, strategy)` for a whole-function checkpoint."
)
_INFEASIBLE = (
    "`remat.plan` cannot fit budget {budget} ({budget_bytes} bytes): the smallest peak the "
    "planner reached is {smallest} ({smallest_bytes} bytes, {fraction:.0%} of the "
    "un-checkpointed peak {baseline}). Raise the budget to at least {smallest}, or reduce "
    "what lives outside the scans (batch size, parameters, vocabulary)."
)


# The memory model (fitted by `calibrate` on two compiled points) is
#   peak = base + stored_weight * (saved bytes + SLICE_WEIGHT * one step's saved bytes)
#          + transient_weight * (one step's materialised recomputed bytes)
# The backward pass of a step reads its saved values out of the stacked per-step buffers into
# buffers of its own, so one step's saved values are live twice (measured on the demo GPT:
# with every needed value saved, the memory beyond parameters, gradients and saved values is
# 18.3 MiB for 20.0 MiB of one step's saved values). Without this term the memory that the
# all-saved calibration point shows was charged to every plan, and plans that save a few
# values per step were overestimated by up to 25%.
SLICE_WEIGHT = 1.0
MAX_TRANSIENT_WEIGHT = 2.0
# Among equally cheap measured plans (one per calibrated fit), `plan` prefers one whose
# prediction was within this fraction of its measured peak: a plan the model explains. On the
# MLP-Mixer at 25% one fit's rounds end with a plan predicted 12% high (its rounds were
# corrected by an optimistic first round) and the other's with an equally cheap plan predicted
# within 8%, 0.25 MiB (1%) larger; the second is kept.
ACCURATE = 0.10


class InfeasibleBudget(ValueError):
    """No plan fits the memory budget.

    Attributes:
      budget_bytes: the budget asked for, in bytes.
      smallest_peak_bytes: the smallest measured peak the planner reached.
      baseline_peak_bytes: the un-checkpointed peak.
    """

    def __init__(self, budget: Any, budget_bytes: int, smallest: int, baseline: int):
        super().__init__(
            _INFEASIBLE.format(
                budget=budget,
                budget_bytes=budget_bytes,
                smallest=format_bytes(smallest),
                smallest_bytes=smallest,
                fraction=smallest / baseline if baseline else 0.0,
                baseline=format_bytes(baseline),
            )
        )
        self.budget_bytes = budget_bytes
        self.smallest_peak_bytes = smallest
        self.baseline_peak_bytes = baseline


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checkpointing plan: the rewritten function and why it was chosen.

    Attributes:
      fn: ``fn`` rewritten by the plan: same signature, same values and gradients.
      scans: one `ScanPlan` per planned scan.
      budget_bytes: the budget the plan was made for.
      predicted_peak_bytes: the peak memory the calibrated model predicted for the plan
        before compiling it (corrected by the measured rounds before it, if any).
      measured: the plan's `remat.Measurement` (``None`` for a plan loaded without one).
      baseline_peak_bytes: the un-checkpointed gradient step's peak.
      baseline_flops: the un-checkpointed gradient step's matmul FLOPs.
      solve_seconds: seconds spent modelling and solving, without the compiles.
      rounds: solve-and-measure rounds it took.
      fingerprint: hash of the traced program the plan is for (see `load_plan`).
    """

    fn: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    scans: tuple[ScanPlan, ...]
    budget_bytes: int
    predicted_peak_bytes: int
    measured: Measurement | None
    baseline_peak_bytes: int
    baseline_flops: float
    solve_seconds: float
    rounds: int
    fingerprint: str
    argnums: int | tuple[int, ...] = 0

    @property
    def measured_peak_bytes(self) -> int | None:
        """The measured peak (``None`` without a measurement)."""
        return None if self.measured is None else peak_of(self.measured)

    @property
    def flops_ratio(self) -> float | None:
        """Measured matmul FLOPs relative to the un-checkpointed step."""
        if self.measured is None or not self.baseline_flops:
            return None
        return self.measured.flops / self.baseline_flops

    def table(self):
        """The explanation as a `rich` renderable (see `explain`)."""
        from ._plan_explain import plan_table

        return plan_table(self)

    def explain(self, width: int = 110) -> str:
        """A readable account of the plan: per scan, the schedule and each saved value.

        Per scan: its source, length, schedule and recomputed FLOPs, and a table of the values
        saved at each step (checkpoint name, primitive, shape, bytes × copies, source line);
        then the budget, the predicted and the measured peak, the step's FLOPs relative to no
        checkpointing and the solve time. `remat.plan`'s example shows it.
        """
        from rich.console import Console

        console = Console(width=width, record=True, file=io.StringIO())
        console.print(self.table())
        return console.export_text()

    def __str__(self) -> str:
        return self.explain()

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (without ``fn``)."""
        data = {
            "format": PLAN_FORMAT,
            **{
                f.name: plain(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name not in ("fn", "scans", "measured")
            },
            "scans": [
                {
                    **plain(dataclasses.replace(s, schedule="per_step")),
                    "schedule": encode_schedule(s.schedule),
                }
                for s in self.scans
            ],
            "measured": None if self.measured is None else plain(self.measured),
        }
        return data

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes the plan to ``path`` as JSON, atomically; reload it with `remat.load_plan`."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))


### Fingerprints


def fingerprint(fn: Callable[..., Any], *args: Any) -> str:
    """A hash of the program ``fn`` traces to at ``args`` (equations, shapes, dtypes).

    Source locations are not part of it, so moving code around keeps a plan valid.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._plan import fingerprint
      >>> fingerprint(jnp.sin, jnp.ones(3)) == fingerprint(jnp.sin, jnp.ones(3))
      True
      >>> fingerprint(jnp.sin, jnp.ones(3)) == fingerprint(jnp.cos, jnp.ones(3))
      False
    """
    text = str(jax.make_jaxpr(fn)(*args))
    text = re.sub(r"0x[0-9a-f]+", "0x", text)  # object addresses in reprs
    return hashlib.sha256(text.encode()).hexdigest()[:16]


### Main API


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
      offload: also consider keeping saved values in host memory (see `remat._offload`),
        at a cost of ``2 * bytes / host_bandwidth`` seconds each, weighed against
        recomputation at the device's measured matmul rate. Only where the device has a
        host memory space of its own; elsewhere (e.g. on CPU) a `RematWarning` says why and
        the plan is made without offloading.
      host_bandwidth: device-to-host bytes per second, each way (default 25e9, PCIe 4.0).

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
    parse_budget(budget, baseline_peak=2**62)  # a malformed budget fails before compiling
    offload = _offload_wanted(offload, host_bandwidth)
    if device_memory is None:
        device_memory = device_memory_bytes()
    prepared = _prepare(fn, args, argnums, schedules, host_bandwidth if offload else None)
    return _plan_prepared(prepared, budget, max_rounds, device_memory)


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


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """Everything about a program the planner needs that does not depend on the budget."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    argnums: Any
    baseline: Measurement
    models: tuple[ScanModel, ...]
    cands: tuple[Candidate, ...]
    nodes: tuple[Node, ...]
    options: tuple[Option, ...]
    offsets: tuple[int, ...]
    base: float  # calibrated memory outside the modelled choice
    slice: float  # calibrated factor on one step's copy of the saved values
    weight: float  # calibrated fraction of the transient memory that is live
    stored: float  # calibrated factor on stored bytes
    # (base, stored, slice, weight) of each calibrated memory model; the planner solves with
    # each and keeps the best measured plan (see `_plan_prepared`).
    fits: tuple[tuple[float, float, float, float], ...]
    smallest: int  # the smaller calibration peak
    # Per fit, per option: bytes the schedule costs beyond what the fit predicts, measured on
    # the compiled program (see `option_offsets`); zero for ``per_step`` options.
    option_extra: tuple[tuple[float, ...], ...]
    calibration: tuple[tuple[Any, int], ...]  # (Choice, measured peak) of the two points
    fingerprint: str
    model_seconds: float


def _prepare(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None = None,
):
    argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(args)):
        raise TypeError(_ABSTRACT)
    try:  # the same checks as `remat.measure`, named for `remat.plan`
        _check_args(args, argnums, 0)
        _check_scalar(fn, args)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err).replace("`remat.measure`", "`remat.plan`")) from None
    clock = time.perf_counter()
    infos = planned_scans(fn, *args)
    if not infos:
        raise ValueError(_NO_SCAN.format(name=f"`{getattr(fn, '__qualname__', repr(fn))}`"))
    # Sharded arguments, or a jit with in/out shardings: count values per device.
    splits, devices = scan_input_splits(fn, *args)
    models = model_scans(infos, splits if devices > 1 else None, devices)
    cands = candidates(models, schedules)
    nodes, options, offsets = assemble(cands)
    if host_bandwidth is not None:  # offloading offered (see `_offload_wanted`)
        nodes = offload_costs(nodes, cands, offsets, models, host_bandwidth)
    print_ = fingerprint(fn, *args)
    model_seconds = time.perf_counter() - clock
    baseline = compile_measure(fn, args, argnums, "none", None)

    # Calibration: every needed value saved (no transient) and nothing saved (all transient).
    per_step = [o for o, c in enumerate(cands) if c.schedule == "per_step"]
    everything = fixed_choice(cands, offsets, models, per_step, save=True)
    nothing = fixed_choice(cands, offsets, models, per_step, save=False)
    peak_all = light_peak(rewrite(fn, everything.choices), args, argnums)
    peak_none = light_peak(rewrite(fn, nothing.choices), args, argnums)
    # The stored term includes one step's copy of the saved values (see `SLICE_WEIGHT`).
    base, stored, weight = calibrate(
        peak_all, everything.stored + SLICE_WEIGHT * everything.sliced + everything.transient,
        peak_none, nothing.stored + SLICE_WEIGHT * nothing.sliced, nothing.transient,
    )  # fmt: skip
    slice_weight = stored * SLICE_WEIGHT
    fits = [(float(base), float(stored), float(slice_weight), float(weight))]
    calibration = [(everything, peak_all), (nothing, peak_none)]
    # A third point, every value saved that XLA does not fuse, fits the slice weight too.
    unfused = fixed_choice(cands, offsets, models, per_step, save="unfused")
    if unfused.stored not in (everything.stored, nothing.stored):
        peak_unfused = light_peak(rewrite(fn, unfused.choices), args, argnums)
        fit = calibrate3([*calibration, (unfused, peak_unfused)])
        if fit is not None and fit != fits[0]:
            fits.append(fit)
        calibration.append((unfused, peak_unfused))
    option_extra = option_offsets(fn, args, argnums, cands, offsets, models, per_step, fits)
    return _Prepared(
        fn=fn,
        args=tuple(args),
        argnums=argnums,
        baseline=baseline,
        models=models,
        cands=tuple(cands),
        nodes=tuple(nodes),
        options=tuple(options),
        offsets=tuple(offsets),
        base=float(base),
        slice=float(slice_weight),
        fits=tuple(fits),
        weight=float(weight),
        stored=float(stored),
        smallest=min(p for _, p in calibration),
        calibration=tuple(calibration),
        option_extra=option_extra,
        fingerprint=print_,
        model_seconds=model_seconds,
    )


def _plan_prepared(
    prep: _Prepared, budget: Any, max_rounds: int = 4, device_memory: int | None = None
) -> Plan:
    """Solves, rewrites and measures for one budget (see `plan`), with each calibrated memory
    model (`_Prepared.fits`), and keeps the plan with the fewest measured FLOPs; among equally
    cheap plans, one whose model predicted its peak within 10% (see `ACCURATE`), then the
    smallest peak."""
    plans: list[Plan] = []
    errors: list[InfeasibleBudget] = []
    for f, (base, stored, slice_weight, weight) in enumerate(prep.fits):
        options = prep.options
        if prep.option_extra:
            options = tuple(
                charge(o, extra, stored, weight)
                for o, extra in zip(prep.options, prep.option_extra[f], strict=True)
            )
        variant = dataclasses.replace(
            prep, base=base, stored=stored, slice=slice_weight, weight=weight, options=options
        )
        try:
            plans.append(_plan_one(variant, budget, max_rounds, device_memory))
        except InfeasibleBudget as err:
            errors.append(err)
    if not plans:
        raise min(errors, key=lambda e: e.smallest_peak_bytes)
    best = min(plans, key=lambda p: (p.measured.flops, _inaccurate(p), p.measured_peak_bytes))
    return dataclasses.replace(
        best,
        solve_seconds=prep.model_seconds + sum(p.solve_seconds - prep.model_seconds for p in plans),
        rounds=sum(p.rounds for p in plans),
    )


def charge(option: Option, extra: float, stored: float, weight: float) -> Option:
    """``option`` charged ``extra`` bytes of memory (see `option_offsets`), as the MILP counts
    them: ``stored * bytes + weight * transient``. A negative charge (the option keeps less
    than the fit predicts) takes the option's bytes down to zero and the rest off its
    transient, so that options whose bytes would all be clamped to zero stay ranked.

    Example:
      >>> from remat._milp import Option
      >>> from remat._plan import charge
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), 6.0, stored=2.0, weight=1.0)
      Option(group=0, bytes=13.0, flops=0.0, transient=40.0)
      >>> charge(Option(group=0, bytes=10.0, transient=40.0), -30.0, stored=2.0, weight=0.5)
      Option(group=0, bytes=0.0, flops=0.0, transient=20.0)
    """
    if not stored:
        return option
    bytes_ = option.bytes + extra / stored
    if bytes_ >= 0 or not weight:
        return dataclasses.replace(option, bytes=max(bytes_, 0.0))
    transient = max(option.transient + bytes_ * stored / weight, 0.0)
    return dataclasses.replace(option, bytes=0.0, transient=transient)


def _inaccurate(p: Plan) -> bool:
    """Whether the model's prediction missed the plan's measured peak by more than `ACCURATE`."""
    measured = p.measured_peak_bytes or 1
    return abs(p.predicted_peak_bytes - measured) > ACCURATE * measured


def _plan_one(
    prep: _Prepared, budget: Any, max_rounds: int = 4, device_memory: int | None = None
) -> Plan:
    """`_plan_prepared` with the memory model ``prep`` has."""
    baseline_peak = peak_of(prep.baseline)
    budget_bytes = parse_budget(budget, baseline_peak, device_memory)
    fn, args, argnums = prep.fn, prep.args, prep.argnums
    weights = dict(
        transient_weight=prep.weight,
        stored_weight=prep.stored,
        slice_weight=prep.slice,
    )
    solve_seconds = prep.model_seconds
    margin = 0.0
    smallest = prep.smallest
    measured_by_choice: dict[Any, Measurement] = {}
    best: tuple[Any, ...] | None = None
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        clock = time.perf_counter()
        solution = solve(
            prep.nodes, budget_bytes, options=prep.options, fixed_bytes=prep.base + margin,
            **weights,
        )  # fmt: skip
        last = solution is None
        if last:
            if best is not None:
                break
            solution = solve(prep.nodes, budget_bytes, options=prep.options,
                             minimize="memory", **weights)  # fmt: skip
            if solution is None:  # the solver gave up (time limit)
                break
        choice = decode(
            solution, prep.cands, prep.offsets, prep.models, prep.weight, prep.stored, prep.slice,
        )  # fmt: skip
        solve_seconds += time.perf_counter() - clock
        key = tuple(
            sorted(
                (k, v.names, v.offload, _schedule_key(v.schedule))
                for k, v in choice.choices.items()
            )
        )
        seen = key in measured_by_choice
        if not seen:
            planned = rewrite(fn, choice.choices)
            measured = compile_measure(planned, args, argnums, "plan", prep.baseline)
            measured_by_choice[key] = measured
        measured = measured_by_choice[key]
        peak = peak_of(measured)
        smallest = min(smallest, peak)
        # The model's prediction for this choice, corrected by the rounds measured before it.
        predicted = int(prep.base + margin + choice.model_bytes)
        error = peak - predicted  # > 0: the model was optimistic
        if peak <= budget_bytes:
            candidate = (choice.flops, peak, rounds, choice, measured, predicted)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
            if error >= -0.02 * budget_bytes or seen:
                break  # the model was not pessimistic enough to leave a cheaper plan out
        elif last:
            break
        # Correct the model by what the compiled program showed: tighten when it was
        # optimistic (at least 1% of the budget), loosen when it was pessimistic.
        margin += max(error, 0.01 * budget_bytes) if peak > budget_bytes else error
    if best is None:
        # The model found nothing, but a calibration point (every needed value saved, or
        # nothing saved) was measured to fit: fall back to the cheaper of those.
        fits = [(c, p) for c, p in prep.calibration if p <= budget_bytes]
        if not fits:
            raise InfeasibleBudget(budget, budget_bytes, smallest, baseline_peak)
        choice, peak = min(fits, key=lambda cp: (cp[0].flops, cp[1]))
        planned = rewrite(fn, choice.choices)
        measured = compile_measure(planned, args, argnums, "plan", prep.baseline)
        model = (
            prep.stored * choice.stored
            + prep.slice * choice.sliced
            + prep.weight * choice.transient
        )
        best = (choice.flops, peak, rounds, choice, measured, int(prep.base + model))
    _, _, _, choice, measured, predicted = best
    return Plan(
        fn=rewrite(fn, choice.choices),
        scans=choice.scans,
        budget_bytes=budget_bytes,
        predicted_peak_bytes=predicted,
        measured=measured,
        baseline_peak_bytes=baseline_peak,
        baseline_flops=prep.baseline.flops,
        solve_seconds=solve_seconds,
        rounds=rounds,
        fingerprint=prep.fingerprint,
        argnums=argnums,
    )


def option_offsets(fn, args, argnums, cands, offsets, models, per_step, fits):
    """Per fit, per option: what a `remat.Nested` or `remat.Binomial` schedule keeps beyond
    the fit's prediction.

    The fits are calibrated on ``per_step`` programs. A `Nested` scan's backward pass also
    holds what the per-step model does not see: the re-run inner block's carries and its
    slice of ``xs``, and the buffers XLA allocates for the inner scan inside the outer loop
    (on the GRU benchmark, 256 steps as 16 x 16: 0.7 to 1.2 MiB beyond the fit, for 0.25 MiB
    of outer carries). A `Binomial` scan's memory (its snapshots, one step's residuals, the
    buffers of its `fori_loop`) is not a per-step quantity at all. So each such option is
    compiled once (a `Nested` one with nothing saved, a `Binomial` one as planned; the other
    scans ``per_step`` with nothing saved), and the difference between the measured peak and
    each fit's prediction for the same choice (the option's own bytes and transient
    included, as the MILP counts them) is charged to the option, as bytes it keeps.

    Returns:
      ``(extra bytes per option,)`` per fit, aligned with ``fits`` and ``cands``.
    """
    extra = [[0.0] * len(cands) for _ in fits]
    for o, cand in enumerate(cands):
        if not isinstance(cand.schedule, Nested | Binomial):
            continue
        others = [p for p in per_step if cands[p].scan != cand.scan]
        point = fixed_choice(cands, offsets, models, [o, *others], save=cand.save_all)
        peak = light_peak(rewrite(fn, point.choices), args, argnums)
        transient = max(point.transient, cand.option.transient)
        for f, (base, stored, slice_weight, weight) in enumerate(fits):
            predicted = (
                base + stored * (point.stored + cand.option.bytes)
                + slice_weight * point.sliced + weight * transient
            )  # fmt: skip
            extra[f][o] = float(peak - predicted)
    return tuple(tuple(e) for e in extra)


def calibrate(
    peak_all: float, stored_all: float, peak_none: float, stored_none: float, transient: float
) -> tuple[float, float, float]:
    """Fits ``peak = base + stored_weight * stored + transient_weight * transient``.

    Two compiled points: every needed value saved (``stored_all``, no transient) and nothing
    saved (``stored_none`` and ``transient``). With ``stored_weight = 1`` the two give
    ``base`` and ``transient_weight``; when that weight falls outside ``[0, 2]`` it is clamped
    and ``stored_weight`` is fitted instead. (A weight above 1 is real: XLA keeps transposed
    copies of some recomputed values for the weight-gradient matmuls.)

    Returns:
      ``(base, stored_weight, transient_weight)``.

    Example:
      >>> from remat._plan import calibrate
      >>> calibrate(peak_all=100, stored_all=80, peak_none=40, stored_none=10, transient=20)
      (20.0, 1.0, 0.5)
      >>> [round(x, 3) for x in calibrate(100, 80, peak_none=20, stored_none=10, transient=20)]
      [8.571, 1.143, 0.0]
    """
    base = peak_all - stored_all
    weight = (peak_none - base - stored_none) / transient if transient else 1.0
    if 0.0 <= weight <= MAX_TRANSIENT_WEIGHT or stored_all == stored_none:
        return float(base), 1.0, float(min(max(weight, 0.0), MAX_TRANSIENT_WEIGHT))
    weight = 0.0 if weight < 0 else MAX_TRANSIENT_WEIGHT
    # peak_all = base + s * stored_all;  peak_none = base + s * stored_none + weight * transient
    s = (peak_all - peak_none + weight * transient) / (stored_all - stored_none)
    s = max(s, 0.0)
    return float(peak_all - s * stored_all), float(s), weight


def calibrate3(points: Sequence[tuple[Any, float]]) -> tuple[float, float, float, float] | None:
    """Fits ``peak = base + stored + slice_weight * sliced + transient_weight * transient``
    exactly through three compiled points (`Choice`, measured peak).

    When the exact fit gives a slice weight outside ``[0, MAX_TRANSIENT_WEIGHT]``, the slice
    weight is clamped to that range and ``base`` and ``transient_weight`` are fitted to the
    three points by least squares.

    Returns ``(base, 1.0, slice_weight, transient_weight)``, or None when the three points do
    not determine it or the transient weight falls outside ``[0, MAX_TRANSIENT_WEIGHT]``.

    Example:
      >>> from remat._plan import calibrate3
      >>> from remat._plan_options import Choice
      >>> c = lambda s, sl, t: Choice({}, (), 0.0, 0.0, stored=s, sliced=sl, transient=t)
      >>> # base 10, slice weight 0.5, transient weight 1.5:
      >>> calibrate3([(c(80, 10, 0), 95.0), (c(8, 1, 20), 48.5), (c(40, 5, 4), 58.5)])
      (10.0, 1.0, 0.5, 1.5)
    """
    import numpy as np

    a = np.array([[1.0, c.sliced, c.transient] for c, _ in points])
    b = np.array([peak - c.stored for c, peak in points])
    if abs(np.linalg.det(a)) < 1e-6 * max(1.0, float(np.abs(a).max()) ** 2):
        return None
    base, slice_weight, weight = (float(round(v, 9)) for v in np.linalg.solve(a, b))
    if not 0.0 <= slice_weight <= MAX_TRANSIENT_WEIGHT:
        slice_weight = min(max(slice_weight, 0.0), MAX_TRANSIENT_WEIGHT)
        rest = b - slice_weight * a[:, 1]
        (base, weight), *_ = np.linalg.lstsq(a[:, [0, 2]], rest, rcond=None)
        base, weight = float(base), float(weight)
    if not 0.0 <= weight <= MAX_TRANSIENT_WEIGHT:
        return None
    return base, 1.0, slice_weight, weight


def plan_budgets(
    fn: Callable[..., Any],
    *args: Any,
    budgets: Sequence[Any],
    argnums: int | Sequence[int] = 0,
    schedules: bool = True,
    max_rounds: int = 4,
) -> list[Plan | InfeasibleBudget]:
    """`plan` at several budgets, sharing the tracing, modelling and calibration compiles.

    Returns one `Plan` per budget, or the `InfeasibleBudget` error where none fits.
    """
    prep = _prepare(fn, args, argnums, schedules)
    out: list[Plan | InfeasibleBudget] = []
    for budget in budgets:
        try:
            out.append(_plan_prepared(prep, budget, max_rounds))
        except InfeasibleBudget as err:
            out.append(err)
    return out


def _schedule_key(schedule: Schedule) -> str:
    return repr(schedule)
