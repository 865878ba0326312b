"""What the planner knows about a program before it sees a budget: its scans' cost models and
options, the un-checkpointed step, and the memory model (see `SLICE_WEIGHT`).

The whole step is compiled once, un-checkpointed (the budget's reference and the step's own
arguments and outputs). The memory model is fitted on each scan compiled alone at its own
length (`scan_fit`, `remat._plan._body`): three save sets (every needed value, none, every
unfused value) give the scan's fixed memory and the weights of one step's saved and transient
bytes (`calibrate3`, or `calibrate` from two). Each scan compiled alone as written, against
the un-checkpointed step, gives the memory outside the scans that no scan-alone program
sees (`Prepared.margin`: with an optimizer, the parameters' gradients and the update's
temporaries; the loss head's values live at the peak).
`remat.Nested` and `remat.Binomial` options are charged what they keep beyond the model only
when a candidate uses them (`_rounds`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._errors import renamed
from .._measure._measure import _check_args, _check_scalar
from .._measure._measurement import Measurement
from .._measure._phases import loop_phases
from .._measure._step import Step
from .._shard._shard_counts import scan_input_splits
from .._shard._target import compile_device, offload_rates
from .._trace._checkpoints import checkpoint_sites
from .._trace._tag import planned_scans, rewrite
from ._baseline import baseline_step, memory_limit, refused_peak
from ._compile import light_peak, peak_of
from ._costmodel import ScanModel, model_scans
from ._milp import Node, Option
from ._options import (
    Candidate,
    alone_key,
    assemble,
    candidates,
    fixed_choice,
    offload_costs,
)
from ._perlayer import period_candidates
from ._phases import contribution, phase_model
from ._result import fingerprint, scan_fingerprints

_NO_SCAN = (
    "`remat.plan` found no `scan` in {name}. The planner chooses what each scan step saves; "
    "put the layers in a `jax.lax.scan` (or `flax.linen.scan` / `nnx.scan`), or use "
    "`remat.apply(fn, strategy)` for a whole-function checkpoint."
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


@dataclasses.dataclass(frozen=True)
class Prepared:
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
    # each and keeps the best measured plan (see `_rounds.plan_prepared`).
    fits: tuple[tuple[float, float, float, float], ...]
    smallest: int  # the smaller calibration peak
    # Per fit, per option: bytes the schedule costs beyond what the fit predicts; zero until a
    # candidate using the option is compiled alone (see `_rounds`), and for ``per_step``.
    option_extra: tuple[tuple[float, ...], ...]
    # (Choice, peak) of the calibration points: the step's peak predicted from the scan-alone
    # compiles (`scan_fit`), or measured on the compiled step (`step_fit`).
    calibration: tuple[tuple[Any, int], ...]
    fingerprint: str
    model_seconds: float
    infos: tuple[Any, ...] = ()  # the planned scans' `ScanInfo`s, aligned with ``models``
    # Per per-step option, the scan's fit on scan-alone programs (`scan_fit`); empty when the
    # model was fitted on compiled steps (`step_fit`): candidates are then not checked alone.
    scan_fits: tuple[Any, ...] = ()
    # (key, contribution) of the calibration points, as `_memo.Knowledge.alone` keys them.
    alone: tuple[tuple[Any, float], ...] = ()

    scan_fingerprints: tuple[str, str] = ("", "")  # see `scan_fingerprints`
    written: tuple[str, ...] = ()  # the program's own checkpoints, as `Site` texts
    # The un-checkpointed step's peak minus its arguments and outputs and each scan's
    # contribution compiled alone as written: the memory outside the scans that the
    # scan-alone programs do not see (`_memo.Knowledge.margin` before a plan is verified).
    # None when calibrated on compiled steps, or when the baseline is another program's.
    margin: float | None = None
    # The compiler's refusal of the un-checkpointed step (`_baseline`); None where it compiled.
    refusal: Any = None
    # The most memory the compiler gives a program (a TPU chip's usable HBM), where known:
    # a budget above it is planned at it (`_baseline.budget_within`).
    limit: int | None = None
    # What the step adds to each phase of its one scan (`_phases.PhaseModel`): a scan-alone
    # program's contribution is read by phase (`_phases.contribution`); None where the phases
    # were not read (several scans, devices or no CPU dump, a baseline not as written).
    phases: Any = None
    # ``(choice, measured)`` of the step that recomputes everything, compiled in the refused
    # baseline's place: a compiled point like any plan's (`_memo.Knowledge`).
    compiled: tuple[tuple[Any, Measurement], ...] = ()


def check_inputs(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> None:
    """The checks `remat.measure` makes of the loss and its arguments, named for `remat.plan`:
    run before anything else traces ``fn`` (e.g. looking for scans to decide on rolling).

    Arguments may be `jax.ShapeDtypeStruct` s (with ``sharding=`` on a mesh): the planner
    traces and compiles, and never runs the step, so it needs no values."""
    if not isinstance(argnums, Step | int):
        argnums = tuple(argnums)
    try:
        _check_args(args, argnums, 0)
        _check_scalar(fn, args, getattr(argnums, "has_aux", False))
    except (TypeError, ValueError) as err:
        raise renamed(err, "`remat.measure`", "`remat.plan`")  # noqa: B904 (`renamed` chains)


def prepare(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None = None,
    progress: Any = None,
    baseline: Measurement | None = None,
    per_layer: bool = False,
):
    """Everything `plan` needs before it sees a budget (see `Prepared`).

    One compile of the whole step (the un-checkpointed baseline, unless ``baseline`` is
    given: when the budget is relative to another program's peak, see `_unrolled`); the
    memory model is calibrated on scan-alone programs (`scan_fit`). A program whose arguments are spread over
    several devices is calibrated on compiled steps instead (`step_fit`): a scan on its own
    does not see the shardings XLA propagates into it.
    """
    if not isinstance(argnums, Step):  # a `Step`: aux outputs, or an optimizer's step
        argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    check_inputs(fn, args, argnums)
    say = progress or (lambda _: None)
    say("tracing")
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
        rates = offload_rates(compile_device(args))  # a TPU target: its chip's rate
        nodes = offload_costs(
            nodes, cands, offsets, models, host_bandwidth, rates[0] if rates else None
        )
    print_ = fingerprint(fn, *args)
    written = tuple(str(s) for s in checkpoint_sites(jax.make_jaxpr(fn)(*args).jaxpr))
    model_seconds = time.perf_counter() - clock
    per_step = [o for o, c in enumerate(cands) if c.schedule == "per_step"]
    # Where the compiler refuses the un-checkpointed step, a checkpointed one stands in
    # (`_baseline`); ``first`` is (baseline, refusal, the step that recomputes everything).
    first = functools.partial(baseline_step, fn, args, argnums, cands, offsets, models, per_step)
    refusal = recomputing = phases = None
    if devices > 1:
        if baseline is None:
            say("compiling the un-checkpointed step")
            baseline, refusal, recomputing, _ = first()
        say("calibrating on compiled steps")
        fit, calibration, scan_fits = step_fit(
            fn, args, argnums, cands, offsets, models, per_step, refusal, recomputing
        )
        alone, margin = (), None
    else:
        say("compiling the un-checkpointed step and each scan alone")
        device = compile_device(args)
        # One scan on the CPU: the step's phases are read from its dump (`_phases`).
        platform = jax.default_backend() if device is None else getattr(device, "platform", "")
        reading = baseline is None and len(infos) == 1 and platform == "cpu"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the baseline beside the scans
            pending = baseline or pool.submit(first, read=loop_phases if reading else None)
            measured = pending if baseline else _First(pending)
            fit, calibration, scan_fits, alone, margin, phases = scan_fit(
                infos, cands, offsets, models, per_step, measured, device,
                written=baseline is None,
                step_phases=(lambda: pending.result()[3]) if reading else None,
            )  # fmt: skip
            if not baseline:
                baseline, refusal, recomputing, _ = pending.result()
        if refusal is not None:  # the stand-in recomputes everything: it shows no margin
            margin = phases = None
    base, stored, slice_weight, weight = fit
    if per_layer:  # mixes of the fitted model's Pareto points, options without nodes
        clock = time.perf_counter()
        more = period_candidates(models, cands, stored, slice_weight, weight)
        cands += more
        options += [c.option for c in more]
        offsets += [len(nodes)] * len(more)
        model_seconds += time.perf_counter() - clock
    return Prepared(
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
        fits=(fit,),
        weight=float(weight),
        stored=float(stored),
        smallest=min(p for _, p in calibration),
        calibration=tuple(calibration),
        option_extra=(tuple(0.0 for _ in cands),),
        fingerprint=print_,
        model_seconds=model_seconds,
        infos=tuple(infos),
        scan_fits=scan_fits,
        alone=alone,
        scan_fingerprints=scan_fingerprints(infos),
        written=written,
        margin=margin,
        refusal=refusal,
        limit=memory_limit(refusal, compile_device(args)),
        phases=phases,
        compiled=() if recomputing is None else (
            (fixed_choice(cands, offsets, models, per_step, save=False),
             dataclasses.replace(recomputing, strategy="plan")),
        ),
    )  # fmt: skip


class _First:
    """The baseline's measurement from `baseline_step`'s pending result (for `scan_fit`)."""

    def __init__(self, pending: Any) -> None:
        self._pending = pending

    def result(self) -> Measurement:
        return self._pending.result()[0]


@dataclasses.dataclass(frozen=True)
class ScanFit:
    """What one scan adds to the step's peak, fitted on scan-alone programs (`scan_fit`):
    ``fixed + stored_weight * stored + slice * sliced + weight * transient``, where
    ``stored`` (bytes saved over all steps), ``sliced`` (one step's saved bytes) and
    ``transient`` (one step's materialised recomputed bytes) are the cost model's.

    A scan is compiled alone at its own length: a loop body is compiled once, so this costs
    what a 2-step scan costs, and XLA's per-step memory is more than one step's saved values
    (measured on a bf16 Llama-style decoder: 1.23x with every value saved, 2x with nothing
    saved; XLA keeps float32 copies of some stacked values), so a short scan extrapolated by
    one step's saved bytes underestimated the step by 15% at 8 layers.
    """

    fixed: float
    stored: float  # the weight of the stored bytes
    slice: float
    weight: float
    length: int  # the scan's own length, at which it is compiled alone


def scan_fit(infos, cands, offsets, models, per_step, baseline, device=None, written=False,
             step_phases=None):  # fmt: skip
    """The memory model fitted on scan-alone programs (`remat._plan._body`), per scan: every
    needed value saved, nothing saved, every unfused value saved, each compiled at the
    scan's length, give the scan's fixed memory and the weights of one step's saved and
    transient bytes (`calibrate3`, or `calibrate` when the third point adds nothing).

    The step's model adds the step's own arguments and outputs (parameters, gradients; from
    the baseline) to every scan's fixed memory; the weights are the largest of the scans'
    (one scan's step is differentiated at a time). With ``written`` (the baseline is the
    program as written, un-checkpointed), each scan is also compiled alone as written: the
    baseline's peak beyond those and its arguments and outputs is the margin (see
    `Prepared.margin`). With ``step_phases`` (called once the baseline is compiled: the
    un-checkpointed step's `LoopPhases`, or None) and ``written``, each scan-alone program's
    phases are read too, and its contribution is read by phase (`_phases.PhaseModel`).

    Returns:
      ``((base, stored_weight, slice_weight, transient_weight), calibration, scan_fits,
      alone, margin, phases)``, where ``calibration`` lists the points as (`Choice`,
      predicted peak of the step), ``alone`` each point's contribution to the step's peak
      (see `_alone.check_alone`), ``margin`` is None without ``written`` and ``phases`` is
      the `_phases.PhaseModel`, or None.
    """
    from ._body import scan_memories

    # Every point's choice first, then all compiled at once (`compile_many`), beside the
    # baseline's compile when it is still running (``baseline`` a future).
    plan_points = []
    for o in per_step:
        info, model = infos[cands[o].scan], models[cands[o].scan]
        n = model.length
        everything = fixed_choice(cands, offsets, models, [o], save=True)
        nothing = fixed_choice(cands, offsets, models, [o], save=False)
        unfused = fixed_choice(cands, offsets, models, [o], save="unfused")
        points_ = [everything, nothing]
        if unfused.stored not in (everything.stored, nothing.stored):
            points_.append(unfused)
        plan_points.append((o, info, n, points_))
    flat = [(p[1], c.choices[p[1].position], p[2]) for p in plan_points for c in p[3]]
    as_written = [(info, None, model.length) for info, model in zip(infos, models, strict=True)]
    read = step_phases is not None and written
    memories = scan_memories(flat + (as_written if written else []), device, phases=read)
    if hasattr(baseline, "result"):
        baseline = baseline.result()
    phases = step = None
    if read and len(as_written) == 1:
        step = step_phases()
        phases = None if step is None else phase_model(step, memories[len(flat)])
    temps = iter(contribution(m, phases) for m in memories)
    outside = baseline.argument_bytes + baseline.output_bytes - baseline.alias_bytes
    fits: list[ScanFit] = []
    points: list[tuple[Any, ...]] = []
    alone: list[tuple[Any, float]] = []
    for o, info, n, points_ in plan_points:
        contributions = [(c, float(next(temps))) for c in points_]
        fit = calibrate3(contributions) if len(contributions) == 3 else None
        if fit is None:
            (c_all, p_all), (c_none, p_none) = contributions[:2]
            base, stored, weight = calibrate(
                p_all, c_all.stored + SLICE_WEIGHT * c_all.sliced + c_all.transient,
                p_none, c_none.stored + SLICE_WEIGHT * c_none.sliced, c_none.transient,
            )  # fmt: skip
            fit = (base, stored, stored * SLICE_WEIGHT, weight)
        base, stored, slice_weight, weight = fit
        fits.append(ScanFit(base, stored, slice_weight, weight, n))
        points.append(tuple(contributions))
        for c, added in contributions:
            alone.append((alone_key(o, c.choices[info.position]), added))
    base = outside + sum(f.fixed for f in fits)
    stored = max(f.stored for f in fits)
    slice_weight = max(f.slice for f in fits)
    weight = max(f.weight for f in fits)
    # A calibration point of one scan, as a prediction for the whole step: the other scans'
    # contributions with nothing saved (the least memory each reaches per step).
    calibration = []
    for k, scan_points in enumerate(points):
        rest = sum(p[1][1] for j, p in enumerate(points) if j != k)  # others: nothing saved
        for choice, added in scan_points:
            calibration.append((choice, int(outside + added + rest)))
    fit = (float(base), float(stored), float(slice_weight), float(weight))
    margin = None
    if written:
        # With the phases read, the step's most bytes live, not its peak: the peak also
        # counts the temporaries buffer's unused bytes, XLA's packing of that one program
        # (17.5 GiB of the un-checkpointed step at Llama-3-70B shapes, none of its plan's).
        peak = peak_of(baseline) if phases is None else min(peak_of(baseline), step.largest)
        margin = float(peak - outside - sum(contribution(m, phases) for m in memories[len(flat) :]))
    return fit, calibration, tuple(fits), tuple(alone), margin, phases


def step_fit(fn, args, argnums, cands, offsets, models, per_step, refusal=None, recomputing=None):
    """The memory model fitted on compiled steps: every needed value saved and nothing saved
    (see `calibrate`).

    Where the compiler refused the un-checkpointed step (``refusal``), the step that saves
    everything is not compiled: its peak is the memory the refusal states, and the step that
    saves nothing is the one compiled in the baseline's place (``recomputing``)."""
    everything = fixed_choice(cands, offsets, models, per_step, save=True)
    nothing = fixed_choice(cands, offsets, models, per_step, save=False)
    if refusal is not None and recomputing is not None:
        peak_all = refused_peak(refusal, fn, args, argnums, everything.choices)
        peak_none = recomputing.peak_bytes
    else:
        peak_all = light_peak(rewrite(fn, everything.choices), args, argnums)
        peak_none = light_peak(rewrite(fn, nothing.choices), args, argnums)
    # The stored term includes one step's copy of the saved values (see `SLICE_WEIGHT`).
    base, stored, weight = calibrate(
        peak_all, everything.stored + SLICE_WEIGHT * everything.sliced + everything.transient,
        peak_none, nothing.stored + SLICE_WEIGHT * nothing.sliced, nothing.transient,
    )  # fmt: skip
    fit = (float(base), float(stored), float(stored * SLICE_WEIGHT), float(weight))
    return fit, [(everything, peak_all), (nothing, peak_none)], ()


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
      >>> from remat._plan._calibrate import calibrate
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

    When the exact fit gives a slice weight above ``MAX_TRANSIENT_WEIGHT`` (a scan whose
    every step keeps more than its saved values, e.g. float32 copies of bfloat16 ones: the
    excess grows with the bytes stored), ``peak = base + stored_weight * stored + sliced +
    transient_weight * transient`` is fitted exactly instead. Otherwise, or when that fit
    fails, a slice weight outside ``[0, MAX_TRANSIENT_WEIGHT]`` is clamped to that range and
    ``base`` and ``transient_weight`` are fitted to the three points by least squares.

    Returns ``(base, stored_weight, slice_weight, transient_weight)``, or None when the three
    points do not determine it or the transient weight falls outside
    ``[0, MAX_TRANSIENT_WEIGHT]``.

    Example:
      >>> from remat._plan._calibrate import calibrate3
      >>> from remat._plan._options import Choice
      >>> c = lambda s, sl, t: Choice({}, (), 0.0, 0.0, stored=s, sliced=sl, transient=t)
      >>> # base 10, slice weight 0.5, transient weight 1.5:
      >>> calibrate3([(c(80, 10, 0), 95.0), (c(8, 1, 20), 48.5), (c(40, 5, 4), 58.5)])
      (10.0, 1.0, 0.5, 1.5)
      >>> # base 10, stored weight 1.25, transient weight 0.5 (a slice weight of 3.5 exactly):
      >>> calibrate3([(c(80, 10, 0), 120.0), (c(8, 1, 20), 31.0), (c(40, 5, 4), 67.0)])
      (10.0, 1.25, 1.0, 0.5)
    """
    import numpy as np

    a = np.array([[1.0, c.sliced, c.transient] for c, _ in points])
    b = np.array([peak - c.stored for c, peak in points])
    if abs(np.linalg.det(a)) < 1e-6 * max(1.0, float(np.abs(a).max()) ** 2):
        return None
    base, slice_weight, weight = (float(round(v, 9)) for v in np.linalg.solve(a, b))
    if slice_weight > MAX_TRANSIENT_WEIGHT:
        scaled = _stored_fit(points)
        if scaled is not None:
            return scaled
    if not 0.0 <= slice_weight <= MAX_TRANSIENT_WEIGHT:
        slice_weight = min(max(slice_weight, 0.0), MAX_TRANSIENT_WEIGHT)
        rest = b - slice_weight * a[:, 1]
        (base, weight), *_ = np.linalg.lstsq(a[:, [0, 2]], rest, rcond=None)
        base, weight = float(base), float(weight)
    if not 0.0 <= weight <= MAX_TRANSIENT_WEIGHT:
        return None
    return base, 1.0, slice_weight, weight


def _stored_fit(points: Sequence[tuple[Any, float]]) -> tuple[float, float, float, float] | None:
    """``peak = base + stored_weight * stored + SLICE_WEIGHT * sliced + weight * transient``
    exactly through three points (see `calibrate3`), or None when it does not hold."""
    import numpy as np

    a = np.array([[1.0, c.stored, c.transient] for c, _ in points])
    b = np.array([peak - SLICE_WEIGHT * c.sliced for c, peak in points])
    if abs(np.linalg.det(a)) < 1e-6 * max(1.0, float(np.abs(a).max()) ** 2):
        return None
    base, stored, weight = (float(round(v, 9)) for v in np.linalg.solve(a, b))
    if stored < 0 or not 0.0 <= weight <= MAX_TRANSIENT_WEIGHT:
        return None
    return base, stored, SLICE_WEIGHT, weight
