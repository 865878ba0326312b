"""Ending a search for cheaper candidates early: one solve at its highest budget shows that
no level below it has anything cheaper.

`_search.cheaper_candidate` solves at each of several budgets above the real one (its
levels), and a level whose cheapest candidate is no cheaper than the one to beat ends that
level. The candidates that fit a budget fit every larger one, so the fewest FLOPs found at
the highest level are a lower bound for every level below it, solved with the same
exclusions, floor and memory outside the choice: when the highest level finds nothing
cheaper, neither does any other, and the levels left cost a solve each for nothing (on the
GPT of `benchmarks/vs_torch.py` at 25%, four of the uniform search's eight solves, each
returning the tier its floor allows).

The bound holds where the integer program's objective is the FLOPs the search compares:
every option charged its candidate's own FLOPs (`_first.per_layer_first` charges uniform
options more, so that search is not ended this way) and nothing offloadable (a transfer's
FLOPs are in the objective, not in the choice's recomputation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._milp import Option, Solution, solve

# HiGHS's relative gap (`_milp.solve`): a solution's FLOPs may be this far under the best
# below, so the highest level's bound is taken this much lower.
GAP = 2e-9


def bounded(prep: Any, options: Sequence[Option]) -> bool:
    """Whether the solver's objective with ``options`` is the FLOPs the search compares
    (the module docstring): each option's FLOPs its candidate's, and no node offloadable.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._levels import bounded
      >>> from remat._plan._milp import Node, Option
      >>> prep = N(cands=[N(option=Option(group=0, flops=2.0))], nodes=[Node(bytes=4, flops=1)])
      >>> bounded(prep, [Option(group=0, flops=2.0)]), bounded(prep, [Option(group=0, flops=9.0)])
      (True, False)
    """
    if any(node.offload_flops is not None for node in prep.nodes):
        return False
    return all(o.flops == c.option.flops for o, c in zip(options, prep.cands, strict=True))


def nothing_cheaper(
    prep: Any,
    budget: float,
    options: Sequence[Option],
    fixed: float,
    excluded: Sequence[Solution],
    floor: float | None,
    reference: float,
) -> bool:
    """Solves once at ``budget`` (the search's highest level) with the search's state:
    whether no level up to it has a candidate with fewer FLOPs than ``reference`` (a
    step's, `_memo.step_flops`)."""
    solution = solve(prep.nodes, budget, options=options, fixed_bytes=fixed, exclude=excluded,
                     min_flops=floor, **prep.weights)  # fmt: skip
    if solution is None:
        return True
    devices = max(prep.baseline.num_devices, 1)
    least = prep.baseline.flops + solution.recompute_flops * (1 - GAP) / devices
    return least >= reference * (1 - 1e-9)
