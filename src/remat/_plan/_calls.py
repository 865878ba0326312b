"""A near miss compiled again with its scan bodies' jitted calls kept whole.

The planner names a scan body's values on its flattened form (every call to a `jax.jit`-ed
function inlined), and compiles a candidate so. The same save set with the calls that hold
no saved value kept whole (`remat._trace._tag.tagged_body`, `ScanChoice.kept_calls`) is another program,
which XLA packs differently, either way: at Llama-3-8B shapes MaxText's ``minimal`` save set
compiles 53,952,448 bytes (0.034%) over the preset's own peak inlined and to exactly it with
the calls kept; at Llama-3.2-1B shapes the 50% plan's save set compiles 7.6% larger with
``jnp.where``'s call kept (`benchmarks/preset_gap.py`). So neither form is chosen for every
plan: where the cheapest candidate compiled is over the budget by at most `CALLS_BAND`, and
nothing fits as cheaply, that candidate is compiled once more with its calls kept
(`near_miss`), and competes as any compiled plan does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._trace._tag import keeps_a_call
from ._baseline import REFUSED
from ._compile import peak_of
from ._memo import best_known, choice_key, cost

# A compiled candidate over the budget by at most this fraction is compiled with its calls
# kept (`near_miss`): about three times the largest gap between the two forms measured the way
# that favours keeping them (0.034%, see the module docstring).
CALLS_BAND = 0.001


def kept_form(prep: Any, choice: Any) -> Any:
    """``choice`` with each scan's jitted calls that hold no saved value kept whole, or None
    where that keeps none (the program would be the same)."""
    infos = {info.position: info for info in prep.infos}
    choices, kept = dict(choice.choices), False
    for position, scan in choice.choices.items():
        info = infos.get(position)
        if info is None or scan.names is None or scan.pattern or scan.schedule != "per_step":
            continue
        if keeps_a_call(info, (*scan.names, *scan.offload)):
            choices[position] = dataclasses.replace(scan, kept_calls=True)
            kept = True
    if not kept:
        return None
    scans = tuple(
        dataclasses.replace(s, kept_calls=choices[s.position].kept_calls) for s in choice.scans
    )
    return dataclasses.replace(choice, choices=choices, scans=scans)


def near_miss(prep: Any, know: Any, budget_bytes: int, say: Any, verify: Any) -> int:
    """Compiles, at most once, the cheapest compiled candidate over the budget by at most
    `CALLS_BAND` and cheaper than every one that fits, with its calls kept whole
    (``verify(key, choice)`` compiles a choice whole and records it). Returns the steps
    compiled."""
    best = best_known(prep, know, budget_bytes)
    reference = float("inf") if best is None else cost(prep, best) * (1 - 1e-9)
    near = [
        k
        for k in know.measured.values()
        if k.measured.peak_source != REFUSED
        and budget_bytes < peak_of(k.measured) <= budget_bytes * (1 + CALLS_BAND)
        and cost(prep, k) < reference
        and not any(s.kept_calls for s in k.choice.choices.values())
    ]
    if not near:
        return 0
    kept = kept_form(prep, min(near, key=lambda k: cost(prep, k)).choice)
    if kept is None or choice_key(kept) in know.measured:
        return 0
    say("compiling a near miss with its jitted calls kept whole")
    verify(choice_key(kept), kept)
    return 1
