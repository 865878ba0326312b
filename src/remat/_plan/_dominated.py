"""Options no optimum needs: those another option of their group matches or beats on every term.

A per-layer option (`remat._plan._perlayer`) is a mix of two points of a layer's Pareto front,
one binary variable of the integer program without nodes; every pair of points is mixed at
every count of layers, so most mixes lie above the front the others draw: on the GPT of
`benchmarks/vs_torch.py`, 295 of its 396 mixes have another mix that stores no more, keeps no
more transient memory and recomputes no more. Such an option can be swapped for the one that
beats it in any solution, which then costs no more FLOPs and no more memory and fits wherever
it did: `dominated` lists them, and `_milp.solve` fixes their variables at zero where that
swap keeps a solution feasible (no floor on the FLOPs, no cap on the bytes saved counted
otherwise, no excluded solution choosing the option that beats them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np


def dominated(
    groups: Sequence[int],
    memory: Sequence[float],
    flops: Sequence[float],
    transient: Sequence[float],
    free: Collection[int],
    keep: Collection[int] = (),
) -> frozenset[int]:
    """The options of ``free`` (the indices of options without nodes) that another option of
    ``free`` in the same group (``groups``) matches or beats on ``memory`` (its coefficient in
    the memory budget), ``flops`` and ``transient`` alike, beating it on one (of two equal
    on all three, the later one); the options of ``keep`` (chosen by a solution excluded)
    are never the ones that beat another.

    Example:
      >>> from remat._plan._dominated import dominated
      >>> sorted(dominated([0, 0, 0, 0], [2, 3, 1, 2], [5, 5, 9, 5], [0, 0, 0, 0], range(4)))
      [1, 3]
      >>> sorted(dominated([0, 0], [2, 3], [5, 5], [0, 0], range(2), keep={0}))
      []
    """
    free = sorted(free)
    if len(free) < 2:
        return frozenset()
    index = np.array(free)
    terms = np.stack([np.asarray(t, dtype=float)[index] for t in (memory, flops, transient)], 1)
    group = np.asarray(groups)[index]
    beats = ~np.isin(index, list(keep))
    out = []
    for k in range(len(index)):
        le = np.all(terms <= terms[k], axis=1) & (group == group[k]) & beats
        le[k] = False
        strict = np.any(terms < terms[k], axis=1)
        earlier = np.arange(len(index)) < k
        if np.any(le & (strict | earlier)):
            out.append(int(index[k]))
    return frozenset(out)


def dominated_out(nodes, options, stored_weight, slice_weight, exclude, exclude_costly):
    """`_milp.solve`'s program without its `dominated` options (see the module docstring):
    ``(kept, nodes, options, exclude, exclude_costly)``, where ``kept[j]`` is the index in
    ``options`` of option ``j`` of the smaller program, the nodes refer to those indices, and
    an excluded solution that chose an option left out is dropped (no solution of the smaller
    program chooses it); None where none is left out. Only for solves without a floor on the
    FLOPs or a cap on the bytes saved (a dominated option may be the one that meets them)."""
    keep = {k for ex in (*exclude, *exclude_costly) for k in ex.options}
    out = dominated(
        [opt.group for opt in options],
        [stored_weight * opt.bytes + slice_weight * opt.sliced for opt in options],
        [opt.flops for opt in options],
        [opt.transient for opt in options],
        set(range(len(options))) - {node.option for node in nodes},
        keep,
    )
    if not out:
        return None
    kept = tuple(k for k in range(len(options)) if k not in out)
    index = {k: j for j, k in enumerate(kept)}
    nodes = [
        node if node.option is None else dataclasses.replace(node, option=index[node.option])
        for node in nodes
    ]

    def remapped(solutions):
        return [
            dataclasses.replace(ex, options=tuple(index[k] for k in ex.options))
            for ex in solutions
            if not out & set(ex.options)
        ]

    return kept, nodes, [options[k] for k in kept], remapped(exclude), remapped(exclude_costly)
