"""The spreads of what the planner learns between the points it measured, and the candidates
they leave in doubt.

The planner learns the memory outside the scans (what the scan-alone programs do not see) from
each plan it compiles whole, and predicts the next candidates with the last one learnt. That
memory differs between save sets, so a candidate predicted over the budget by less than it has
varied may fit: `within_spread` compiles one such candidate before the rounds settle,
and `spread` is how far the rounds step the model back only past it. The linear model's error
against a candidate's scans compiled alone differs between candidates too (it comes from the
values each saves): `error_spread` is how far, and the model is stepped back only past it.
"""

from __future__ import annotations

from typing import Any

from ._baseline import REFUSED
from ._compile import peak_of
from ._memo import EQUAL_FLOPS, best_known, choice_key, cost, margins, step_flops

# Candidates predicted over the budget by less than the spread of the memory outside the scans
# that are compiled whole before the rounds settle, at most (`within_spread`).
SPREAD_ROUNDS = 1
# Scan-alone predictions this close (a fraction) are the same (`twin`).
TWIN = 1e-6


def _shown(prep, know, first_margin) -> list[float]:
    """The memory outside the scans each measured uniform point showed (`_memo.margins`),
    and the one the rounds began with (``first_margin``: maybe learnt on another plan). A
    per-layer step's is left out: it holds what its pattern keeps beyond its scans alone as
    well (`_first.RETRIES`), which no uniform candidate, the ones the spread is for, keeps."""
    return margins(prep, know, uniform=True) + ([] if first_margin is None else [first_margin])


def spread(prep, know, first_margin) -> float:
    """How far the memory outside the scans has differed between the points measured: a
    candidate predicted over the budget by less may fit (`within_spread`), and the model is
    stepped back only by an excess beyond it."""
    shown = _shown(prep, know, first_margin)
    return max(shown) - min(shown) if shown else 0.0


def checked(know, missed) -> list[tuple[Any, float]]:
    """``(choice, scan-alone prediction)`` of every candidate checked alone that ``know``
    measured whole and of those in ``missed`` (``(solution, choice, alone)``: checked and put
    over the budget)."""
    pairs = [
        (k.choice, k.alone)
        for k in know.measured.values()
        if k.alone is not None and k.measured.peak_source != REFUSED
    ]
    return pairs + [(choice, alone) for _, choice, alone in missed]


def error_spread(prep, pairs) -> float:
    """How far the linear model's error has differed between the candidates ``pairs``
    (``(choice, scan-alone prediction)``): the scan-alone prediction less the model's bytes.
    A candidate found over the budget by some excess rules out those the model puts under it
    by less only where the model errs alike on both, and it does not (Llama-3-70B shapes, in
    percent of MaxText ``save_dot_with_context_except_mlp``'s peak: +1.7% on a save set of
    0.962x the preset's FLOPs, +1.1% at 1.003x, +0.03% on the preset's own set); so the model
    is stepped back only by an excess beyond this spread.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._spread import error_spread
      >>> prep = N(base=100.0)
      >>> error_spread(prep, [(N(model_bytes=10.0), 111.0), (N(model_bytes=20.0), 124.0)])
      3.0
    """
    errors = [alone - (prep.base + choice.model_bytes) for choice, alone in pairs]
    return max(errors) - min(errors) if errors else 0.0


def within_spread(prep, know, budget_bytes, missed, first_margin, say, verify) -> int:
    """Before the rounds settle on the best plan that fits: a candidate checked alone and
    put over the budget only by the memory outside the scans (`Knowledge.margin`, learnt on
    the last plan verified, maybe another budget's: ``first_margin`` where the rounds began)
    is compiled whole, at most `SPREAD_ROUNDS` times (`doubtful`), and where the last one
    compiled is over, once more its `twin` on the scans alone. That memory differs
    between save sets (Llama-3-8B shapes: 27.99 GiB beside the un-checkpointed step's scans,
    29.98 beside MaxText ``minimal``'s save set, 28.10 beside the cheapest that fits
    ``save_dot_with_context_except_mlp``'s peak); where every point showed the same, nothing
    is compiled. ``verify`` compiles a candidate whole and records it
    (`_rounds._verify`). Returns the steps compiled."""
    rounds = 0
    last = None  # the candidate compiled last, ``(solution, choice, alone)``
    while rounds < SPREAD_ROUNDS:
        best = best_known(prep, know, budget_bytes)
        shown = _shown(prep, know, first_margin)
        if best is None or not shown or max(shown) - min(shown) <= 0:
            break
        reference = cost(prep, best) * (1 - 1e-9)
        unknown = [
            (choice, alone)
            for _, choice, alone in missed
            if choice_key(choice) not in know.measured and step_flops(prep, choice) < reference
        ]
        pick = doubtful(prep, unknown, budget_bytes, shown, know.margin or 0.0)
        if pick is None:
            break
        choice, alone = pick
        say("verifying a plan within the spread of the memory outside the scans")
        # Predicted with the smallest memory outside the scans measured.
        verify(prep, know, choice_key(choice), choice, min(shown), alone=alone)
        rounds += 1
        last = next(m for m in missed if m[1] is choice)
    if last is not None and peak_of(know.measured[choice_key(last[1])].measured) > budget_bytes:
        # Over: its twin to the scans alone, which recomputes other costly values, may fit.
        other = twin(prep, know, last, missed)
        if other is not None:
            say("verifying its twin on the scans alone")
            verify(prep, know, choice_key(other[1]), other[1], min(shown), alone=other[2])
            rounds += 1
    return rounds


def twin(prep, know, candidate, missed) -> tuple[Any, Any, float] | None:
    """A candidate of ``missed`` (``(solution, choice, alone)``), not compiled, that its
    scans alone cannot tell from ``candidate``: the same FLOPs (to `_memo.EQUAL_FLOPS` of
    the un-checkpointed step's) and scan-alone bytes (to `TWIN` of them), where it
    recomputes other values that cost FLOPs (one that differs only in values recomputed
    for free compiles alike). Their steps may differ: at Llama-3-70B shapes saving the
    query projection's output and saving the out projection's both compile alone to
    832.013 GiB, and their steps to 1087.156 and 1085.067 GiB. None where there is none."""
    solution, choice, alone = candidate

    def costly(s):
        return frozenset(i for i in s.recomputed if prep.nodes[i].flops > 0)

    flops = step_flops(prep, choice)
    same = max(prep.baseline.flops, 1.0) * EQUAL_FLOPS
    for other in missed:
        if (
            choice_key(other[1]) not in know.measured
            and abs(step_flops(prep, other[1]) - flops) <= same
            and abs(other[2] - alone) <= TWIN * abs(alone)
            and costly(other[0]) != costly(solution)
        ):
            return other
    return None


def doubtful(prep, unknown, budget_bytes, shown, margin) -> tuple[Any, float] | None:
    """Of ``unknown`` (``(choice, scan-alone prediction)``: candidates cheaper than the best
    plan, not compiled), the one `within_spread` compiles: the cheapest that the smallest
    memory outside the scans measured (of ``shown``) puts within the budget; else, the one
    put least over the budget by ``margin`` (the last measured) among those over it by less
    than that memory's spread (the least over first: the most likely to fit). The memory
    outside the scans of a save set not compiled may lie below every one measured: at
    Llama-3-70B shapes MaxText ``save_out_proj``'s save set showed 253.05 GiB, where the
    plans compiled before it showed 254.01-259.04, and it fits its preset's peak exactly.
    None where no candidate is in doubt.

    Example:
      >>> from types import SimpleNamespace as N
      >>> from remat._plan._spread import doubtful
      >>> prep = N(baseline=N(flops=100.0, num_devices=1))
      >>> a, b = N(flops=1.0), N(flops=2.0)
      >>> doubtful(prep, [(a, 97.0), (b, 93.0)], 100, [4.0, 6.0], 6.0)[1]  # 93 + 4 fits
      93.0
      >>> doubtful(prep, [(a, 98.0), (b, 97.0)], 100, [4.0, 6.0], 5.0)[1]  # 97 + 5 - 2
      97.0
      >>> doubtful(prep, [(a, 98.0)], 100, [4.0, 6.0], 5.0) is None
      True
    """
    if not shown:
        return None
    least, spread = min(shown), max(shown) - min(shown)
    fits = [
        (step_flops(prep, c), alone, c) for c, alone in unknown if alone + least <= budget_bytes
    ]
    if fits:
        _, alone, choice = min(fits, key=lambda n: n[:2])
        return choice, alone
    near = [
        (alone, step_flops(prep, c), c)
        for c, alone in unknown
        if alone + margin - spread <= budget_bytes
    ]
    if not near:
        return None
    alone, _, choice = min(near, key=lambda n: n[:2])
    return choice, alone
