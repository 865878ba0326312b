"""What a plan saves: the smaller of plans that cost the same, and a cap on the bytes saved.

Among compiled plans of equal FLOPs that fit, the one with the smaller peak is returned
(`_memo.best_known`). The rounds look for the cheapest plan, so a plan that recomputes as
much and keeps less may never be compiled: `smaller_as_cheap` compiles the one the model
puts least in memory among those recomputing no more than the best verified plan (with
per-layer options: one save set in every layer run as segments keeps one layer's input
carry fewer than the plain scan, `_perlayer.first_carry`).

``remat.plan(..., saved=...)`` caps the bytes the step saves for its backward pass (its
residuals beside the arguments, as `remat.measure` lists them: what torch's activation
memory budget counts), beside the peak budget. The integer program bounds the stored bytes
it models (`_milp.solve`'s ``max_saved``) less what the step saves outside the scans,
learnt from the compiled plans of the same kind (uniform or per-layer: a per-layer step
checkpoints the code around its scan, `remat._trace._ends`, and saves less there); each
candidate is compiled and its residuals read (`within_saved`, at most `SAVED_ROUNDS`), and
one over the cap is excluded while the estimate learns from it.
"""

from __future__ import annotations

from typing import Any

from ._alone import charged_options, check_alone
from ._calibrate import Prepared
from ._memo import Knowledge, best_known, choice_key, cost, per_layer, saved_of, step_flops
from ._milp import Solution, solve

# Steps compiled, at most, looking for a plan within the cap on saved bytes.
SAVED_ROUNDS = 4


def smaller_as_cheap(prep: Prepared, know: Knowledge, budget_bytes: int, say: Any,
                     verify: Any, saved: int | None = None,
                     solved: dict | None = None) -> int:  # fmt: skip
    """Compiles the candidate the model puts least in memory among those that recompute no
    more than the best plan verified, when it is not that plan and the model puts it lower
    (a per-layer one against a uniform plan: and its scans, compiled alone, keep less);
    ``verify(key, choice)`` compiles and records a step; ``solved`` maps a plan's
    `choice_key` to `as_cheap_solve`'s solution for it, made before (while it compiled).
    Returns the steps compiled (0 or 1).
    """
    best = best_known(prep, know, budget_bytes, saved)
    if best is None:
        return 0
    solution = (solved or {}).get(choice_key(best.choice), False)
    found = as_cheap(prep, know, budget_bytes, best.choice, cost(prep, best), solution)
    if found is None:
        return 0
    solution, choice = found
    if per_layer(choice) and not per_layer(best.choice) and best.alone is not None:
        # Its scans alone first: a per-layer step keeps more outside its scans than the
        # uniform one (`remat._trace._ends`), so one that keeps no less on them keeps more.
        alone, _ = check_alone(prep, know, solution, choice)
        if alone >= best.alone:
            return 0
    say("compiling a plan as cheap that keeps less")
    verify(choice_key(choice), choice)
    return 1


def as_cheap(prep: Prepared, know: Knowledge, budget_bytes: int, choice: Any,
             reference: float, solution: Any = False) -> tuple[Solution, Any] | None:  # fmt: skip
    """The candidate the model puts least in memory among those that recompute no more than
    ``choice`` (a `Choice` that costs ``reference`` FLOPs), when it is not ``choice``, has
    not been compiled and the model puts it lower: ``(solution, choice)``, or None.
    ``solution``: `as_cheap_solve`'s for ``choice``, where it was solved before."""
    if solution is False:
        solution = as_cheap_solve(prep, know, budget_bytes, choice)
    if solution is None:
        return None
    found = prep.decode(solution)
    if (
        choice_key(found) in know.measured
        or found.model_bytes >= choice.model_bytes - 1.0
        or step_flops(prep, found) > reference * (1 + 1e-9)
    ):
        return None
    return solution, found


def as_cheap_solve(prep: Prepared, know: Knowledge, budget_bytes: int, choice: Any) -> Any:
    """The least memory the model reaches recomputing no more than ``choice``: a `Solution`,
    or None (see `as_cheap`)."""
    return solve(prep.nodes, budget_bytes, options=charged_options(prep, know),
                 minimize="memory", max_flops=choice.flops * (1 + 1e-9) + 1.0,
                 **prep.weights)  # fmt: skip


def within_saved(prep: Prepared, know: Knowledge, budget_bytes: int, saved: int, say: Any,
                 verify: Any) -> int:  # fmt: skip
    """Compiles the cheapest candidates the model puts within ``saved`` bytes stored (see the
    module docstring) until one fits both that and the peak budget (at most `SAVED_ROUNDS`);
    ``verify(key, choice)`` compiles and records a step. Returns the steps compiled."""
    rounds = 0
    excluded: list[Solution] = []
    for _ in range(4 * SAVED_ROUNDS):  # solves, those of plans compiled before included
        if rounds >= SAVED_ROUNDS:
            break
        found = _solve_within(prep, know, budget_bytes, saved, excluded, outside_of(know))
        if found is not None:  # the kind it gives may save more outside the scans
            outside = outside_of(know, found[1])
            found = _solve_within(prep, know, budget_bytes, saved, excluded, outside)
        best = best_known(prep, know, budget_bytes, saved)
        if found is None or (
            best is not None and step_flops(prep, found[1]) >= cost(prep, best) * (1 - 1e-9)
        ):
            break  # fmt: skip
        solution, choice = found
        excluded.append(solution)
        key = choice_key(choice)
        if key in know.measured:
            continue
        say(f"verifying a plan within the saved bytes (round {rounds + 1}): compiling the step")
        verify(key, choice)
        rounds += 1
    return rounds


def outside_of(know: Knowledge, choice: Any = None) -> float:
    """What a step saves beyond the stored bytes its scans' model counts (`Choice.kept`), as
    the compiled plans showed (negative where the model counts more): that of the plan of
    ``choice``'s kind (per-layer or uniform) whose model keeps the nearest bytes to it; the
    least of all without ``choice`` or where none is of its kind; 0 when none is known."""
    shown = [
        (saved_of(k.measured) - k.choice.kept, per_layer(k.choice), k.choice.kept)
        for k in know.measured.values()
        if k.choice.kept > 0 and k.measured.residuals
    ]
    if choice is not None:
        same = [(abs(kept - choice.kept), v) for v, kind, kept in shown
                if kind == per_layer(choice)]  # fmt: skip
        if same:
            return min(same)[1]
    return min((v for v, _, _ in shown), default=0.0)


def _solve_within(prep, know, budget_bytes, saved, excluded, outside):
    """The cheapest candidate the model puts within ``saved - outside`` stored bytes and the
    peak budget, not in ``excluded``: ``(solution, choice)``, or None."""
    solution = solve(prep.nodes, budget_bytes, options=charged_options(prep, know),
                     fixed_bytes=prep.base + (know.margin or 0.0), exclude=excluded,
                     max_saved=saved - outside,
                     option_saved=[c.option.bytes for c in prep.cands],
                     **prep.weights)  # fmt: skip
    return None if solution is None else (solution, prep.decode(solution))
