"""What the planner knows about a program before it sees a budget: its scans' cost models and
options, and the memory model calibrated on compiled programs (see `SLICE_WEIGHT`).

Two compiled points (every needed value saved, nothing saved) fit the memory outside the
scans and how much of a step's recomputed values is live at once (`calibrate`); a third point
gives a second fit (`calibrate3`). Each `remat.Nested` and `remat.Binomial` option is compiled
once more, and what it keeps beyond the fits is charged to it (`option_offsets`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._schedule import Binomial, Nested
from .._measure._measure import _check_args, _check_scalar
from .._measure._measurement import Measurement
from .._measure._step import Step
from .._shard._shard_counts import scan_input_splits
from .._trace._checkpoints import checkpoint_sites
from .._trace._tag import planned_scans, rewrite
from ._compile import compile_measure, light_peak
from ._costmodel import ScanModel, model_scans
from ._milp import Node, Option
from ._options import Candidate, assemble, candidates, fixed_choice, offload_costs
from ._result import fingerprint, scan_fingerprints

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
    # Per fit, per option: bytes the schedule costs beyond what the fit predicts, measured on
    # the compiled program (see `option_offsets`); zero for ``per_step`` options.
    option_extra: tuple[tuple[float, ...], ...]
    calibration: tuple[tuple[Any, int], ...]  # (Choice, measured peak) of the two points
    fingerprint: str
    model_seconds: float
    scan_fingerprints: tuple[str, str] = ("", "")  # see `scan_fingerprints`
    written: tuple[str, ...] = ()  # the program's own checkpoints, as `Site` texts


def prepare(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None = None,
    baseline: Measurement | None = None,
):
    if not isinstance(argnums, Step):  # a `Step`: aux outputs, or an optimizer's step
        argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(args)):
        raise TypeError(_ABSTRACT)
    try:  # the same checks as `remat.measure`, named for `remat.plan`
        _check_args(args, argnums, 0)
        _check_scalar(fn, args, getattr(argnums, "has_aux", False))
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
    written = tuple(str(s) for s in checkpoint_sites(jax.make_jaxpr(fn)(*args).jaxpr))
    model_seconds = time.perf_counter() - clock
    if baseline is None:  # given when the budget is relative to another program's peak
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
        fits=tuple(fits),
        weight=float(weight),
        stored=float(stored),
        smallest=min(p for _, p in calibration),
        calibration=tuple(calibration),
        option_extra=option_extra,
        fingerprint=print_,
        model_seconds=model_seconds,
        scan_fingerprints=scan_fingerprints(infos),
        written=written,
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

    When the exact fit gives a slice weight outside ``[0, MAX_TRANSIENT_WEIGHT]``, the slice
    weight is clamped to that range and ``base`` and ``transient_weight`` are fitted to the
    three points by least squares.

    Returns ``(base, 1.0, slice_weight, transient_weight)``, or None when the three points do
    not determine it or the transient weight falls outside ``[0, MAX_TRANSIENT_WEIGHT]``.

    Example:
      >>> from remat._plan._calibrate import calibrate3
      >>> from remat._plan._options import Choice
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
