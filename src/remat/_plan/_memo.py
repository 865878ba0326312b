"""What the planner has learned about a program, kept in memory by its fingerprint.

Planning the same program again at another budget (or `plan_budgets`) reuses the traced cost
models, the un-checkpointed step, the calibration on scan-alone programs, every candidate
checked alone, the charges of `remat.Nested` and `remat.Binomial` options, the memory outside
the scans that the first verified plan showed, and every plan compiled so far; so it compiles
the whole step once more (twice only when the plan it compiles measures over the budget),
and a plan it has already compiled is never beaten by a worse one. A few programs are kept (`KEEP`), the most recently used.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from .._measure._measurement import Measurement
from ._baseline import REFUSED
from ._calibrate import Prepared
from ._compile import peak_of

if TYPE_CHECKING:
    from ._options import Choice

KEEP = 4


@dataclasses.dataclass(frozen=True)
class Known:
    """A compiled point: a choice and its measured step, with the prediction made for it."""

    choice: Any  # `Choice`
    measured: Measurement
    predicted: int
    alone: float | None = None  # the scan-alone prediction, before the margin


@dataclasses.dataclass
class Knowledge:
    """What is known about one program (mutable: it grows with every plan)."""

    prepared: Prepared
    measured: dict[Any, Known] = dataclasses.field(default_factory=dict)
    # (option, names, schedule, offload) -> the scan's contribution to the step's peak, from
    # a scan-alone compile (see `_alone.check_alone`).
    alone: dict[Any, float] = dataclasses.field(default_factory=dict)
    option_extra: dict[int, float] = dataclasses.field(default_factory=dict)
    # Measured peak minus the scan-alone prediction of the last verified plan: the memory
    # outside the scans that the scan-alone programs do not see. Before a plan is verified,
    # the un-checkpointed step's (`Prepared.margin`), or None.
    margin: float | None = None
    # `choice_key`s of the candidates called over the budget without compiling them
    # (`_line.guess`): their scan-alone bytes are the line's, never its points.
    guessed: set[Any] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        self.alone.update(self.prepared.alone)
        if self.margin is None:
            self.margin = self.prepared.margin
        for choice, measured in self.prepared.compiled:  # steps compiled while calibrating
            known = Known(choice, measured, peak_of(measured))
            self.measured.setdefault(choice_key(choice), known)


_MEMORY: collections.OrderedDict[Any, Knowledge] = collections.OrderedDict()


def key_of(
    print_: str,
    argnums: Any,
    schedules: bool,
    host_bandwidth: float | None,
    where: tuple[str, int] | None = None,
    per_layer: bool = False,
) -> Any:
    """The memo key: the program, what is differentiated, what is offered, and where it
    compiles (``where``: platform and devices, `remat._shard._target.placement`; default this
    machine's)."""
    where = where or (jax.default_backend(), jax.device_count())
    return (print_, argnums, schedules, per_layer, host_bandwidth, *where)


def recall(key: Any, fn: Any, args: Any) -> Knowledge | None:
    """The knowledge kept for ``key``, with ``fn`` and ``args`` (the caller's, which trace to
    the same program) in place of the ones it was learned with; None if there is none, or
    if its per-layer options failed on their thread (`_mixes`)."""
    know = _MEMORY.get(key)
    if know is None:
        return None
    later = getattr(know.prepared, "later", None)  # per-layer options found on a thread (`_mixes`)
    if later is not None and later.failed():  # prepared again: the error is raised anew
        del _MEMORY[key]
        return None
    _MEMORY.move_to_end(key)
    know.prepared = dataclasses.replace(know.prepared, fn=fn, args=tuple(args))
    return know


def kept(key: Callable[[], Any], fn: Any, args: Any, make: Callable[[], Knowledge]) -> Knowledge:
    """The knowledge kept for the memo key ``key()`` (`recall`), else ``make()``, remembered.
    A program ``key`` cannot trace as given is made and not kept (``make`` says why)."""
    memo_key = None
    with contextlib.suppress(Exception):
        memo_key = key()
        hash(memo_key)
    know = recall(memo_key, fn, args) if memo_key is not None else None
    if know is None:
        know = make()
        if memo_key is not None:
            remember(memo_key, know)
    return know


def siblings(know: Knowledge) -> list[Knowledge]:
    """``know`` and the knowledge kept of the same program planned with per-layer options
    or without (`key_of`'s ``per_layer``): what either compiled, the program reaches."""
    key = next((k for k, v in _MEMORY.items() if v is know), None)
    if key is None:
        return [know]
    same = key[:3] + key[4:]
    return [know, *(v for k, v in _MEMORY.items() if v is not know and k[:3] + k[4:] == same)]


def remember(key: Any, know: Knowledge) -> None:
    _MEMORY[key] = know
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > KEEP:
        _MEMORY.popitem(last=False)


def forget() -> None:
    """Drops everything learned (the next plan of any program starts from scratch)."""
    _MEMORY.clear()


def choice_key(choice: Choice) -> tuple[Any, ...]:
    """A hashable identity of a choice: per scan, its names, offloaded names, schedule,
    per-layer pattern and whether its jitted calls are kept whole."""
    return tuple(
        sorted(
            (k, v.names, v.offload, repr(v.schedule), v.pattern, v.kept_calls)
            for k, v in choice.choices.items()
        )
    )


def step_flops(prep: Prepared, choice: Choice) -> float:
    """The step's FLOPs per device that the model predicts for ``choice``: the
    un-checkpointed step's (measured, per device) and the choice's recomputation (the cost
    model's, of the whole program: shapes are global) shared among the devices."""
    return prep.baseline.flops + choice.flops / max(prep.baseline.num_devices, 1)


def cost(prep: Prepared, known: Known) -> float:
    """A compiled point's FLOPs per device: measured, but never below the model's (the backward
    loop of a `remat.Binomial` schedule has no static trip count, so its measured FLOPs are a
    lower bound)."""
    return max(known.measured.flops, step_flops(prep, known.choice))


# Plans whose FLOPs differ by less than this fraction of the un-checkpointed step's cost the
# same (`best_known`): the smaller peak wins between them.
EQUAL_FLOPS = 1e-6


def best_known(
    prep: Prepared, know: Knowledge, budget_bytes: int, saved: int | None = None
) -> Known | None:
    """The compiled point with the fewest FLOPs that fits (and saves at most ``saved`` bytes,
    `saved_of`, when given); among equals (to `EQUAL_FLOPS` of the un-checkpointed step's)
    the smallest peak, then a uniform plan (one save set per scan: it compiles faster and
    differentiates in forward mode too)."""
    fits = [
        k
        for k in know.measured.values()
        if peak_of(k.measured) <= budget_bytes
        and k.measured.peak_source != REFUSED
        and (saved is None or saved_of(k.measured) <= saved)
    ]
    if not fits:
        return None
    fewest = min(cost(prep, k) for k in fits) + max(prep.baseline.flops, 1.0) * EQUAL_FLOPS
    equal = [k for k in fits if cost(prep, k) <= fewest]
    return min(equal, key=lambda k: (peak_of(k.measured), per_layer(k.choice), cost(prep, k)))


def saved_of(measured: Measurement) -> int:
    """The bytes a step saves for its backward pass: its residuals other than its arguments
    (`remat.Measurement.residuals`, each stored value times its multiplicity)."""
    return sum(r.total_bytes for r in measured.residuals if r.primitive != "argument")


def margins(prep: Prepared, know: Knowledge, uniform: bool = False) -> list[float]:
    """The memory outside the scans each measured point showed: the un-checkpointed step's
    (`Prepared.margin`) and, per verified plan (``uniform``: of those with no per-layer
    pattern), its compiled peak minus its scan-alone prediction (`Known.alone`). It differs
    between save sets (what the step keeps beside the scans as their peak falls, e.g. the
    loss head's logits), so the last one (`Knowledge.margin`) is a correction learnt on one
    plan, good to within their spread."""
    shown = [
        float(peak_of(k.measured) - k.alone)
        for k in know.measured.values()
        if k.alone is not None
        and k.measured.peak_source != REFUSED
        and not (uniform and per_layer(k.choice))
    ]
    return ([] if prep.margin is None else [float(prep.margin)]) + shown


def reported_margin(prep: Prepared, know: Knowledge, choice: Choice, margin: float) -> float:
    """The memory outside the scans in the peak predicted for ``choice`` before its step is
    compiled, as the plan reports it (`Known.predicted`, `remat.Plan.predicted_peak_bytes`):
    for a uniform plan, the middle of the range the un-checkpointed step and the uniform
    plans verified so far showed (`margins`); else ``margin``, the one the rounds decide
    with (`Knowledge.margin`, the last learnt).

    That memory differs between save sets by how XLA packs their temporaries, which no
    measurement made before the compile tells; the rounds decide with the last one learnt
    and allow for the spread (`_spread`), and the figure reported is the guess whose error
    is at most half the spread measured, whichever set's memory the plan has. The last one
    learnt can be the farthest: at Llama-3.2-1B shapes, 6.20 GiB beside a candidate compiled
    over MaxText ``save_out_proj``'s peak, 4.62-5.01 GiB beside the un-checkpointed step and
    every plan compiled before; the plan compiled next (32.55 GiB) was predicted 3.3% over
    with it, 0.9% over with the middle (the preset rows at 1B, 8B and 70B: within 1.0%).

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._memo import reported_margin
      >>> point = lambda peak, alone: N(measured=N(peak_bytes=peak, peak_source="xla"),
      ...                               alone=alone, choice=N(choices={}))
      >>> know = N(measured={1: point(105, 100), 2: point(112, 100)})
      >>> reported_margin(N(margin=4.0), know, N(choices={}), margin=12.0)  # 4 to 12
      8.0
      >>> reported_margin(N(margin=4.0), N(measured={}), N(choices={}), margin=4.0)
      4.0
    """
    shown = margins(prep, know, uniform=True)
    if per_layer(choice) or not shown:
        return margin
    return (min(shown) + max(shown)) / 2


def per_layer(choice: Choice) -> bool:
    """Whether ``choice`` saves a set per layer in some scan (a ``pattern``)."""
    return any(s.pattern for s in choice.choices.values())
