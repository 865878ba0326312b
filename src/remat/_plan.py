"""`remat.plan`: the cheapest checkpointing of a gradient step that fits a memory budget.

Trace → cost model → solve → rewrite → compile and measure:

1. ``fn`` is traced and each scan not inside another scan gets a cost model (`_costmodel`):
   its body as a graph of values with bytes, FLOPs and what the backward pass needs.
2. Each scan gets a few schedules (``per_step``, `remat.Nested`, `remat.Binomial`), and one
   mixed-integer program (`_milp`, Checkmate-style; Jain et al., MLSys 2020) chooses, for all
   scans together, the schedule and the set of values to save that recompute the fewest
   FLOPs within the budget.
3. The memory model is calibrated on the compiled program: the peak with every needed value
   saved gives the memory outside the scans; the peak with nothing saved gives how much of a
   step's recomputed values is live at once (XLA fuses much of it).
4. The chosen plan is compiled and measured (`remat.measure`); if its peak is over the
   budget, the model's budget is tightened by the error and the program solved again, a
   bounded number of times. If nothing fits, `InfeasibleBudget` says how close it came.

Measured FLOPs are matmul FLOPs read from the optimised HLO with loop trip counts; the
backward loop of a `remat.Binomial` schedule has no static trip count, so for plans that use
it the measured FLOPs are a lower bound (the model's ``recompute_flops`` are not).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from ._budget import format_bytes, parse_budget
from ._costmodel import ScanModel, model_scans
from ._io import atomic_write_text
from ._measure import _check_args, _check_scalar
from ._measurement import Measurement
from ._milp import Node, Option, Solution, solve
from ._schedule import Binomial, Nested, Schedule
from ._tag import ScanChoice, planned_scans, rewrite
from ._warnings import RematWarning

PLAN_FORMAT = 1

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
_CHANGED = (
    "`remat.load_plan` refuses the plan in {path}: it was made for a different program (its "
    "fingerprint {saved} is not {now}, the fingerprint of the function traced at these "
    "arguments). The model, its shapes or dtypes changed; run `remat.plan` again."
)
_BAD_FILE = "`remat.load_plan` cannot read {path}: {why}. Write it with `Plan.to_json(path)`."


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
class SavedValue:
    """A value that a plan saves at every step of a scan."""

    name: str
    primitive: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    multiplicity: int
    source: str | None


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """What a plan does with one scan: its schedule and the values it saves."""

    position: int
    source: str | None
    length: int
    schedule: Schedule
    names: tuple[str, ...]
    saved: tuple[SavedValue, ...]
    recompute_flops: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checkpointing plan: the rewritten function and why it was chosen.

    Attributes:
      fn: ``fn`` rewritten by the plan: same signature, same values and gradients.
      scans: one `ScanPlan` per planned scan.
      budget_bytes: the budget the plan was made for.
      predicted_peak_bytes: the peak memory the calibrated model predicted for the plan.
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

        Example:
          >>> import jax, jax.numpy as jnp, remat
          >>> def loss(ws, x):
          ...     x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
          ...     return (x**2).sum()
          >>> p = remat.plan(loss, jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8)), budget=1.0)
          >>> "predicted peak" in p.explain()
          True
        """
        from rich.console import Console

        console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(self.table())
        return console.export_text()

    def __str__(self) -> str:
        return self.explain()

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (without ``fn``)."""
        data = {
            "format": PLAN_FORMAT,
            **{
                f.name: _plain(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name not in ("fn", "scans", "measured")
            },
            "scans": [
                {
                    **_plain(dataclasses.replace(s, schedule="per_step")),
                    "schedule": _enc(s.schedule),
                }
                for s in self.scans
            ],
            "measured": None if self.measured is None else _plain(self.measured),
        }
        return data

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes the plan to ``path`` as JSON, atomically; reload it with `remat.load_plan`."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))


def peak_of(m: Measurement) -> int:
    """The peak memory of a measurement.

    XLA's CPU backend reports a ``peak_memory_in_bytes`` that leaves out temporaries (it can
    be below the temporaries alone); then ``temp + argument + output - alias`` is used.
    """
    total = m.temp_bytes + m.argument_bytes + m.output_bytes - m.alias_bytes
    return total if m.peak_bytes < m.temp_bytes else m.peak_bytes


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


### Schedules: each is an `Option` of the MILP


@dataclasses.dataclass(frozen=True)
class _Candidate:
    scan: int  # index into the models
    schedule: Schedule
    option: Option
    nodes: tuple[Node, ...]  # nodes of this option (inputs relative to the scan's block)
    save_all: bool  # the schedule keeps one step's residuals: save every needed value


def _schedules(model: ScanModel, enabled: bool) -> list[tuple[Schedule, int, int, float, bool]]:
    """Per option: (schedule, stored copies per saved value, other stored carries, extra
    forward steps, save_all)."""
    n = model.length
    out: list[tuple[Schedule, int, int, float, bool]] = [("per_step", n, 0, 0.0, False)]
    if not enabled or n < 4:
        return out
    from ._revolve import revolve_cost
    from ._scan import nested_lengths

    outer, inner = nested_lengths(n, 2)
    # The outer level keeps `outer` carries; a block is re-run forward once per gradient.
    out.append((Nested(2), inner, outer, float(n), False))
    snapshots = sorted({s for s in (1, 2, 4, math.isqrt(n)) if 1 <= s < n - 1})
    for s in snapshots:
        out.append((Binomial(s), 1, s, float(revolve_cost(n, s) + 1), True))
    return out


def _candidates(models: Sequence[ScanModel], schedules: bool) -> list[_Candidate]:
    cands = []
    for k, model in enumerate(models):
        needed_bytes = sum(v.bytes for v in model.values if v.needed)
        for schedule, copies, carries, extra_steps, save_all in _schedules(model, schedules):
            flops = extra_steps * model.step_flops
            if save_all:
                option = Option(
                    group=k,
                    bytes=float(carries * model.carry_bytes),
                    flops=flops,
                    transient=float(needed_bytes),
                )
                nodes: tuple[Node, ...] = ()
            else:
                option = Option(group=k, bytes=float(carries * model.carry_bytes), flops=flops)
                nodes = tuple(model.nodes(steps=copies))
            cands.append(_Candidate(k, schedule, option, nodes, save_all))
    return cands


def _assemble(cands: Sequence[_Candidate]) -> tuple[list[Node], list[Option], list[int]]:
    """All candidates' nodes in one graph; returns nodes, options, and each node's offset."""
    nodes: list[Node] = []
    offsets: list[int] = []
    for o, cand in enumerate(cands):
        base = len(nodes)
        offsets.append(base)
        for node in cand.nodes:
            nodes.append(
                dataclasses.replace(
                    node,
                    inputs=tuple(base + u for u in node.inputs),
                    option=o,
                    group=o,
                )
            )
    return nodes, [c.option for c in cands], offsets


@dataclasses.dataclass(frozen=True)
class _Choice:
    choices: dict[int, ScanChoice]
    scans: tuple[ScanPlan, ...]
    model_bytes: float  # saved + weighted transient, without the base


def _decode_solution(
    solution: Solution,
    cands: Sequence[_Candidate],
    offsets: Sequence[int],
    models: Sequence[ScanModel],
    transient_weight: float,
) -> _Choice:
    choices: dict[int, ScanChoice] = {}
    scans = []
    for o in solution.options:
        cand = cands[o]
        model = models[cand.scan]
        if cand.save_all:
            idx = [i for i, v in enumerate(model.values) if v.needed]
            copies = 1
            flops = cand.option.flops
        else:
            idx = [i for i in range(len(cand.nodes)) if offsets[o] + i in solution.saved]
            copies = cand.nodes[0].multiplicity if cand.nodes else 1
            flops = cand.option.flops + sum(
                cand.nodes[i].recompute_flops
                for i in range(len(cand.nodes))
                if offsets[o] + i in solution.recomputed
            )
        values = [model.values[i] for i in idx]
        names = tuple(v.name for v in values if v.primitive != "carry")
        saved = tuple(
            SavedValue(
                name=v.name,
                primitive=v.primitive,
                shape=v.shape,
                dtype=v.dtype,
                bytes=v.bytes,
                multiplicity=1 if v.invariant else copies,
                source=v.source,
            )
            for v in values
        )
        position = _positions(models)[cand.scan]
        choices[position] = ScanChoice(names=names, schedule=cand.schedule)
        scans.append(
            ScanPlan(
                position=position,
                source=model.source,
                length=model.length,
                schedule=cand.schedule,
                names=names,
                saved=saved,
                recompute_flops=float(flops),
            )
        )
    model_bytes = solution.saved_bytes + transient_weight * solution.transient_bytes
    return _Choice(choices, tuple(scans), model_bytes)


def _positions(models: Sequence[ScanModel]) -> list[int]:
    return [m.index for m in models]


### Main API


def plan(
    fn: Callable[..., Any],
    *args: Any,
    budget: int | float | str,
    argnums: int | Sequence[int] = 0,
    schedules: bool = True,
    max_rounds: int = 4,
    device_memory: int | None = None,
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
      schedules: also consider `Nested` and `Binomial` schedules (else only ``per_step``).
      max_rounds: the most solve-and-measure rounds.
      device_memory: the device's memory in bytes, if a budget above it should be refused.

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
      >>> ws, x = jnp.ones((8, 16, 16)) * 0.1, jnp.ones((4, 16))
      >>> p = remat.plan(loss, ws, x, budget="90%")
      >>> p.measured_peak_bytes <= p.budget_bytes
      True
      >>> g = jax.grad(p.fn)(ws, x)
      >>> bool(jnp.allclose(g, jax.grad(loss)(ws, x), rtol=1e-5, atol=1e-6))
      True
    """
    if not callable(fn):
        raise TypeError(f"`remat.plan` got fn={fn!r}, which is not callable; pass the loss.")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"`remat.plan` got max_rounds={max_rounds!r}; pass an int >= 1.")
    argnums = argnums if isinstance(argnums, int) else tuple(argnums)
    try:  # the same checks as `remat.measure`, named for `remat.plan`
        _check_args(args, argnums)
        _check_scalar(fn, args)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err).replace("`remat.measure`", "`remat.plan`")) from None
    baseline = _compile_measure(fn, args, argnums, "none", None)
    baseline_peak = peak_of(baseline)
    budget_bytes = parse_budget(budget, baseline_peak, device_memory)

    clock = time.perf_counter()
    infos = planned_scans(fn, *args)
    if not infos:
        raise ValueError(_NO_SCAN.format(name=f"`{getattr(fn, '__qualname__', repr(fn))}`"))
    models = model_scans(infos)
    cands = _candidates(models, schedules)
    nodes, options, offsets = _assemble(cands)
    print_ = fingerprint(fn, *args)
    solve_seconds = time.perf_counter() - clock

    # Calibration: every needed value saved (no transient) and nothing saved (all transient).
    per_step = [o for o, c in enumerate(cands) if c.schedule == "per_step"]
    everything = _fixed_choice(cands, offsets, models, per_step, save=True)
    nothing = _fixed_choice(cands, offsets, models, per_step, save=False)
    peak_all = _light_peak(rewrite(fn, everything.choices), args, argnums)
    peak_none = _light_peak(rewrite(fn, nothing.choices), args, argnums)
    base = peak_all - everything.model_bytes
    transient = nothing.model_bytes - _stored(nothing)
    weight = (
        min(max((peak_none - base - _stored(nothing)) / transient, 0.0), 1.0) if transient else 1.0
    )

    margin = 0.0
    smallest = min(peak_all, peak_none)
    for rounds in range(1, max_rounds + 1):
        clock = time.perf_counter()
        solution = solve(
            nodes, budget_bytes, options=options, fixed_bytes=base + margin,
            transient_weight=weight,
        )  # fmt: skip
        last = solution is None
        if last:
            solution = solve(nodes, budget_bytes, options=options, minimize="memory",
                             transient_weight=weight)  # fmt: skip
        choice = _decode_solution(solution, cands, offsets, models, weight)
        solve_seconds += time.perf_counter() - clock
        planned = rewrite(fn, choice.choices)
        measured = _compile_measure(planned, args, argnums, "plan", baseline)
        peak = peak_of(measured)
        smallest = min(smallest, peak)
        predicted = int(base + choice.model_bytes)
        if peak <= budget_bytes:
            return Plan(
                fn=planned,
                scans=choice.scans,
                budget_bytes=budget_bytes,
                predicted_peak_bytes=predicted,
                measured=measured,
                baseline_peak_bytes=baseline_peak,
                baseline_flops=baseline.flops,
                solve_seconds=solve_seconds,
                rounds=rounds,
                fingerprint=print_,
                argnums=argnums,
            )
        if last:
            break
        # The model was optimistic by (peak - predicted - margin): tighten by that much.
        margin += max(peak - (predicted + margin), 0.01 * budget_bytes)
    raise InfeasibleBudget(budget, budget_bytes, smallest, baseline_peak)


def _stored(choice: _Choice) -> float:
    return float(sum(sv.bytes * sv.multiplicity for s in choice.scans for sv in s.saved))


def _fixed_choice(cands, offsets, models, options: Sequence[int], save: bool) -> _Choice:
    """The per-step choice that saves every needed value (``save``) or none."""
    saved, recomputed, transient = set(), set(), 0.0
    for o in options:
        groups = 0.0
        for i, node in enumerate(cands[o].nodes):
            if not node.saveable or (not save and node.recomputable):
                recomputed.add(offsets[o] + i)
                groups += node.bytes if node.needed else 0.0
            elif node.needed or not node.recomputable:
                saved.add(offsets[o] + i)
        transient = max(transient, groups)
    nodes = [n for c in cands for n in c.nodes]
    solution = Solution(
        saved=frozenset(saved),
        recomputed=frozenset(recomputed),
        recompute_flops=0.0,
        saved_bytes=int(sum(nodes[i].bytes * nodes[i].multiplicity for i in saved)),
        transient_bytes=int(transient),
        options=tuple(options),
    )
    return _decode_solution(solution, cands, offsets, models, 1.0)


def _compile_measure(
    fn: Callable[..., Any],
    args: Sequence[Any],
    argnums: Any,
    label: str,
    baseline: Measurement | None,
) -> Measurement:
    """`remat.measure`'s numbers for ``fn`` from a single compile of its gradient step.

    Memory and FLOPs are read as `remat.measure` reads them; ``forward_flops`` is the traced
    matmul count (checkpointing does not change the forward pass), and the recomputation is
    judged eliminated when the plan's matmul FLOPs are not above the un-checkpointed step's.
    """
    from ._checkpoints import traced_dot_flops
    from ._hlo import hlo_flops
    from ._measure import measure_compiled
    from ._residuals import saved_residuals

    step = jax.value_and_grad(fn, argnums)
    start = time.perf_counter()
    compiled = jax.jit(step).lower(*args).compile()
    seconds = time.perf_counter() - start
    with warnings.catch_warnings():
        # A Binomial schedule's backward loop has a data-dependent trip count that the HLO
        # reader cannot see: its FLOPs are then a lower bound (see the module docstring).
        warnings.simplefilter("ignore", RematWarning)
        flops = hlo_flops(compiled.as_text())
    residuals = saved_residuals(fn, *args, argnums=argnums)
    forward = traced_dot_flops(jax.make_jaxpr(fn)(*args).jaxpr)
    requested = baseline is not None
    return Measurement(
        **measure_compiled(compiled),
        residuals=residuals,
        residual_bytes=sum(r.total_bytes for r in residuals),
        flops=flops,
        forward_flops=forward,
        recompute_requested=requested,
        recompute_eliminated=False,
        compile_seconds=seconds,
        seconds=None,
        strategy=label,
        backend=jax.default_backend(),
        num_devices=1,
        plain_flops=None if baseline is None else baseline.flops,
    )


def _light_peak(fn: Callable[..., Any], args: Sequence[Any], argnums: Any) -> int:
    """The peak of the compiled gradient step (one compile, nothing else)."""
    from ._measure import measure_compiled

    compiled = jax.jit(jax.value_and_grad(fn, argnums)).lower(*args).compile()
    m = measure_compiled(compiled)
    total = m["temp_bytes"] + m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"]
    return total if m["peak_bytes"] < m["temp_bytes"] else m["peak_bytes"]


### JSON


def _enc(schedule: Schedule) -> Any:
    if isinstance(schedule, Binomial):
        return {"binomial": schedule.snapshots}
    if isinstance(schedule, Nested):
        return {"nested": schedule.levels, "lengths": schedule.lengths}
    return schedule


def _dec(data: Any) -> Schedule:
    if isinstance(data, dict) and "binomial" in data:
        return Binomial(int(data["binomial"]))
    if isinstance(data, dict) and "nested" in data:
        lengths = data.get("lengths")
        return Nested(int(data["nested"]), None if lengths is None else tuple(lengths))
    return data


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def load_plan(path: str | os.PathLike, fn: Callable[..., Any], *args: Any) -> Plan:
    """Loads a plan written by `Plan.to_json` and applies it to ``fn``, without solving.

    Args:
      path: the JSON file.
      fn: the function the plan was made for.
      *args: its arguments (the same shapes and dtypes as when planning).

    Returns:
      The `remat.Plan`, with ``fn`` rewritten as the plan says.

    Raises:
      ValueError: if the file is not a plan, or ``fn`` traced at ``args`` is not the
        program the plan was made for (its fingerprint changed).

    Example:
      >>> import jax, jax.numpy as jnp, remat, tempfile, os
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
      ...     return (x**2).sum()
      >>> ws, x = jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8))
      >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
      >>> _ = remat.plan(loss, ws, x, budget=1.0).to_json(path)
      >>> p = remat.load_plan(path, loss, ws, x)
      >>> bool(jnp.allclose(p.fn(ws, x), loss(ws, x)))
      True
    """
    from ._report import _decode

    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {PLAN_FORMAT}")
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(_BAD_FILE.format(path=path, why=err)) from err
    now = fingerprint(fn, *args)
    if data["fingerprint"] != now:
        raise ValueError(_CHANGED.format(path=path, saved=data["fingerprint"], now=now))
    scans = tuple(
        ScanPlan(
            position=s["position"],
            source=s["source"],
            length=s["length"],
            schedule=_dec(s["schedule"]),
            names=tuple(s["names"]),
            saved=tuple(_decode(SavedValue, v) for v in s["saved"]),
            recompute_flops=float(s["recompute_flops"]),
        )
        for s in data["scans"]
    )
    choices = {s.position: ScanChoice(names=s.names, schedule=s.schedule) for s in scans}
    argnums = data.get("argnums", 0)
    return Plan(
        fn=rewrite(fn, choices),
        scans=scans,
        budget_bytes=int(data["budget_bytes"]),
        predicted_peak_bytes=int(data["predicted_peak_bytes"]),
        measured=_decode(Measurement, data["measured"]),
        baseline_peak_bytes=int(data["baseline_peak_bytes"]),
        baseline_flops=float(data["baseline_flops"]),
        solve_seconds=float(data["solve_seconds"]),
        rounds=int(data["rounds"]),
        fingerprint=data["fingerprint"],
        argnums=tuple(argnums) if isinstance(argnums, list) else argnums,
    )
