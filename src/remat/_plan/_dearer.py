"""Plans the compiler makes dearer than the model: candidates below its own recomputation.

Near a TPU chip's memory the compiler recomputes values of its own accord (above 95% of the HBM
it gives a program, docs/tpu.md), by amounts the cost model does not see; the step it returns
then does more FLOPs than the plan asks for, and its peak is what the compiler pulled the
program down to, not what the save set holds. A verified plan whose compiled FLOPs exceed the
model's by more than `NOISE` (`dearer`) shows both: so its peak corrects nothing (the memory
outside the scans is not learnt from it, `_rounds._verify`), and while the cheapest plan that
fits is such a plan, candidates are solved under its predicted peak (then under the least
predicted for the candidates compiled dearer since) less `STEP`, recomputing more than it (the
rounds ruled out the candidates that recompute less), checked on their scans alone (one found
over rules out the candidates that recompute as little, as in the rounds), compiled, and
compared by their compiled FLOPs (`_memo.best_known`), at most `COMPILES` of them
(`below_own_recomputation`). Plans with less memory than the cheapest may be dearer too (on a
v5e the TPU compiler recomputes in `full` as well), so its peak, not theirs, starts the search.
The search ends at a candidate the compiler leaves as the model has it (one under it recomputes
at least as much by the model), or when the model's FLOPs of the next candidate reach the
cheapest plan compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._alone import charged_options, check_alone
from ._baseline import REFUSED
from ._calibrate import Prepared
from ._compile import peak_of
from ._memo import Knowledge, Known, best_known, choice_key, cost, step_flops
from ._milp import Solution, solve
from ._search import CHECKS, STEP_BACK, above_floor

# Compiled FLOPs this far above the model's are the compiler's own recomputation.
NOISE = 0.05
# Candidates are solved this far under the least peak of the plans compiled dearer.
STEP = 0.02
# Step compiles spent below the compiler's own recomputation per budget.
COMPILES = 3


def dearer(prep: Prepared, known: Known) -> bool:
    """Whether the compiler recomputed of its own accord in ``known``'s step: its compiled
    FLOPs exceed the model's (`step_flops`) by more than `NOISE`.

    Example: a plan the model puts at 20.3 TFLOP per chip that compiles to 27.1 is dearer.
    """
    if known.measured.peak_source == REFUSED:
        return False
    return known.measured.flops > (1 + NOISE) * step_flops(prep, known.choice)


def below_own_recomputation(
    prep: Prepared,
    know: Knowledge,
    budget_bytes: int,
    say: Callable[[str], Any],
    verify: Callable[..., None],
) -> int:
    """Compiles candidates under the plans the compiler made dearer (module docstring) while
    the cheapest plan that fits is one; ``verify`` is `_rounds._verify`. Returns the steps
    compiled."""
    compiled = 0
    tries = 0
    tight = 0.0  # the model stepped back by candidates found over alone
    excluded: list[Solution] = []
    best = best_known(prep, know, budget_bytes)
    # The most recompute FLOPs of the cheapest plan and of candidates found over alone: one
    # that recomputes as little was ruled out by the rounds, or is over (`above_floor`).
    above = None if best is None else best.choice.flops
    # The least peak predicted for a plan compiled dearer in this search, from the cheapest
    # plan's down (one with less memory, `full` among them, may be dearer by recomputation of
    # its own); predicted, as the candidates are: the compiled peak is the compiler's.
    pulled = None if best is None else best.predicted
    while compiled < COMPILES and tries < COMPILES + CHECKS:
        tries += 1
        best = best_known(prep, know, budget_bytes)
        if best is None or pulled is None or not dearer(prep, best):
            break
        ceiling = int(pulled * (1 - STEP))
        margin = know.margin or 0.0
        solution = solve(prep.nodes, ceiling, options=charged_options(prep, know),
                         fixed_bytes=prep.base + margin + tight, exclude=excluded,
                         **prep.weights, min_flops=above_floor(prep, above))  # fmt: skip
        if solution is None:
            break
        choice = prep.decode(solution)
        if step_flops(prep, choice) >= cost(prep, best):
            break  # the model's FLOPs alone reach the cheapest plan compiled
        excluded.append(solution)
        key = choice_key(choice)
        if key in know.measured:
            continue
        say("looking under the compiler's own recomputation on the scans alone")
        alone, _ = check_alone(prep, know, solution, choice)
        if alone + margin > ceiling:  # rules out its FLOPs tier, as in the rounds
            tight += STEP_BACK * ceiling
            above = max(above or 0.0, solution.recompute_flops)
            continue
        say(f"verifying a candidate under the compiler's own recomputation ({compiled + 1})")
        verify(prep, know, key, choice, margin, alone=alone)
        compiled += 1
        known = know.measured[key]
        if not dearer(prep, known) and peak_of(known.measured) <= budget_bytes:
            break  # the compiler left it as the model has it
        pulled = min(pulled, known.predicted)
    return compiled
