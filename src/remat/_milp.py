"""The rematerialisation integer program: which values to save, which to recompute.

A Checkmate-style mixed-integer program (Jain et al., "Checkmate: Breaking the Memory Wall with
Optimal Tensor Rematerialization", MLSys 2020), specialised to the case that matters for
scanned layer stacks: the forward pass of a step runs once, and the backward pass of the step
needs some of its values. Each such value is either *saved* (kept from the forward pass, costing
its bytes once per scan step) or *recomputed* in the backward pass (costing its FLOPs once per
step), and a value can be recomputed only from values that are themselves saved or recomputed
(or are free inputs). Since the backward pass of one step runs at a time, recomputed values
cost memory only transiently: the largest step's recomputed bytes, once.

Variables per node ``v``: binary ``save[v]``, binary ``recompute[v]``; one continuous
``transient``. Minimise ``sum(recompute[v] * flops[v] * mult[v])`` (plus a tiny multiple of the
memory, so that among equally cheap choices the smallest is taken, which keeps the chosen
memory monotone in the budget) subject to::

    save[v] + recompute[v] >= 1                 for every value the backward pass needs
    recompute[v] <= save[u] + recompute[u]      for every input u of v
    save[v] + recompute[v] <= 1
    sum_{v in group g} recompute[v] * bytes[v] <= transient      for every group g
    fixed + sum(save[v] * bytes[v] * mult[v]) + transient <= budget

solved exactly by HiGHS through `scipy.optimize.milp`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


@dataclasses.dataclass(frozen=True)
class Node:
    """One value in the graph of a step.

    Attributes:
      bytes: bytes of one copy.
      flops: FLOPs to recompute it once (from its inputs).
      inputs: indices of the nodes it is computed from (free inputs are left out).
      multiplicity: how many copies are stored when it is saved: the length of the scan
        around it (1 for a loop-invariant value, which is stored once).
      repeats: how many times it is recomputed when it is not saved (``None``: the same as
        ``multiplicity``).
      needed: whether the backward pass reads it.
      saveable: whether it may be saved.
      recomputable: whether it may be recomputed (False for a scan's carry, which only
        exists if stored).
      group: the scan it belongs to; recomputed values of one group are live together.
    """

    bytes: int
    flops: float
    inputs: tuple[int, ...] = ()
    multiplicity: int = 1
    repeats: int | None = None
    needed: bool = False
    saveable: bool = True
    recomputable: bool = True
    group: int = 0

    @property
    def recompute_flops(self) -> float:
        """FLOPs of recomputing it in every step: ``flops * repeats``."""
        return self.flops * (self.multiplicity if self.repeats is None else self.repeats)


@dataclasses.dataclass(frozen=True)
class Solution:
    """What `solve` chose.

    Attributes:
      saved: indices of the saved nodes.
      recomputed: indices of the nodes recomputed in the backward pass.
      recompute_flops: ``sum(flops * repeats)`` over recomputed nodes.
      saved_bytes: ``sum(bytes * multiplicity)`` over saved nodes.
      transient_bytes: the largest group's recomputed bytes.
    """

    saved: frozenset[int]
    recomputed: frozenset[int]
    recompute_flops: float
    saved_bytes: int
    transient_bytes: int

    @property
    def memory_bytes(self) -> int:
        """``saved_bytes + transient_bytes``: what the choice adds to the fixed memory."""
        return self.saved_bytes + self.transient_bytes


def _check(nodes: Sequence[Node]) -> None:
    for i, node in enumerate(nodes):
        for u in node.inputs:
            if not 0 <= u < len(nodes) or u == i:
                raise ValueError(
                    f"`remat._milp.solve` got node {i} with input {u}, which is not another "
                    f"node of the graph (0..{len(nodes) - 1})."
                )


def _solution(nodes: Sequence[Node], x: np.ndarray) -> Solution:
    n = len(nodes)
    saved = frozenset(i for i in range(n) if x[i] > 0.5)
    recomputed = frozenset(i for i in range(n) if x[n + i] > 0.5)
    groups: dict[int, int] = {}
    for i in recomputed:
        groups[nodes[i].group] = groups.get(nodes[i].group, 0) + nodes[i].bytes
    return Solution(
        saved=saved,
        recomputed=recomputed,
        recompute_flops=float(sum(nodes[i].recompute_flops for i in recomputed)),
        saved_bytes=int(sum(nodes[i].bytes * nodes[i].multiplicity for i in saved)),
        transient_bytes=max(groups.values(), default=0),
    )


def solve(
    nodes: Sequence[Node],
    budget_bytes: float,
    *,
    fixed_bytes: float = 0,
    minimize: str = "flops",
    time_limit: float = 30.0,
) -> Solution | None:
    """Chooses the values to save and to recompute, or returns None when nothing fits.

    Args:
      nodes: the graph (see `Node`).
      budget_bytes: the memory budget.
      fixed_bytes: memory that does not depend on the choice.
      minimize: ``"flops"`` (the cheapest choice that fits) or ``"memory"`` (the smallest
        memory reachable at all, whatever it costs).
      time_limit: seconds HiGHS may take.

    Returns:
      A `Solution`, or None when no choice fits ``budget_bytes``.

    Example:
      A chain ``a -> b`` (20 and 10 FLOPs) in a scan of 10 steps, both needed by the backward pass. Saving both
      costs 10 * (4 + 4) bytes; recomputing ``b`` from a saved ``a`` costs 10 * 10 FLOPs and
      10 * 4 + 4 bytes (one step's ``b`` is live while it is used).

      >>> from remat._milp import Node, solve
      >>> a = Node(bytes=4, flops=20, multiplicity=10, needed=True)
      >>> b = Node(bytes=4, flops=10, inputs=(0,), multiplicity=10, needed=True)
      >>> s = solve([a, b], budget_bytes=80)
      >>> sorted(s.saved), sorted(s.recomputed), s.recompute_flops
      ([0, 1], [], 0.0)
      >>> s = solve([a, b], budget_bytes=50)
      >>> sorted(s.saved), sorted(s.recomputed), s.recompute_flops, s.memory_bytes
      ([0], [1], 100.0, 44)
    """
    _check(nodes)
    n = len(nodes)
    if n == 0:
        return Solution(frozenset(), frozenset(), 0.0, 0, 0) if fixed_bytes <= budget_bytes else None
    nvar = 2 * n + 1  # save[0..n), recompute[0..n), transient
    mem = np.zeros(nvar)
    for i, node in enumerate(nodes):
        mem[i] = node.bytes * node.multiplicity
    mem[2 * n] = 1.0
    scale_mem = max(float(mem.max()), 1.0)
    flops = np.zeros(nvar)
    for i, node in enumerate(nodes):
        flops[n + i] = node.recompute_flops
    total_flops = max(float(flops.sum()), 1.0)
    if minimize == "flops":
        # The memory term is worth less than the smallest FLOP difference HiGHS resolves.
        c = flops / total_flops + 1e-6 * mem / (scale_mem * (n + 1))
    elif minimize == "memory":
        c = mem / scale_mem + 1e-6 * flops / total_flops
    else:
        raise ValueError(f"`remat._milp.solve` got minimize={minimize!r}; use 'flops' or 'memory'.")

    rows, lo, hi = [], [], []

    def row(coeffs: dict[int, float], low: float, high: float) -> None:
        r = np.zeros(nvar)
        for k, v in coeffs.items():
            r[k] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    for i, node in enumerate(nodes):
        if node.needed:
            row({i: 1.0, n + i: 1.0}, 1.0, np.inf)
        row({i: 1.0, n + i: 1.0}, -np.inf, 1.0)
        for u in set(node.inputs):
            row({n + i: 1.0, u: -1.0, n + u: -1.0}, -np.inf, 0.0)
    for g in sorted({node.group for node in nodes}):
        coeffs = {n + i: node.bytes / scale_mem for i, node in enumerate(nodes) if node.group == g}
        coeffs[2 * n] = -1.0 / scale_mem
        row(coeffs, -np.inf, 0.0)
    if minimize == "flops":
        row({k: mem[k] / scale_mem for k in range(nvar) if mem[k]}, -np.inf,
            (budget_bytes - fixed_bytes) / scale_mem)
    upper = np.ones(nvar)
    for i, node in enumerate(nodes):
        upper[i] = 1.0 if node.saveable else 0.0
        upper[n + i] = 1.0 if node.recomputable else 0.0
    upper[2 * n] = np.inf
    integrality = np.ones(nvar)
    integrality[2 * n] = 0
    result = milp(
        c,
        constraints=LinearConstraint(np.array(rows), np.array(lo), np.array(hi)),
        integrality=integrality,
        bounds=Bounds(np.zeros(nvar), upper),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-9},
    )
    if result.x is None:
        return None
    solution = _solution(nodes, np.round(result.x[: 2 * n]))
    if fixed_bytes + solution.memory_bytes > budget_bytes * (1 + 1e-9) and minimize == "flops":
        return None
    return solution
