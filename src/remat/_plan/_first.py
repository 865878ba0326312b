"""Per-layer candidates in the place of the uniform one: the uniform step compiled only when
it may be the plan.

The rounds (`_rounds`) run on a scan's uniform options first; its per-layer options then
compete against the plan they verified: the cheapest per-layer candidate its scans alone
predict to fit (`_rounds._per_layer`), then one as cheap that keeps less
(`_saved.smaller_as_cheap`). Where one of them wins, the uniform plan's step compile was
spent on a plan that is not returned. So just before the rounds compile their first
candidate, `instead` looks for that per-layer candidate on the scans alone, with the
uniform candidate as the plan to beat and the memory outside the scans known so far, and
compiles it in the uniform candidate's place: when it fits, the rounds end there (the
uniform candidate is never compiled, and `_rounds._per_layer` does not search again), and
when it does not, the next per-layer candidate is looked for and compiled the same way
(`RETRIES`: once), then the rounds compile the uniform candidate. Without the retry, a
per-layer step a little over the budget would have the rounds compile uniform steps first
and reach, after them, the per-layer candidate the retry compiles at once; the per-layer
steps are also left out of the spread of the memory outside the scans (`_spread.spread`),
which would otherwise have the rounds compile a uniform candidate within it.

The memory outside the scans that a program's first plan knows is the un-checkpointed
step's (`Prepared.margin`); on the models of `benchmarks/vs_torch.py` a uniform plan's
differs from it by less than 1 KB, so the search finds the candidate it would have found
after the uniform step. A per-layer candidate as cheap as the uniform one replaces it only
when its scans alone keep less by more than `OUTSIDE` of the budget: a per-layer step keeps
more outside its scans (`remat._trace._ends`; 0.05-0.54 MB on those models), and between
plans of equal FLOPs the smaller compiled peak wins (`_memo.best_known`). The uniform
candidate's predicted peak then stands for its measured one where the planner asks how
little memory the program reaches (`_named.wanted`, in `_rounds.plan_prepared`). While the
per-layer step compiles, `_saved.smaller_as_cheap`'s solve for it is made beside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._alone import charged_options, check_alone, compile_alone
from ._baseline import REFUSED
from ._calibrate import Prepared
from ._compile import peak_of
from ._memo import Knowledge, choice_key, per_layer, step_flops
from ._mixes import completed
from ._named import NEAR
from ._named import ahead as named_ahead
from ._options import Choice
from ._perlayer import uniform_of
from ._saved import as_cheap, as_cheap_solve
from ._search import cheaper_candidate

# A per-layer candidate as cheap as the uniform one replaces it when its scans alone keep
# less by more than this fraction of the budget (the module docstring).
OUTSIDE = 0.02
# Per-layer candidates compiled in the uniform one's place after one measured over the
# budget (excluded then), each looked for with the memory outside the scans known before
# the first: what a per-layer step keeps beyond its scans alone depends on its pattern (on
# the vs_torch GPT at 25%, 0.97 MiB with one layer saving less, a run with no loop, against
# 0.48 MiB with two, and 0.49 MiB for the uniform plan's step), so the miss does not tell
# what the next candidate keeps.
RETRIES = 1


def instead(
    prep: Prepared,
    know: Knowledge,
    budget_bytes: int,
    say: Callable[[str], Any],
    verify: Callable[..., None],
    solution: Any,
    choice: Choice,
    alone: float | None = None,
    solved: dict | None = None,
) -> float | None:
    """Compiles the per-layer candidate that beats uniform ``choice`` (the rounds' next step
    compile; ``alone`` its scans-alone prediction, checked here when None) in its place, if
    there is one, and the next where it measures over the budget (`RETRIES`; module
    docstring); ``verify`` is `_rounds._verify`. While its step
    compiles, `_saved.smaller_as_cheap`'s solve for it is made and put in ``solved`` (a
    dict, if given) under its `choice_key`. Returns, where it fits the budget (the rounds
    then end without compiling ``choice``), the peak predicted for ``choice``: memory the
    program reaches, as if it were measured (`_named.wanted`); else None."""
    if uniform_of(prep) is prep or not prep.scan_fits:
        return None
    if alone is None:
        alone, _ = check_alone(prep, know, solution, choice)
    margin = know.margin or 0.0
    for attempt in range(1 + RETRIES):
        # A retry looks with the memory outside the scans known before the miss (`RETRIES`).
        looking = know if attempt == 0 else dataclasses.replace(know, margin=margin)
        found = cheaper_candidate(prep, looking, budget_bytes, per_layer_first(prep, know),
                                  0.0, [], step_flops(prep, choice), 0.0,
                                  (choice, alone))  # fmt: skip
        if found is None and attempt == 0:
            found = _keeps_less(prep, know, budget_bytes, choice, alone, margin)
        if found is None:
            return None
        _, mixed, mixed_alone = found
        say("verifying a per-layer plan in the uniform one's place: compiling the step")
        key = choice_key(mixed)

        def meanwhile(key=key, mixed=mixed):  # beside the step's compile (outside the GIL)
            if solved is not None:
                solved[key] = as_cheap_solve(prep, know, budget_bytes, mixed)
            # What `_named.try_named` checks alone once the step fits (`InPlace.wanted`).
            compile_alone(prep, know, named_ahead(prep, know, budget_bytes,
                                                  step_flops(prep, mixed), alone + margin,
                                                  [(choice, alone)]))  # fmt: skip

        verify(prep, know, key, mixed, margin, alone=mixed_alone, ahead=meanwhile)
        measured = know.measured[key].measured
        if measured.peak_source == REFUSED:
            return None
        if peak_of(measured) <= budget_bytes:
            return alone + margin
    return None


@dataclasses.dataclass
class InPlace:
    """The rounds' hook before their first step compile (``first`` of
    `_rounds._uniform_rounds`): `instead` (with the per-layer options, `_mixes.completed`),
    remembering what it learnt: the predicted peak of
    the uniform candidate replaced (``replaced``) and `smaller_as_cheap`'s solves made
    meanwhile (``solved``)."""

    prep: Prepared
    know: Knowledge
    budget_bytes: int
    say: Callable[[str], Any]
    verify: Callable[..., None]
    replaced: list[float] = dataclasses.field(default_factory=list)
    solved: dict = dataclasses.field(default_factory=dict)
    # The uniform candidates it saw checked alone, ``(choice, scan-alone prediction)``: what
    # tells `_named.far_over` the model's error on a set in every layer, where the plan
    # measured is a per-layer one.
    seen: list = dataclasses.field(default_factory=list)

    def __call__(self, solution: Any, choice: Choice, alone: float | None) -> bool:
        if alone is not None:
            self.seen.append((choice, alone))
        peak = instead(completed(self.prep, self.know), self.know, self.budget_bytes, self.say,
                       self.verify, solution, choice, alone, self.solved)  # fmt: skip
        self.replaced.extend([] if peak is None else [peak])
        return peak is not None

    def wanted(self, wanted: bool, best: Any) -> bool:
        """`_named.named_wanted`'s answer ``wanted``, with the replaced candidate's predicted
        peak counted as memory the program reaches (as if it were measured)."""
        if wanted and best is not None and self.replaced:
            return self.budget_bytes <= (1 + NEAR) * min(self.replaced)
        return wanted


def _keeps_less(prep, know, budget_bytes, choice, alone, margin):
    """The per-layer candidate as cheap as ``choice`` that the model puts least in memory
    (`_saved.as_cheap`), when its scans alone keep less than ``choice``'s (``alone``) by
    more than `OUTSIDE` of the budget and predict a fit: ``(solution, choice, scan-alone
    prediction)``, or None."""
    found = as_cheap(prep, know, budget_bytes, choice, step_flops(prep, choice))
    if found is None or not per_layer(found[1]):
        return None
    solution, mixed = found
    mixed_alone, _ = check_alone(prep, know, solution, mixed)
    if mixed_alone > alone - OUTSIDE * budget_bytes or mixed_alone + margin > budget_bytes:
        return None
    return solution, mixed, mixed_alone


def per_layer_first(prep: Prepared, know: Knowledge) -> list[Any]:
    """The options of `charged_options`, each uniform one of a scan that has per-layer
    options charged the baseline's FLOPs more, so that the solves of the per-layer searches
    (whose uniform candidates the rounds see) go to the per-layer ones; the FLOPs compared
    stay the candidates' own (`step_flops`). Otherwise a uniform candidate checked and found
    over the budget there would rule out its FLOPs tier (`_search.above_floor`), per-layer
    candidates of that tier included: one set in every layer run as segments recomputes as
    much and keeps less (`_perlayer.first_carry`)."""
    mixed = {c.scan for c in prep.cands if c.pattern}
    penalty = 2.0 * prep.baseline.flops
    return [
        dataclasses.replace(option, flops=option.flops + penalty)
        if not cand.pattern and cand.scan in mixed
        else option
        for option, cand in zip(charged_options(prep, know), prep.cands, strict=True)
    ]
