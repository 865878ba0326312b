"""The named strategies as candidates: a plan is never worse than one remat can name.

The integer program's memory model is linear, and on a program with several stacks (an
encoder and a decoder, a vision tower and a language model) its least-memory choice can
compile above a strategy that a user would try first: ``remat.measure(loss, *args,
strategy="full")``. So before a budget is declared infeasible, and when the budget is near
the least memory measured (`NEAR`), every combination of named per-step save sets over the
scans (``full``: nothing saved; ``dots``: the matmul outputs; ``everything``: every value the
backward pass needs) is a candidate (`named_choices`): each is checked on its scans alone
(`_alone.check_alone`; the ``full`` and ``everything`` programs are compiled already for the
calibration), and the cheapest predicted to fit is compiled and measured, at most
`COMPILES` of them; when nothing measured fits, ``full`` on every scan is always one of
them. With more scans than `ALL_COMBINATIONS` allows, the uniform choices and
each scan's named option with the others ``full`` are the candidates.

Strategies the caller gives (`remat.plan`'s ``strategies``: ``"names:a,b"`` or a named one on
every scan, `given_choice`) are compiled whole, each once per program, unless the model's
FLOPs for one already reach the cheapest plan measured (`try_given`): near a TPU chip's memory
the compiler recomputes values of its own accord, by amounts the cost model does not see, so
a save set the model ranks dearer can compile cheaper (docs/tpu.md).

A named candidate the model puts far over the budget (`far_over`) is neither checked alone
nor compiled: at Llama-3-70B shapes, planned at 50%, the model puts ``dots`` 33% over the
budget, and it was compiled alone beside the plan's step only to come out 30% over.

`describe` names a compiled point by its strategies, for `remat.InfeasibleBudget`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from .._core._strategy import PLANNABLE_NAMES, split_names
from ._alone import check_alone
from ._calibrate import Prepared
from ._memo import Knowledge, Known, best_known, choice_key, cost, per_layer, step_flops
from ._milp import Solution
from ._options import Choice, decode, fixed_solution
from ._spread import checked
from ._spread import spread as memory_spread

# The named per-step save sets, least memory first.
NAMES = PLANNABLE_NAMES
# A budget at most this far above the least memory measured for the program makes the named
# strategies candidates even when a plan fits (the model is least accurate there).
NEAR = 0.10
# Step compiles spent on named candidates per budget.
COMPILES = 2
# Every combination of named save sets is a candidate up to this many (3 scans: 27).
ALL_COMBINATIONS = 27
# When nothing measured fits, a named candidate predicted at most this far over the budget
# is still compiled (the scan-alone prediction is within a few percent).
BAND = 0.02
# A named candidate the model puts over the budget by more than this fraction of the budget,
# and by more than `SAFETY` times the model's largest error on a candidate compiled alone, is
# not checked (`far_over`).
FAR = 0.10
SAFETY = 4.0


def _save(prep: Prepared, o: int, name: str) -> bool | frozenset[int]:
    """`fixed_solution`'s ``save`` for option ``o`` under the named strategy ``name``."""
    if name == "full":
        return False
    if name == "everything":
        return True
    values = prep.models[prep.cands[o].scan].values
    return frozenset(i for i, v in enumerate(values) if v.primitive == "dot_general")


def _per_step(prep: Prepared) -> list[int]:
    """Each scan's ``per_step`` option, in scan order."""
    return [o for o, c in enumerate(prep.cands) if c.schedule == "per_step"]


def _merged(parts: list[Solution]) -> Solution:
    return Solution(
        saved=frozenset().union(*(p.saved for p in parts)),
        recomputed=frozenset().union(*(p.recomputed for p in parts)),
        recompute_flops=sum(p.recompute_flops for p in parts),
        saved_bytes=sum(p.saved_bytes for p in parts),
        transient_bytes=max(p.transient_bytes for p in parts),
        options=tuple(o for p in parts for o in p.options),
        slice_bytes=sum(p.slice_bytes for p in parts),
    )


def named_choice(prep: Prepared, names: tuple[str, ...]) -> tuple[Solution, Choice]:
    """The per-step plan that runs scan ``k`` with the named strategy ``names[k]``."""
    options = _per_step(prep)
    parts = [
        fixed_solution(prep.cands, prep.offsets, [o], _save(prep, o, name))
        for o, name in zip(options, names, strict=True)
    ]
    solution = _merged(parts)
    choice = prep.decode(solution)
    return solution, choice


def named_choices(prep: Prepared) -> list[tuple[tuple[str, ...], Solution, Choice]]:
    """Every combination of named strategies over the scans (see the module docstring),
    without repeats (on a scan without matmuls ``dots`` is ``full``)."""
    scans = len(_per_step(prep))
    if not scans:
        return []
    if len(NAMES) ** scans <= ALL_COMBINATIONS:
        combos = list(itertools.product(NAMES, repeat=scans))
    else:
        combos = [(name,) * scans for name in NAMES]
        for k, name in itertools.product(range(scans), NAMES[1:]):
            combos.append(tuple(name if j == k else "full" for j in range(scans)))
    out, seen = [], set()
    for names in combos:
        solution, choice = named_choice(prep, names)
        key = choice_key(choice)
        if key not in seen:
            seen.add(key)
            out.append((names, solution, choice))
    return out


def wanted(prep: Prepared, know: Knowledge, best: Known | None, budget_bytes: int) -> bool:
    """Whether the named strategies are tried: nothing measured fits, or the budget is
    within `NEAR` of the least memory measured for the program."""
    if not prep.scan_fits or not _per_step(prep):
        return False
    if best is None:
        return True
    least = min(k.measured.peak_bytes for k in know.measured.values())
    return budget_bytes <= (1 + NEAR) * least


def far_over(prep: Prepared, know: Knowledge, choice: Choice, budget_bytes: int,
             pairs: Any = ()) -> bool:  # fmt: skip
    """Whether the model puts ``choice`` over ``budget_bytes`` so far that its scans alone need
    not be compiled to know it: by more than `FAR` of the budget, and by more than `SAFETY`
    times the model's largest error (either way) on the candidates compiled alone (``pairs``,
    ``(choice, scan-alone bytes)``, and the plans ``know`` verified), past how far the memory
    outside the scans has differed between the plans measured (`_spread.spread`). With no
    candidate compiled alone yet, never. A per-layer candidate's error is left out: it is
    what its mix keeps beyond the model (two loops, `_perlayer.shared_extra`), which no
    named candidate (one set in every layer) has; on the vs_torch GPT at 25% the mix the
    plan verifies errs by 12 MiB, the uniform candidates by 5-8 MiB, and ``everything``,
    which the model puts 38 MiB over a budget of 51 MiB, was compiled alone beside the
    plan's step.

    The memory model is fitted on every value saved and on none (`_calibrate.scan_fit`), so
    it errs most between them, and by a few percent of the budget: at Llama-3-70B shapes,
    planned at 50%, -3.0% on ``dots`` (the model puts it 33% over, its scans alone 30%) and
    +2.5% to +3.6% on the candidates near the budget.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._named import far_over
      >>> prep, know = N(base=0.0, margin=None), N(margin=10.0, measured={})
      >>> pairs = [(N(model_bytes=80.0, choices={}), 83.0)]
      >>> far_over(prep, know, N(model_bytes=130.0), 100.0, pairs)  # 40% over, error 3
      True
      >>> far_over(prep, know, N(model_bytes=95.0), 100.0, pairs)  # 5% over
      False
      >>> far_over(prep, know, N(model_bytes=130.0), 100.0)  # nothing compiled alone
      False
    """
    points = [(c, alone) for c, alone in [*pairs, *checked(know, [])] if not per_layer(c)]
    if not points:
        return False
    error = max(abs(alone - prep.base - c.model_bytes) for c, alone in points)
    over = prep.base + choice.model_bytes + (know.margin or 0.0) - budget_bytes
    over -= memory_spread(prep, know, None)
    return over > max(FAR * budget_bytes, SAFETY * error)


def ahead(
    prep: Prepared,
    know: Knowledge,
    budget_bytes: int,
    reference: float,
    predicted: float,
    pairs: Any = (),
) -> list[tuple[Solution, Choice]]:
    """The named candidates that `try_named` would check alone after a plan of ``reference``
    FLOPs predicted at ``predicted`` bytes is measured: those cheaper than it and not
    `far_over` the budget (``pairs``: candidates compiled alone so far), when `wanted`
    would say so of that prediction (`_rounds` compiles them beside its step)."""
    if not prep.scan_fits or not _per_step(prep):
        return []
    least = min((k.measured.peak_bytes for k in know.measured.values()), default=predicted)
    if budget_bytes > (1 + NEAR) * min(least, predicted):
        return []
    return [
        (solution, choice)
        for _, solution, choice in named_choices(prep)
        if choice_key(choice) not in know.measured
        and step_flops(prep, choice) < reference
        and not far_over(prep, know, choice, budget_bytes, pairs)
    ]


def try_named(
    prep: Prepared,
    know: Knowledge,
    budget_bytes: int,
    best: Known | None,
    verify: Callable[[Any, Choice, float], None],
    pairs: Any = (),
) -> None:
    """Compiles the cheapest named candidates predicted to fit (cheaper than ``best``, the
    plan found), at most `COMPILES`. When nothing measured fits (``best`` None), ``full`` on
    every scan is one of them whatever its prediction: the prediction carries the memory
    outside the scans measured on another plan, which can be a schedule's (a `Binomial`
    plan's), and ``full`` is the strategy a user would measure first. With a plan that fits,
    one `far_over` the budget is not checked alone (it would be predicted over; ``pairs``:
    candidates compiled alone besides those measured, as `far_over` takes them).
    ``verify(key, choice, alone)`` compiles and records one."""
    margin = know.margin or 0.0
    reference = cost(prep, best) if best is not None else float("inf")
    predicted = []
    uniform_full = None
    for names, solution, choice in named_choices(prep):
        if set(names) == {"full"}:
            uniform_full = choice_key(choice)
        key = choice_key(choice)
        if key in know.measured or step_flops(prep, choice) >= reference:
            continue
        if best is not None and far_over(prep, know, choice, budget_bytes, pairs):
            continue
        alone, _ = check_alone(prep, know, solution, choice)
        predicted.append((alone + margin, choice.flops, key, choice, alone))
    band = BAND if best is None else 0.0  # with a plan that fits, only a sure improvement
    fits = sorted(
        (p for p in predicted if p[0] <= budget_bytes * (1 + band)), key=lambda p: (p[1], p[0])
    )
    fits = fits[:COMPILES]
    if best is None:  # `full` on every scan is measured whatever the prediction says
        full = [p for p in predicted if p[2] == uniform_full]
        if full and full[0] not in fits:
            fits = [*fits[: COMPILES - 1], full[0]]
    for _, _, key, choice, alone in fits:
        verify(key, choice, alone)
        if know.measured[key].measured.peak_bytes <= budget_bytes:
            return


_NO_SUCH_NAME = (
    "`remat.plan` got the strategy {got!r}, but no value of the program's scans has any of "
    "these names (their `checkpoint_name`s: {names}); give names the scans use."
)


def given_choice(prep: Prepared, strategy: str) -> tuple[Solution, Choice]:
    """The per-step plan that runs every scan with ``strategy``: one of `NAMES`, or
    ``"names:a,b"``, saving the values the program names ``a`` and ``b`` with
    ``checkpoint_name`` (the ``name`` equations' outputs; a value reached through one of
    them is not saved twice). As with ``save_only_these_names``, names a scan does not use
    are ignored (a scan with none of them saves nothing), but not every name everywhere."""
    if strategy in NAMES:
        return named_choice(prep, (strategy,) * len(_per_step(prep)))
    wanted = set(split_names(strategy, "remat.plan"))
    parts, names = [], set()
    for o in _per_step(prep):
        values = prep.models[prep.cands[o].scan].values
        named = {i for i, v in enumerate(values) if v.user_name in wanted and v.primitive == "name"}
        names |= {v.user_name for v in values if v.user_name}
        parts.append(fixed_solution(prep.cands, prep.offsets, [o], frozenset(named)))
    if not wanted & names:
        raise ValueError(
            _NO_SUCH_NAME.format(got=strategy, names=", ".join(sorted(names)) or "none")
        )
    solution = _merged(parts)
    choice = prep.decode(solution)
    return solution, choice


def try_given(
    prep: Prepared,
    know: Knowledge,
    budget_bytes: int,
    strategies: tuple[str, ...],
    verify: Callable[[Any, Choice], None],
    saved: int | None = None,
) -> None:
    """Compiles each of ``strategies`` (`given_choice`) not compiled before for the program,
    cheapest by the model first, skipping those whose model FLOPs are not below the cheapest
    plan that fits (`_memo.best_known`, with the cap ``saved`` on the bytes saved; updated as
    they compile: the compiler only adds to what the model counts). ``verify(key, choice)``
    compiles and records one."""
    chosen = sorted((given_choice(prep, s)[1] for s in strategies), key=lambda c: c.flops)
    for choice in chosen:
        key = choice_key(choice)
        if key in know.measured:
            continue
        best = best_known(prep, know, budget_bytes, saved)
        if best is not None and step_flops(prep, choice) >= cost(prep, best):
            continue
        verify(key, choice)


def describe(prep: Prepared, choice: Choice) -> str:
    """A compiled point in words: ```full` on every scan``, or each scan's strategy."""
    options = _per_step(prep)
    labels = []
    for o in options:
        position = prep.models[prep.cands[o].scan].index
        scan = choice.choices.get(position)
        label = None
        if scan is None:
            label = "as written"
        elif scan.schedule == "per_step":
            for name in NAMES:
                solution = fixed_solution(prep.cands, prep.offsets, [o], _save(prep, o, name))
                named = decode(solution, prep.cands, prep.offsets, prep.models, 1.0)
                if named.choices[position].names == scan.names:
                    label = name
                    break
            if label is None:
                label = f"{len(scan.names)} values saved per step"
        else:
            label = repr(scan.schedule)
        labels.append(label)
    if len(set(labels)) == 1 and labels[0] in NAMES:
        return f"`{labels[0]}` on every scan"
    return "; ".join(
        f"scan {prep.models[prep.cands[o].scan].index}: {label}"
        for o, label in zip(options, labels, strict=True)
    )
