"""The planner's choices: each scan's schedules as MILP options, and solutions as plans.

Bridges the cost model (`_costmodel`) and the integer program (`_milp`): every scan gets one
`Option` per schedule, with its own copy of the scan's nodes (stored once per step for
``per_step``, once per inner block step for `Nested`) and its own fixed bytes and FLOPs
(stored carries, re-run forward steps); a `Binomial` schedule keeps one step's residuals, so
it saves every needed value and has no nodes. A solution is decoded back into `ScanPlan`s and
the `ScanChoice`s that `_tag.rewrite` runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from .._core._schedule import Binomial, Nested, Schedule
from .._trace._tag import ScanChoice
from ._costmodel import ScanModel
from ._milp import Node, Option, Solution, materialised


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
    user_name: str | None = None  # the program's own `checkpoint_name` for it
    operands: tuple[str, ...] = ()  # its equation's operand types (see `Plan.policy`)
    site: tuple[str, ...] = ()  # where its equation was made (`_costmodel.Value.site`)


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
    offloaded: tuple[str, ...] = ()  # names kept in host memory between the passes
    # Per position of a per-layer plan (step ``i`` saves ``pattern[i % len(pattern)]``);
    # empty when every step saves ``names`` (see `remat._plan._perlayer`).
    pattern: tuple[tuple[str, ...], ...] = ()
    # The body's jitted calls that hold no saved value run whole (`ScanChoice.kept_calls`).
    kept_calls: bool = False


@dataclasses.dataclass(frozen=True)
class Candidate:
    scan: int  # index into the models
    schedule: Schedule
    option: Option
    nodes: tuple[Node, ...]  # nodes of this option (inputs relative to the scan's block)
    save_all: bool  # the schedule keeps one step's residuals: save every needed value
    # A per-layer option (`remat._plan._perlayer`): per position, the indices of the scan's
    # values it saves (the option has no nodes: its bytes and FLOPs are the positions').
    pattern: tuple[frozenset[int], ...] = ()


def schedules_for(model: ScanModel, enabled: bool) -> list[tuple[Schedule, int, int, float, bool]]:
    """Per option: (schedule, stored copies per saved value, other stored carries, extra
    forward steps, save_all)."""
    n = model.length
    out: list[tuple[Schedule, int, int, float, bool]] = [("per_step", n, 0, 0.0, False)]
    if not enabled or n < 4:
        return out
    from .._scan._revolve import revolve_cost
    from .._scan._scan import nested_lengths

    outer, inner = nested_lengths(n, 2)
    # The outer level keeps `outer` carries; a block is re-run forward once per gradient.
    out.append((Nested(2), inner, outer, float(n), False))
    snapshots = sorted({s for s in (1, 2, 4, math.isqrt(n)) if 1 <= s < n - 1})
    for s in snapshots:
        out.append((Binomial(s), 1, s, float(revolve_cost(n, s) + 1), True))
    return out


def candidates(models: Sequence[ScanModel], schedules: bool) -> list[Candidate]:
    cands = []
    for k, model in enumerate(models):
        needed_bytes = sum(v.bytes for v in model.values if v.needed)
        for schedule, copies, carries, extra_steps, save_all in schedules_for(model, schedules):
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
            cands.append(Candidate(k, schedule, option, nodes, save_all))
    return cands


def assemble(cands: Sequence[Candidate]) -> tuple[list[Node], list[Option], list[int]]:
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
                    group=o,  # one step of the scan is differentiated at a time
                )
            )
    return nodes, [c.option for c in cands], offsets


@dataclasses.dataclass(frozen=True)
class Choice:
    choices: dict[int, ScanChoice]
    scans: tuple[ScanPlan, ...]
    model_bytes: float  # weighted saved + sliced + transient, without the base
    flops: float  # the model's recompute FLOPs
    stored: float = 0.0  # unweighted: saved bytes (with the options' bytes)
    sliced: float = 0.0  # unweighted: one step's copy of the saved values
    transient: float = 0.0  # unweighted: the largest step's materialised recomputed bytes
    kept: float = 0.0  # unweighted: saved bytes with the options' own (uncharged) bytes


def decode(
    solution: Solution,
    cands: Sequence[Candidate],
    offsets: Sequence[int],
    models: Sequence[ScanModel],
    transient_weight: float,
    stored_weight: float = 1.0,
    slice_weight: float = 0.0,
) -> Choice:
    choices: dict[int, ScanChoice] = {}
    scans = []
    for o in solution.options:
        cand = cands[o]
        model = models[cand.scan]
        pattern, times = _pattern(cand, model)
        if cand.save_all:
            idx = [i for i, v in enumerate(model.values) if v.needed]
            copies = 1
            flops = cand.option.flops
        elif pattern:  # a value saved at some positions is stored that many times as often
            idx = [i for i in range(len(model.values)) if times[i]]
            copies = model.length // len(pattern)
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
        offloaded = tuple(
            v.name
            for i, v in enumerate(model.values)
            if not cand.save_all and not pattern and offsets[o] + i in solution.offloaded
        )
        saved = tuple(
            SavedValue(
                name=v.name,
                primitive=v.primitive,
                shape=v.shape,
                dtype=v.dtype,
                bytes=v.bytes,
                multiplicity=1 if v.invariant else copies * (times[i] if pattern else 1),
                source=v.source,
                user_name=v.user_name,
                operands=v.operands,
                site=v.site,
            )
            for i, v in zip(idx, values, strict=True)
        )
        position = _positions(models)[cand.scan]
        schedule = "per_step" if pattern else cand.schedule
        choices[position] = ScanChoice(
            names=names, schedule=schedule, offload=offloaded, pattern=pattern
        )
        scans.append(
            ScanPlan(
                position=position,
                source=model.source,
                length=model.length,
                schedule=schedule,
                names=names,
                saved=saved,
                recompute_flops=float(flops),
                offloaded=offloaded,
                pattern=pattern,
            )
        )
    model_bytes = (
        stored_weight * solution.saved_bytes
        + slice_weight * solution.slice_bytes
        + transient_weight * solution.transient_bytes
    )
    flops = float(sum(s.recompute_flops for s in scans))
    kept = sum(
        cands[o].option.bytes
        + sum(n.bytes * n.multiplicity for i, n in enumerate(cands[o].nodes)
              if offsets[o] + i in solution.saved)
        for o in solution.options
    )  # fmt: skip
    return Choice(
        choices, tuple(scans), model_bytes, flops, stored=float(solution.saved_bytes),
        sliced=float(solution.slice_bytes), transient=float(solution.transient_bytes),
        kept=float(kept),
    )  # fmt: skip


def _pattern(cand, model) -> tuple[tuple[tuple[str, ...], ...], list[int]]:
    """A per-layer option's save set per position (its names, carries left out), and at how
    many positions each value is saved; ``((), [])`` for another option."""
    if not cand.pattern:
        return (), []
    times = [sum(i in kept for kept in cand.pattern) for i in range(len(model.values))]
    pattern = tuple(
        tuple(v.name for i, v in enumerate(model.values) if i in kept and v.primitive != "carry")
        for kept in cand.pattern
    )
    return pattern, times


def _positions(models: Sequence[ScanModel]) -> list[int]:
    return [m.index for m in models]


def alone_key(option: int, scan: ScanChoice) -> tuple[object, ...]:
    """The key of a scan's contribution checked alone (`remat._plan._memo.Knowledge.alone`):
    the option, and the scan's saved and offloaded names, schedule and per-layer pattern."""
    return (option, scan.names, scan.offload, repr(scan.schedule), scan.pattern)


def fixed_choice(
    cands, offsets, models, options: Sequence[int], save: bool | str | frozenset[int]
) -> Choice:
    """The per-step choice that saves every needed value (``save=True``), none (``False``),
    every needed value that is not fusible (``"unfused"``), or the values at the given
    positions of each option's block (a ``frozenset``), needed or not (`fixed_solution`,
    decoded with unit weights)."""
    solution = fixed_solution(cands, offsets, options, save)
    return decode(solution, cands, offsets, models, 1.0, 1.0, 1.0)


def step_point(cands, offsets, models, o: int, save: bool | str, rest: Sequence[int]) -> Choice:
    """`fixed_choice` of option ``o`` as a whole step: the options ``rest`` (one per other
    scan) save nothing, as a calibration point of one scan predicts the step
    (`remat._plan._calibrate.scan_fit`). A scan a choice leaves out compiles as written,
    saving everything, and its scans alone would not count it.
    """
    one = fixed_solution(cands, offsets, [o], save)
    if rest:
        other = fixed_solution(cands, offsets, rest, False)
        one = dataclasses.replace(
            one,
            saved=one.saved | other.saved,
            recomputed=one.recomputed | other.recomputed,
            recompute_flops=one.recompute_flops + other.recompute_flops,
            saved_bytes=one.saved_bytes + other.saved_bytes,
            transient_bytes=max(one.transient_bytes, other.transient_bytes),
            options=tuple(sorted((o, *rest))),
            slice_bytes=one.slice_bytes + other.slice_bytes,
        )
    return decode(one, cands, offsets, models, 1.0, 1.0, 1.0)


def fixed_solution(
    cands, offsets, options: Sequence[int], save: bool | str | frozenset[int]
) -> Solution:
    """The `Solution` of `fixed_choice`."""
    saved, recomputed, transient = set(), set(), 0.0
    nodes = [n for c in cands for n in c.nodes]
    listed = isinstance(save, frozenset)
    for o in options:
        for i, node in enumerate(cands[o].nodes):
            keep = (
                save is True or (save == "unfused" and not node.fusible) or (listed and i in save)
            )
            if not node.saveable or (not keep and node.recomputable):
                recomputed.add(offsets[o] + i)
            elif node.needed or not node.recomputable or listed:
                saved.add(offsets[o] + i)
    # Only what the backward pass needs is recomputed: the needed values not saved, and what
    # they are computed from, back to saved values. An input that is not saved is recomputed
    # even where the save rule left it out (a value no backward rule reads, e.g. the matmul
    # output that `split` cuts into an LSTM's gates, under ``"unfused"``): the policy does not
    # keep it, so XLA computes it again.
    wanted = {i for i in recomputed if nodes[i].needed}
    stack = list(wanted)
    while stack:
        for u in nodes[stack.pop()].inputs:
            if u not in saved and u not in wanted:
                wanted.add(u)
                stack.append(u)
    recomputed = wanted
    live = materialised(nodes, recomputed)
    for o in options:
        block = range(offsets[o], offsets[o] + len(cands[o].nodes))
        transient = max(
            transient, sum(nodes[i].bytes for i in block if i in live and nodes[i].needed)
        )
    return Solution(
        saved=frozenset(saved),
        recomputed=frozenset(recomputed),
        recompute_flops=float(sum(nodes[i].recompute_flops for i in recomputed))
        + float(sum(cands[o].option.flops for o in options)),
        saved_bytes=int(sum(nodes[i].bytes * nodes[i].multiplicity for i in saved)),
        transient_bytes=int(transient),
        options=tuple(options),
        slice_bytes=int(sum(nodes[i].bytes for i in saved if nodes[i].multiplicity > 1)),
    )


def offload_costs(
    nodes: Sequence[Node],
    cands: Sequence[Candidate],
    offsets: Sequence[int],
    models: Sequence[ScanModel],
    host_bandwidth: float,
    flops_per_second: float | None = None,
) -> list[Node]:
    """``nodes`` with `Node.offload_flops` set for every named value a step may save.

    The transfer time of a value's copies (`remat._core._offload.transfer_seconds`) is converted
    to FLOPs at the device's matmul rate (measured once,
    `remat._core._offload.device_flops_per_second`), so one objective weighs recomputation and
    transfers.
    """
    from .._core._offload import device_flops_per_second, transfer_seconds

    rate = flops_per_second or device_flops_per_second()
    out = list(nodes)
    for o, cand in enumerate(cands):
        values = models[cand.scan].values
        for i, node in enumerate(cand.nodes):
            if node.saveable and values[i].primitive != "carry":
                seconds = transfer_seconds(node.bytes * node.multiplicity, host_bandwidth)
                out[offsets[o] + i] = dataclasses.replace(
                    out[offsets[o] + i], offload_flops=seconds * rate
                )
    return out
