"""Per-layer candidates: the layers of one scan given save sets that repeat with a period.

For a scan of ``L`` steps and each period ``g`` dividing it (2 to `PLANNED_PERIOD`), the
integer program gets one more option: ``g`` copies
of the scan's graph, one per position, each stored ``L / g`` times and recomputed ``L / g``
times, each its own group for the transient memory (the backward pass differentiates one
position at a time). Such an option competes with the uniform ones in the same program; with
the same save set at every position it keeps and recomputes what the uniform option does,
and a byte of its own (`TIE_BYTES`) makes the solver prefer the uniform one then. What the
group body keeps beyond this model (a position's parameter gradients live until the group's
end) is charged to the option the first time one is checked on its scan alone
(`_alone.check_alone`), as for `remat.Nested`.

A decoded per-layer choice runs as `remat._trace._periodic.periodic_loop`; its `ScanPlan`
records the save set of each position (``pattern``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .._trace._periodic import Period, periods
from ._costmodel import ScanModel
from ._milp import Node, Option
from ._options import Candidate

# The largest period the planner offers. Each period adds ``g`` copies of the scan's graph
# to the integer program: on the vs_torch GPT (78 values per layer) one solve took 0.3 s
# with the uniform options alone, 4-7 s with period 2 and 11-16 s with periods 2 and 4
# (measured on 2 cores under a load average of 20). `periodic_loop` runs any period up to
# `remat._trace._periodic.MAX_PERIOD`.
PLANNED_PERIOD = 2

# The bytes a per-layer option costs of its own: among choices of equal memory and FLOPs,
# the uniform one.
TIE_BYTES = 1.0


def period_candidates(
    models: Sequence[ScanModel], enabled: bool = True, most: int = PLANNED_PERIOD
) -> list[Candidate]:
    """The per-layer candidates of every scan (see the module docstring), or none."""
    if not enabled:
        return []
    cands = []
    for k, model in enumerate(models):
        size = len(model.values)
        for g in periods(model.length, most):
            steps = model.length // g
            nodes: list[Node] = []
            for position in range(g):
                for node in model.nodes(group=position, steps=steps):
                    nodes.append(
                        dataclasses.replace(
                            node,
                            inputs=tuple(u + position * size for u in node.inputs),
                            repeats=steps,
                        )
                    )
            option = Option(group=k, bytes=TIE_BYTES)
            cands.append(Candidate(k, Period(g), option, tuple(nodes), False))
    return cands


def describe(pattern: Sequence[Sequence[str]], length: int, label=None) -> list[str]:
    """One line per distinct save set of a pattern: which layers save what.

    Example:
      >>> from remat._plan._perlayer import describe
      >>> describe([("a", "b"), ()], 8)
      ['layers 0,2,4,6 save {a, b}', 'layers 1,3,5,7 save nothing']
    """
    label = label or (lambda name: name)
    g = len(pattern)
    sets: dict[tuple[str, ...], list[int]] = {}
    for k, names in enumerate(pattern):
        sets.setdefault(tuple(names), []).extend(range(k, length, g))
    lines = []
    for names, layers in sets.items():
        what = "{" + ", ".join(label(n) for n in names) + "}" if names else "nothing"
        lines.append(f"layers {','.join(map(str, sorted(layers)))} save {what}")
    return lines
