"""Planning a program whose layers run in a Python loop: roll them, or keep it as written.

`remat.plan(fn, roll=True)` (the default) on a program whose traced jaxpr has no scan, or
has layers to roll beside its own scans (`plans_rolled`; the rolled scans are numbered after
its own, `_trace._roll_rewrite`):

1. The program as written is compiled once. It is the baseline: a budget given as a fraction
   is a fraction of its peak, and the plan's FLOPs are compared with its FLOPs.
2. At a budget the program as written fits, it is the plan: nothing is checkpointed, nothing
   recomputed and nothing stacked (no plan can do fewer FLOPs).
3. Otherwise its runs of identical layers are rolled into scans (`roll_unscanned`) and the
   rolled program is planned like any scanned one. What rolling costs (the stacked copy of
   the per-layer inputs and the stacked gradient, split back into per-layer gradients) lies
   outside the scans: the first verified plan measures it (the memory outside the scans,
   `_memo.Knowledge.margin`) and it is charged to every plan from then on; every plan is
   compiled and measured as usual.
   Where the compiler refuses the program as written (a TPU target's HBM), the rolled
   program is planned as any refused step is (`_baseline`): its own un-checkpointed step
   is the baseline, or, refused too, the step that recomputes everything stands in for it
   and a relative budget is of the size the refusal states.
4. When nothing rolls, `ValueError` says why in one line (`explain_no_roll`).

Per-layer checkpoints whose recomputation is ordered after the incoming cotangent by
`lax.optimization_barrier` (no stacking) were measured as the alternative construction and
save nothing on the CPU backend (XLA drops the barrier before scheduling; docs/rolling.md
has the figures), so they are not offered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._budget import Budget, read_budget
from .._measure._measurement import Measurement
from .._measure._refusal import refusal_of
from .._measure._step import Step
from .._shard._target import placement
from .._trace._rewrite import list_scans
from .._trace._roll_explain import explain_no_roll
from .._trace._roll_lift import lifted_runs
from .._trace._roll_rewrite import list_runs, roll_unscanned
from ._calibrate import prepare
from ._compile import compile_measure, peak_of
from ._memo import Knowledge, kept, key_of
from ._result import InfeasibleBudget, NothingToPlan, Plan, fingerprint
from ._rounds import plan_prepared

_NOTHING_ROLLS = (
    "`remat.plan` found no `scan` in {name}, and no repeated layers to roll into one: {why}. "
    "The planner chooses what each scan step saves; put the layers in a `jax.lax.scan` (or "
    "`flax.linen.scan` / `nnx.scan`), or use `remat.apply(fn, strategy)` for a whole-function "
    "checkpoint."
)


def plans_rolled(fn: Callable[..., Any], args: Sequence[Any]) -> bool:
    """Whether `remat.plan(roll=True)` plans ``fn`` here: it has no scan of its own (when
    nothing rolls either, `plan_unrolled` says why), or repeated layers to roll beside its
    scans. False when it cannot be traced as given (`prepare` checks the arguments and says
    what is wrong)."""
    try:
        return not list_scans(fn, *args, roll=False) or bool(list_runs(fn, *args))
    except (TypeError, ValueError):
        return False


def plan_unrolled(
    fn: Callable[..., Any],
    args: Sequence[Any],
    budgets: Sequence[Any],
    argnums: Any,
    schedules: bool,
    max_rounds: int,
    device_memory: int | None,
    host_bandwidth: float | None = None,
    progress: Any = None,
    per_layer: bool = False,
    strategies: tuple[str, ...] = (),
    saved: Budget | None = None,
) -> list[Plan | InfeasibleBudget]:
    """Plans a program with layers to roll at each budget (see the module docstring).

    Returns one `Plan` per budget, or the `InfeasibleBudget` error where none fits. The
    rolled program's plans share what is learned about it (`_memo.Knowledge`): a plan
    compiled for one budget competes at the others. ``progress`` is told each stage;
    ``strategies`` are compiled beside the rolled program's candidates, and ``saved`` caps
    the bytes saved (`remat.plan`'s; the program as written is then never the plan).

    Raises:
      NothingToPlan: (a `ValueError`) when the program has no repeated layers to roll (with
        the reason).
    """
    if not isinstance(argnums, Step):  # a `Step`: aux outputs, or an optimizer's step
        argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    closed = jax.make_jaxpr(fn)(*args)
    if not lifted_runs(closed)[1]:
        name = f"`{getattr(fn, '__qualname__', repr(fn))}`"
        raise NothingToPlan(_NOTHING_ROLLS.format(name=name, why=explain_no_roll(closed)))
    say = progress or (lambda _: None)
    say("compiling the program as written")
    try:
        written: Measurement | None = compile_measure(fn, args, argnums, "none", None)
    except jax.errors.JaxRuntimeError as err:
        if refusal_of(err) is None:
            raise
        written = None  # refused by the compiler: the rolled program's stand-in is the base
    know = None
    out: list[Plan | InfeasibleBudget] = []
    for spec in budgets:
        budget = spec if isinstance(spec, Budget) else read_budget(spec)
        if written is not None and saved is None:
            budget_bytes = budget.to_bytes(peak_of(written), device_memory)
            if peak_of(written) <= budget_bytes:
                out.append(_as_written(fn, args, argnums, written, budget_bytes))
                continue
        if know is None:  # the rolled program's cost models and calibration, once
            say("rolling the repeated layers")
            know = _knowledge(fn, args, argnums, schedules, host_bandwidth, progress, written,
                              per_layer)  # fmt: skip
        try:
            plan = plan_prepared(know.prepared, budget, max_rounds, device_memory, know, progress,
                                 strategies=strategies, saved=saved)  # fmt: skip
        except InfeasibleBudget as err:
            out.append(err)
            continue
        out.append(_rolled(plan))
    return out


def _knowledge(fn, args, argnums, schedules, host_bandwidth, progress, written, per_layer):
    """What is known about the rolled program: from memory (`_memo`) when ``fn`` was
    planned before in this process at these shapes, so that every point compiled then
    competes and nothing is calibrated again; else prepared and remembered."""
    rolled = roll_unscanned(fn)
    return kept(
        lambda: (
            "rolled",
            key_of(
                fingerprint(fn, *args),
                argnums,
                schedules,
                host_bandwidth,
                placement(args),
                per_layer,
            ),
        ),
        rolled,
        args,
        lambda: Knowledge(
            prepare(
                rolled,
                args,
                argnums,
                schedules,
                host_bandwidth,
                progress,
                baseline=written,
                per_layer=per_layer,
            )
        ),
    )


def _as_written(fn, args, argnums, measured, budget_bytes: int) -> Plan:
    peak = peak_of(measured)
    return Plan(
        fn=fn,
        scans=(),
        budget_bytes=budget_bytes,
        predicted_peak_bytes=peak,
        measured=measured,
        baseline_peak_bytes=peak,
        baseline_flops=measured.flops,
        solve_seconds=0.0,
        rounds=0,
        fingerprint=fingerprint(fn, *args),
        argnums=argnums,
    )


def _rolled(plan: Plan) -> Plan:
    return dataclasses.replace(plan, rolled=True)
