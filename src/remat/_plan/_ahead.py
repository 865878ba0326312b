"""What the rounds (`_rounds`) compile ahead of their checks, and what they compile without one.

While the step of a candidate compiles, `look_ahead` compiles alone what the rounds will
likely check once it is measured; `ample` says when a candidate is so far under the budget
by the model that checking its scans alone first cannot change the decision to compile it.
"""

from __future__ import annotations

from ._alone import compile_alone
from ._memo import choice_key, step_flops
from ._milp import solve
from ._named import ahead as named_ahead
from ._search import above_floor

# A candidate the model puts this far under the budget is compiled whole at once, and checked
# on its scans alone beside that compile (`ample`): the model's error on the programs
# measured is within 6%.
SLACK = 0.10


def look_ahead(prep, know, budget_bytes, options, tight, excluded, above, after, choice,
               predicted, pairs=()) -> None:  # fmt: skip
    """Compiles alone, while the step with ``choice`` (``predicted`` peak) compiles, what the
    rounds will likely check alone once it is measured: the named strategies that
    `try_named` checks when that peak is near the budget (`_named.ahead`; ``pairs`` are the
    candidates checked alone so far, `_spread.checked`), and, with
    ``after`` (a search for a cheaper plan follows the step), the candidate that
    `cheaper_candidate` checks first, as the memory outside the scans known so far puts it.
    The checks then find their scans compiled (`_memo.Knowledge.alone`); those the measured
    step makes unnecessary cost their compile, beside the step's."""
    pairs = named_ahead(prep, know, budget_bytes, step_flops(prep, choice), predicted, pairs)
    if after:
        solution = solve(prep.nodes, budget_bytes, options=options,
                         fixed_bytes=prep.base + (know.margin or 0.0) + tight, exclude=excluded,
                         **prep.weights, min_flops=above_floor(prep, above))  # fmt: skip
        if solution is not None:
            cheaper = prep.decode(solution)
            if choice_key(cheaper) not in know.measured:
                pairs.append((solution, cheaper))
    compile_alone(prep, know, pairs)


def ample(prep, know, solution, choice, budget_bytes, fixed) -> bool:
    """Whether ``choice`` is so far under the budget by the model (`SLACK`) that checking it
    alone cannot change the decision to compile it: every scan ``per_step`` (a schedule's
    first check may charge it more), nothing cheaper to look for (it recomputes nothing),
    and the scan-alone programs it needs not yet compiled."""
    if not prep.scan_fits or choice.flops > 0:
        return False
    if any(prep.cands[o].schedule != "per_step" for o in solution.options):
        return False
    return prep.base + fixed + choice.model_bytes <= (1 - SLACK) * budget_bytes
