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
from ._baseline import baseline_step, memory_limit, recomputing_margin, refused_peak
from ._compile import light_peak, peak_of
from ._costmodel import ScanModel, model_scans
from ._fit import SLICE_WEIGHT, calibrate, calibrate3
from ._milp import Node, Option
from ._mixes import Later
from ._options import (
    Candidate,
    alone_key,
    assemble,
    candidates,
    decode,
    fixed_choice,
    offload_costs,
    step_point,
)
from ._perlayer import period_candidates
from ._phases import as_alone, contribution, phase_model
from ._result import fingerprint, scan_fingerprints
from ._sharded import placeable, placement, read_splits, step_reader

_NO_SCAN = (
    "`remat.plan` found no `scan` in {name}. The planner chooses what each scan step saves; "
    "put the layers in a `jax.lax.scan` (or `flax.linen.scan` / `nnx.scan`), or use "
    "`remat.apply(fn, strategy)` for a whole-function checkpoint."
)


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
    # Where the compiler refused that step, the step that recomputes everything's, against
    # its scans compiled alone with nothing saved. None when calibrated on compiled steps,
    # when the baseline is another program's, or when the program has checkpoints of its own
    # (the baseline is then the program as written, but a scan compiled alone is not: its
    # body's checkpoints are inlined, see `remat._trace._tag`).
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
    # Where the scan-alone programs of a sharded program are placed (`_sharded`); None on
    # one device.
    placement: Any = None
    # The per-layer options still being found (`_mixes.Later`: `prepare` with ``later``);
    # None once they are in ``cands``, or where none were asked for.
    later: Any = None

    @property
    def weights(self) -> dict[str, float]:
        """The calibrated weights as `_milp.solve` takes them."""
        return dict(transient_weight=self.weight, stored_weight=self.stored,
                    slice_weight=self.slice)  # fmt: skip

    def decode(self, solution: Any) -> Any:
        """``solution`` as the `_options.Choice` it stands for, under this program's
        calibrated memory model (`_options.decode`)."""
        return decode(solution, self.cands, self.offsets, self.models, self.weight, self.stored,
                      self.slice)  # fmt: skip


def check_inputs(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> None:
    """The checks `remat.measure` makes of the loss and its arguments, named for `remat.plan`:
    run before anything else traces ``fn`` (e.g. looking for scans to decide on rolling).

    Arguments may be `jax.ShapeDtypeStruct` s (with ``sharding=`` on a mesh): the planner
    traces and compiles, and never runs the step, so it needs no values."""
    if not isinstance(argnums, Step | int):
        argnums = tuple(argnums)
    try:
        _check_args(args, argnums, 0)
        _check_scalar(fn, args, getattr(argnums, "has_aux", False), where="remat.plan")
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
    later: bool = False,
):
    """Everything `plan` needs before it sees a budget (see `Prepared`).

    One compile of the whole step (the un-checkpointed baseline, unless ``baseline`` is
    given: when the budget is relative to another program's peak, see `_unrolled`); the
    memory model is calibrated on scan-alone programs (`scan_fit`). On a mesh the step is
    compiled first, and the scan-alone programs are placed as its forward loop holds the
    scans' inputs (`_sharded`); a program whose shardings only a `jax.jit` declares (no mesh
    among its arguments) is calibrated on compiled steps instead (`step_fit`). With
    ``per_layer`` and ``later``, the per-layer options are found on a thread while the
    caller goes on with the uniform ones (`_mixes.completed` waits for them).
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

    def build(splits):
        models = model_scans(infos, splits if devices > 1 else None, devices)
        cands = candidates(models, schedules)
        nodes, options, offsets = assemble(cands)
        if host_bandwidth is not None:  # offloading offered (see `_offload_wanted`)
            rates = offload_rates(compile_device(args))  # a TPU target: its chip's rate
            nodes = offload_costs(
                nodes, cands, offsets, models, host_bandwidth, rates[0] if rates else None
            )
        per_step = [o for o, c in enumerate(cands) if c.schedule == "per_step"]
        return models, cands, nodes, options, offsets, per_step

    models, cands, nodes, options, offsets, per_step = build(splits)
    print_ = fingerprint(fn, *args)
    written = tuple(str(s) for s in checkpoint_sites(jax.make_jaxpr(fn)(*args).jaxpr))
    model_seconds = time.perf_counter() - clock
    # Where the compiler refuses the un-checkpointed step, a checkpointed one stands in
    # (`_baseline`); ``first`` is (baseline, refusal, the step that recomputes everything).
    first = functools.partial(baseline_step, fn, args, argnums, cands, offsets, models, per_step)
    refusal = recomputing = phases = placed = None
    given = baseline is not None
    if devices > 1 and not placeable(args):  # shardings a `jax.jit` declares: no mesh
        if baseline is None:
            say("compiling the un-checkpointed step")
            baseline, refusal, recomputing, _ = first()
        say("calibrating on compiled steps")
        fit, calibration, scan_fits = step_fit(
            fn, args, argnums, cands, offsets, models, per_step, refusal, recomputing
        )
        alone, margin = (), None
    else:
        device = compile_device(args)
        # One scan on the CPU: the step's phases are read from its dump (`_phases`).
        platform = jax.default_backend() if device is None else getattr(device, "platform", "")
        reading = not given and not written and len(infos) == 1 and platform == "cpu"
        step_phases = (lambda: pending.result()[3]) if reading and devices == 1 else None
        if devices > 1:  # the step first: where XLA puts the scans' inputs (`_sharded`)
            if not given:
                say("compiling the un-checkpointed step")
                read = step_reader(infos, splits, reading) if platform == "cpu" else None
                baseline, refusal, recomputing, got = first(read=read)
                if got is not None:
                    splits = read_splits(splits, infos, got[1])
                    models, cands, nodes, options, offsets, per_step = build(splits)
                    step_phases = (lambda: got[0]) if reading else None
            device = placed = placement(infos, splits, args)
        say("compiling the un-checkpointed step and each scan alone")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the baseline beside the scans
            pending = baseline or pool.submit(first, read=loop_phases if reading else None)
            measured = pending if baseline else _First(pending)
            fit, calibration, scan_fits, alone, margin, phases = scan_fit(
                infos, cands, offsets, models, per_step, measured, device,
                written=not given and not written, step_phases=step_phases,
            )  # fmt: skip
            if not baseline:
                baseline, refusal, recomputing, _ = pending.result()
        if refusal is not None:  # the stand-in shows no margin; the step it stands for does
            phases = None
            margin = recomputing_margin(recomputing, infos, cands, offsets, models, alone)
    base, stored, slice_weight, weight = fit
    if per_layer and not later:  # mixes of the fitted model's Pareto points, without nodes
        clock = time.perf_counter()
        more = period_candidates(models, cands, stored, slice_weight, weight)
        cands += more
        options += [c.option for c in more]
        offsets += [len(nodes)] * len(more)
        model_seconds += time.perf_counter() - clock
    prep = Prepared(
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
        placement=placed,
        compiled=() if recomputing is None else (
            (fixed_choice(cands, offsets, models, per_step, save=False),
             dataclasses.replace(recomputing, strategy="plan")),
        ),
    )  # fmt: skip
    if per_layer and later:  # found beside the uniform rounds (`_mixes`), the thread last
        later_ = Later(prep.models, prep.cands, stored, slice_weight, weight)
        prep = dataclasses.replace(prep, later=later_)
    return prep


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
        saves = [True, False]
        if unfused.stored not in (everything.stored, nothing.stored):
            points_.append(unfused)
            saves.append("unfused")
        plan_points.append((o, info, n, points_, saves))
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
    for o, info, n, points_, _ in plan_points:
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
    # contributions with nothing saved (the least memory each reaches per step), and its
    # choice saves nothing in them (`step_point`: left out, they would compile as written).
    calibration = []
    for k, scan_points in enumerate(points):
        rest = sum(p[1][1] for j, p in enumerate(points) if j != k)  # others: nothing saved
        o, others = plan_points[k][0], [p[0] for j, p in enumerate(plan_points) if j != k]
        for (_, added), save in zip(scan_points, plan_points[k][4], strict=True):
            choice = step_point(cands, offsets, models, o, save, others)
            calibration.append((choice, int(outside + added + rest)))
    fit = (float(base), float(stored), float(slice_weight), float(weight))
    margin = None
    if written:
        # With the phases read, the step's most bytes live, not its peak: the peak also
        # counts the temporaries buffer's unused bytes, XLA's packing of that one program
        # (17.5 GiB of the un-checkpointed step at Llama-3-70B shapes, none of its plan's);
        # what it holds as it is consumed between the loops is read as its scan alone
        # holds it there (`as_alone`).
        if phases is not None:
            step = as_alone(step, memories[len(flat)].phases)
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
