"""The planner's first compile: the un-checkpointed step, or a checkpointed stand-in for it.

The un-checkpointed step is the budget's reference (a relative budget is a fraction of its
peak), its matmul FLOPs the reference of every plan's, and its arguments and outputs the
memory every plan keeps. A compiler that knows its device's memory (XLA's TPU compiler)
refuses it when it does not fit, exactly when a plan is wanted. Then `baseline_step` compiles
the step that recomputes everything (every scan ``per_step``, nothing saved: `remat.full` on
each scan) and stands it in for the un-checkpointed one (`stand_in`):

- its arguments and outputs are the un-checkpointed step's (checkpointing changes neither);
- its FLOPs are the un-checkpointed step's matmul FLOPs counted on its jaxpr (every scan
  times its length), the whole program's, divided among the devices (a step spread over n
  devices does 1/n of them on each: exact for sharded data, an underestimate where a matmul
  is replicated). Not the recomputing step's measured FLOPs less the cost model's
  recomputation: near the chip's memory the TPU compiler recomputes values of its own
  accord, so that difference is above the un-checkpointed step's (Llama-3.2-1B on a v5e-4:
  23.8 TFLOP per chip, where the jaxpr counts 18.07 and the step compiled at 2 layers
  counts exactly its jaxpr's);
- its peak is the memory the compiler's refusal says the un-checkpointed step needs (the TPU
  compiler states it to 0.01 GiB), so ``budget="50%"`` is half of that. Where the refusal
  does not state it, a relative budget is refused (`check_relative`): give bytes (the
  stand-in's peak is then a lower bound: one byte over what the compiler gives a program).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._warnings import RematWarning
from .._measure._measurement import Measurement
from .._measure._refusal import Refusal, refusal_of
from .._measure._step import as_step, grad_step
from .._shard._target import usable_bytes
from .._trace._checkpoints import traced_dot_flops
from .._trace._tag import rewrite
from ._compile import compile_measure, light_peak
from ._options import alone_key, fixed_choice

# `Measurement.peak_source` of a stand-in, and of a step the compiler refused (`refused`).
STATED = "stated by the compiler's refusal"
REFUSED = "refused by the compiler"
# The peak of a refused plan whose refusal states no size: over any budget.
UNKNOWN_PEAK = 2**62

_NOTHING_FITS = (
    "`remat.plan`: the compiler refused the un-checkpointed step ({refused}) and the step "
    "that recomputes everything too ({again}); no checkpointing of the scans fits this "
    "device. Shard the parameters over more devices, or shorten the step (smaller batch)."
)
_ABOVE_LIMIT = (
    "`remat.plan` got budget={spec!r} ({budget:,} bytes), above the {limit:,} bytes the "
    "compiler gives a program on this device (it refuses a step above them); planning for "
    "{limit:,} bytes."
)
_NO_SIZE = (
    "`remat.plan`: the compiler refused the un-checkpointed step without stating the memory "
    "it needs ({refused}), and the step that saves every value the backward pass needs too "
    "({again}), so the memory model cannot be calibrated on this device. Plan for more "
    "devices (a larger slice) or a smaller step."
)
_NOT_OFFLOADED = (
    "`remat.plan`: a plan offloads {names} to host memory, but the step compiled for {backend} "
    "keeps nothing there (host_temp_size_in_bytes is 0): the compiler kept them on the "
    "device, so the transfers it was priced for do not happen. Its measured peak is still the "
    "compiled step's; plan with offload=False to compare."
)
_NOT_STATED = (
    "`remat.plan` got the relative budget {spec!r}, but the un-checkpointed step does not fit "
    "the device: the compiler refused it without stating the memory it needs ({refused}). "
    "Give the budget in bytes (e.g. budget='15GiB')."
)


def baseline_step(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    cands: Sequence[Any],
    offsets: Sequence[int],
    models: Sequence[Any],
    per_step: Sequence[int],
    read: Callable[[Any], Any] | None = None,
) -> tuple[Measurement, Refusal | None, Measurement | None, Any]:
    """The un-checkpointed step's measurement, or, where the compiler refuses it, the stand-in
    (see the module docstring).

    Returns:
      ``(baseline, refusal, recomputing, read)``: ``refusal`` and ``recomputing`` (the step
      that recomputes everything, as measured) are None when the un-checkpointed step
      compiled; ``read`` is what ``read`` returned for the un-checkpointed step's XLA dump
      (`remat._plan._compile.compile_measure`), None without it or where it was refused.
    """
    try:
        if read is None:
            return compile_measure(fn, args, argnums, "none", None), None, None, None
        measured, phases = compile_measure(fn, args, argnums, "none", None, read=read)
        return measured, None, None, phases
    except jax.errors.JaxRuntimeError as err:
        refusal = refusal_of(err)
        if refusal is None:
            raise
    nothing = fixed_choice(cands, offsets, models, per_step, save=False)
    try:
        recomputing = compile_measure(rewrite(fn, nothing.choices), args, argnums, "full", None)
    except jax.errors.JaxRuntimeError as err:
        again = refusal_of(err)
        if again is None:
            raise
        raise ValueError(
            _NOTHING_FITS.format(refused=refusal.message, again=again.message)
        ) from err
    plain_flops = traced_step_flops(fn, args, argnums) / max(recomputing.num_devices, 1)
    return stand_in(recomputing, plain_flops, refusal), refusal, recomputing, None


def traced_step_flops(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> float:
    """The matmul FLOPs of ``fn``'s gradient step (``argnums`` as `baseline_step` takes it),
    counted on its jaxpr with every scan times its length: the whole program's, where
    nothing is compiled (arguments may be `jax.ShapeDtypeStruct` s)."""
    step = grad_step(fn, as_step(argnums))
    return traced_dot_flops(jax.make_jaxpr(step)(*args).jaxpr)


def recomputing_margin(recomputing, infos, cands, offsets, models, alone) -> float | None:
    """The memory outside the scans that the scan-alone programs do not see (see
    `remat._plan._calibrate.Prepared.margin`), from the step that recomputes everything: its
    peak less its arguments and outputs and each scan's contribution compiled alone with
    nothing saved (``alone``: the calibration points' contributions by `alone_key`); None
    where a scan's is not among them."""
    known = dict(alone)
    total = 0.0
    for o, cand in enumerate(cands):
        if cand.schedule != "per_step":
            continue
        nothing = fixed_choice(cands, offsets, models, [o], save=False)
        key = alone_key(o, nothing.choices[infos[cand.scan].position])
        if key not in known:
            return None
        total += known[key]
    m = recomputing
    return float(m.peak_bytes - (m.argument_bytes + m.output_bytes - m.alias_bytes) - total)


def stand_in(recomputing: Measurement, plain_flops: float, refusal: Refusal) -> Measurement:
    """The un-checkpointed step's measurement, from the step that recomputes everything,
    the un-checkpointed step's matmul FLOPs per device (``plain_flops``, `traced_step_flops`
    shared among the devices) and the compiler's refusal of the un-checkpointed step."""
    # Where the refusal states no size, the step needs more than the compiler gives it.
    asked = refusal.asked_bytes or (refusal.available_bytes or recomputing.peak_bytes) + 1
    outside = recomputing.argument_bytes + recomputing.output_bytes - recomputing.alias_bytes
    return dataclasses.replace(
        recomputing,
        peak_bytes=asked,
        peak_source=STATED,
        temp_bytes=max(asked - outside, 0),
        residuals=(),
        residual_bytes=0,
        flops=plain_flops,
        recompute_requested=False,
        recompute_eliminated=False,
        strategy="none",
    )


def refused(baseline: Measurement, refusal: Refusal, predicted_flops: float) -> Measurement:
    """A measurement for a plan the compiler refused (``peak_source`` `REFUSED`: never a plan,
    `_memo.best_known`): its peak as the refusal states it, else one byte over the memory the
    compiler gives a program, else `UNKNOWN_PEAK`; the FLOPs the model predicts for it."""
    if refusal.asked_bytes is not None:
        over = refusal.asked_bytes
    elif refusal.available_bytes is not None:
        over = refusal.available_bytes + 1
    else:
        over = UNKNOWN_PEAK
    return dataclasses.replace(
        baseline, peak_bytes=over, peak_source=REFUSED, flops=predicted_flops, strategy="plan"
    )


def check_relative(spec: Any, fraction: float | None, refusal: Refusal | None) -> None:
    """Raises for a relative budget when the un-checkpointed peak is unknown: the compiler
    refused that step without stating the memory it needs."""
    if fraction is not None and refusal is not None and refusal.asked_bytes is None:
        raise ValueError(_NOT_STATED.format(spec=spec, refused=refusal.message))


def refused_peak(refusal: Refusal, fn: Callable[..., Any], args: Any, argnums: Any, choices):
    """The peak of the step that saves every needed value (``choices``) when the compiler
    refused the un-checkpointed step: the memory the refusal states, else that step compiled
    (where the compiler refuses it too and states its size, that size)."""
    if refusal.asked_bytes is not None:
        return refusal.asked_bytes
    try:
        return light_peak(rewrite(fn, choices), args, argnums)
    except jax.errors.JaxRuntimeError as err:
        again = refusal_of(err)
        if again is None:
            raise
        if again.asked_bytes is not None:
            return again.asked_bytes
        raise ValueError(_NO_SIZE.format(refused=refusal.message, again=again.message)) from err


def memory_limit(refusal: Refusal | None, device: Any) -> int | None:
    """The most memory the compiler gives a program: as its refusal states it, else the TPU
    chip's (`remat._shard._target.USABLE_HBM_GIB`); None where unknown (CPU, GPU)."""
    if refusal is not None and refusal.available_bytes is not None:
        return refusal.available_bytes
    return None if device is None else usable_bytes(device)


def budget_within(spec: Any, budget_bytes: int, limit: int | None) -> int:
    """``budget_bytes``, or the compiler's ``limit`` where the budget is above it (a plan
    over it would be refused), with a `RematWarning` that says so."""
    if limit is None or budget_bytes <= limit:
        return budget_bytes
    warnings.warn(
        _ABOVE_LIMIT.format(spec=spec, budget=budget_bytes, limit=limit), RematWarning, stacklevel=4
    )
    return limit


def check_offloaded(choice: Any, measured: Measurement) -> None:
    """Warns where a plan offloads values but the compiled step keeps nothing in host memory
    (on CPU there is no host memory of its own: offloading is not offered there)."""
    names = sorted({n for scan in choice.choices.values() for n in (scan.offload or ())})
    if names and measured.backend != "cpu" and measured.host_bytes == 0:
        text = _NOT_OFFLOADED.format(names=", ".join(names), backend=measured.backend)
        warnings.warn(text, RematWarning, stacklevel=4)
