"""A budget no plan meets, settled from what the planner knows, without compiling the step.

When nothing fits the memory model, the rounds check its least-memory choice on its scans
compiled alone, then compile it, and then the named strategies (``full`` on every scan
whatever its prediction: `_named.try_named`), to report the smallest peak reached. Once a plan
of the program has been compiled, the memory outside the scans is known for the save sets
measured, to within how far it has differed between them (`_spread.spread`). A candidate whose
scans alone, plus the least such memory any measured point showed less that spread, are still
over the budget cannot fit by the measurements that learnt it; so where that holds of the
least-memory choice and of every named strategy (`surely_over`), the rounds end there, and
only the candidate predicted to reach the least memory is compiled (`compile_least`, as on
every infeasible path), so that the floor quoted is the least the planner reaches. Measured at
Llama-3-8B shapes, 35% of the un-checkpointed peak after a plan at 50% and 70%: the least-memory
choice predicted 8.0% over, compiled 6.7% over; the margins measured 27.99-29.98 GiB.
"""

from __future__ import annotations

from typing import Any

from ._alone import charge, charged_options, check_alone, compile_alone, compiled_alone
from ._baseline import REFUSED
from ._compile import WORKERS, peak_of
from ._memo import Knowledge, choice_key, margins
from ._milp import solve
from ._named import far_over, named_choices

# Least-memory choices compiled alone beside the first (`next_least`): the rounds solve
# again after each first charge of a schedule, at most `_search.CHECKS` (4) times.
NEXT = 3


def surely_over(prep: Any, know: Knowledge, budget_bytes: int, alone: float) -> int | None:
    """The least peak predicted for the program (``alone``: the least-memory choice's scans
    compiled alone; and each named strategy's), when even that, with the memory outside the
    scans as far below the least measured as the measured have differed, is over
    ``budget_bytes``; else None. None also before a plan of the program is verified (the
    memory outside the scans is known only from the un-checkpointed step then).

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan import _settled
      >>> know = N(measured={})  # nothing verified yet
      >>> _settled.surely_over(N(scan_fits=(1,)), know, 100, alone=500.0) is None
      True
    """
    named = _named(prep, know, budget_bytes)
    if named is None:
        return None
    shown = margins(prep, know)
    least_margin = 2 * min(shown) - max(shown)  # the least measured, less their spread
    compile_alone(prep, know, named)  # at once, not one at a time
    least = min([alone] + [check_alone(prep, know, s, c)[0] for s, c in named])
    return int(least + least_margin) if least + least_margin > budget_bytes else None


def _named(prep: Any, know: Knowledge, budget_bytes: int) -> list[tuple[Any, Any]] | None:
    """The named strategies' ``(solution, choice)`` that `surely_over` checks alone, or None
    where it settles nothing (no scan fits, or no plan of the program verified yet). One the
    model puts `_named.far_over` the budget is left out: over by more than four times the
    model's largest error, it is not the least peak (Llama-3-8B shapes, 35% after 50% and
    70%: ``dots``, which saves the attention scores)."""
    verified = [
        k
        for k in know.measured.values()
        if k.alone is not None and k.measured.peak_source != REFUSED
    ]
    if not prep.scan_fits or not verified:
        return None
    return [
        (solution, choice)
        for _, solution, choice in named_choices(prep)
        if not far_over(prep, know, choice, budget_bytes)
    ]


def check_least(prep: Any, know: Knowledge, solution: Any, choice: Any,
                budget_bytes: int) -> tuple[float, bool]:  # fmt: skip
    """`check_alone` of the least-memory choice (nothing fits the model), with the named
    strategies `surely_over` checks next and the least-memory choices the rounds solve for
    next (`next_least`) compiled beside it (`compile_alone`: at once, not one after the
    other). Before any schedule is charged, the next ones are compiled only on the workers
    the batch leaves idle (`_compile.WORKERS`: a wave of compiles no longer)."""
    named = _named(prep, know, budget_bytes)
    batch = [(solution, choice), *(named or [])]
    idle = WORKERS - sum(not compiled_alone(prep, know, s, c) for s, c in batch)
    later = [] if named is None else next_least(prep, know, solution, max(idle, 0))
    compile_alone(prep, know, [*batch, *later])
    return check_alone(prep, know, solution, choice)


def next_least(prep: Any, know: Knowledge, solution: Any, idle: int = 0) -> list[tuple[Any, Any]]:
    """The least-memory choices that the rounds solve for after ``solution``, the model's
    least-memory one, while each runs a schedule (`remat.Nested`, `remat.Binomial`) not yet
    charged: checking one alone charges its schedule what it keeps beyond the model, and the
    rounds solve again with the charge (`_alone.check_alone`). Once a schedule is charged
    (the least-memory choice then runs another not yet charged, or will), each next one is
    the least-memory choice with the schedules before it ruled out (charged the
    un-checkpointed step's peak), at most `NEXT`, ``(solution, choice)`` each; none where
    ``solution`` runs no schedule left to charge (the rounds then settle on it). Before any
    schedule is charged, at most ``idle`` (the workers the check's own batch leaves idle): a
    charge may leave its schedule the least (Llama-3-70B shapes, 35% after 50%: `Binomial(1)`
    stays the least, and the three after it, compiled beside it, would go unused), so only
    compiles that cost no wave of their own are spent on it. At Llama-3-8B shapes, 35% after
    50% and 70%, the least-memory choice runs four schedules in turn: on two workers the
    first and second compile alone at once, the other two at once beside the second's
    check (two waves, three with the second waiting for the first's charge)."""

    def uncharged(s):
        return {
            o for o in s.options
            if prep.cands[o].schedule != "per_step" and o not in know.option_extra
        }  # fmt: skip

    schedules = [o for o, c in enumerate(prep.cands) if c.schedule != "per_step"]
    charged = any(o in know.option_extra for o in schedules)
    most = NEXT if charged else min(idle, NEXT)  # uncharged: the first may stay the least
    ruled_out = uncharged(solution)
    out: list[tuple[Any, Any]] = []
    off = float(peak_of(prep.baseline))
    while ruled_out and len(out) < most:
        options = [
            charge(option, off, prep.stored, prep.weight) if o in ruled_out else option
            for o, option in enumerate(charged_options(prep, know))
        ]
        found = solve(prep.nodes, 0, options=options, minimize="memory", **prep.weights)
        new = set() if found is None else uncharged(found) - ruled_out
        if not new:
            break
        out.append((found, prep.decode(found)))
        ruled_out |= new
    return out


def compile_least(prep: Any, know: Knowledge, budget_bytes: int, verify: Any) -> int | None:
    """Compiles, where nothing compiled fits, the candidate predicted to reach the least
    memory, so that the floor `remat.InfeasibleBudget` quotes is the least the planner
    reaches, not the least it happened to compile (on a program in the user's own
    `lax.scan` at 40%, after a 50% plan: "22.00 MiB" where ``full`` compiles to 18.51 MiB).
    The candidates are the model's least-memory choice and the named strategies, each
    predicted from its scans compiled alone (found compiled by the rounds' checks), less
    those the model puts `_named.far_over` the budget (over the least-memory choice by more
    than four times the model's largest error: not the least); one step compile at most, none
    where the least predicted is compiled already.
    ``verify(key, choice, alone)`` compiles and records one. Returns the steps compiled (0
    or 1: the least predicted is then compiled), or None without a scan-alone model.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan import _settled
      >>> _settled.compile_least(N(scan_fits=()), N(), 100, verify=None) is None  # no model
      True
    """
    if not prep.scan_fits:
        return None
    least = solve(prep.nodes, 0, options=charged_options(prep, know), minimize="memory",
                  **prep.weights)  # fmt: skip
    named = [(s, c) for _, s, c in named_choices(prep)]
    if least is not None:
        named = [(s, c) for s, c in named if not far_over(prep, know, c, budget_bytes)]
    pairs = named if least is None else [(least, prep.decode(least)), *named]
    compile_alone(prep, know, pairs)  # at once; those the rounds checked are found compiled
    predicted = [(check_alone(prep, know, s, c)[0], c) for s, c in pairs]
    alone, choice = min(predicted, key=lambda p: p[0])
    key = choice_key(choice)
    if key in know.measured:
        return 0
    verify(key, choice, alone)
    return 1
