"""The rematerialisation integer program: which values to save, which to recompute.

A Checkmate-style mixed-integer program (Jain et al., "Checkmate: Breaking the Memory Wall with
Optimal Tensor Rematerialization", MLSys 2020), specialised to the case that matters for
scanned layer stacks: the forward pass of a step runs once, and the backward pass of the step
needs some of its values. Each such value is either *saved* (kept from the forward pass, costing
its bytes once per scan step) or *recomputed* in the backward pass (costing its FLOPs once per
step), and a value can be recomputed only from values that are themselves saved or recomputed
(or are free inputs). Since the backward pass of one step runs at a time, recomputed values
cost memory only transiently: the largest step's *materialised* recomputed bytes, once. A
recomputed value is materialised unless it is fusible (elementwise: XLA fuses it into its
consumers) and computed only from saved values or other fused ones.

Variables per node ``v``: binary ``save[v]``, binary ``recompute[v]``, continuous
``materialised[v]`` in [0, 1]; one continuous ``transient``. Minimise ``sum(recompute[v] * flops[v] * mult[v])`` (plus a tiny multiple of the
memory, so that among equally cheap choices the smallest is taken, which keeps the chosen
memory monotone in the budget) subject to::

    save[v] + recompute[v] >= 1                 for every value the backward pass needs
    recompute[v] <= save[u] + recompute[u]      for every input u of v
    save[v] + recompute[v] <= 1
    materialised[v] >= recompute[v]                         for v not fusible
    materialised[v] >= recompute[v] + materialised[u] - 1   for fusible v, every input u
    sum_{v in group g, needed} materialised[v] * bytes[v] <= transient   for every group g
    fixed + sum(save[v] * bytes[v] * (mult[v] + slice)) + transient <= budget

A scan's schedule is chosen in the same program: each schedule is an `Option` with its own
copy of the scan's nodes (stored once per step, or once per inner block step for `Nested`)
and its own fixed bytes and FLOPs (stored carries, re-run forward steps); binary
``chosen[o]`` with one option per scan, and a node's constraints hold only when its option is
chosen. Solved exactly by HiGHS through
`scipy.optimize.milp`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from ._dominated import dominated_out

# One HiGHS solve at a time in this process: the planner solves on a second thread too
# (`_mixes`), and the solves need not be run side by side with each other, only with XLA's
# compiles.
_HIGHS = threading.Lock()


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
      group: recomputed values of one group that the backward pass needs are live
        together (one scan step's); a unique group per scan and option.
      option: the index of the `Option` it belongs to, if any: it exists only if that
        option is chosen.
      offload_flops: the cost of keeping it in host memory instead of on the device (its
        ``bytes * multiplicity`` copied out and back, in FLOP-equivalents: see
        `remat._core._offload`), or None when it cannot be offloaded. An offloaded value costs no
        device memory and counts as available, like a saved one.
      fusible: whether XLA fuses its recomputation into its consumers (an elementwise op):
        when recomputed, it then costs no transient memory unless one of its inputs is
        itself a materialised recomputed value (see `materialised`). ``False``: a recomputed
        value is materialised (a matmul's output).
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
    option: int | None = None
    offload_flops: float | None = None
    fusible: bool = False

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
      recompute_flops: ``sum(flops * repeats)`` over recomputed nodes, plus the chosen
        options' FLOPs.
      saved_bytes: ``sum(bytes * multiplicity)`` over saved nodes, plus the chosen options'
        bytes.
      transient_bytes: the largest group's recomputed bytes (those the backward pass
        needs), or the largest chosen option's transient memory.
      options: indices of the chosen options.
      offloaded: indices of the nodes kept in host memory (see `Node.offload_flops`).
      offload_flops: their transfer cost, in FLOP-equivalents (included in the objective,
        not in ``recompute_flops``).
      slice_bytes: one step's copy of the saved values stored per step (``multiplicity >
        1``): the backward pass of a step reads its saved values out of the stacked buffers.
    """

    saved: frozenset[int]
    recomputed: frozenset[int]
    recompute_flops: float
    saved_bytes: int
    transient_bytes: int
    options: tuple[int, ...] = ()
    offloaded: frozenset[int] = frozenset()
    offload_flops: float = 0.0
    slice_bytes: int = 0

    @property
    def memory_bytes(self) -> int:
        """``saved_bytes + transient_bytes``: what the choice adds to the fixed memory (with
        unit weights and no ``slice_weight``)."""
        return self.saved_bytes + self.transient_bytes


@dataclasses.dataclass(frozen=True)
class Option:
    """One of several alternatives for a scan (e.g. its schedule); one per group is chosen.

    Nodes whose ``option`` is this option's index exist only if it is chosen.

    Attributes:
      group: the scan; exactly one option of each group is chosen.
      bytes: memory that choosing it costs besides its nodes (e.g. stored carries).
      flops: FLOPs that choosing it costs besides its nodes (e.g. re-run forward steps).
      transient: memory live only while one step is differentiated (taken as a maximum with
        the groups' recomputed values, not added up).
      sliced: bytes of one step's copy of its stored values, counted like the nodes' (see
        ``slice_weight`` in `solve`): an option that stands for a whole save set (a per-layer
        pattern, `remat._plan._perlayer`) has no nodes to count them.
    """

    group: int
    bytes: float = 0.0
    flops: float = 0.0
    transient: float = 0.0
    sliced: float = 0.0


def _check(nodes: Sequence[Node], options: Sequence[Option]) -> None:
    for i, node in enumerate(nodes):
        for u in node.inputs:
            if not 0 <= u < len(nodes) or u == i:
                raise ValueError(
                    f"`remat._plan._milp.solve` got node {i} with input {u}, which is not another "
                    f"node of the graph (0..{len(nodes) - 1})."
                )
        if node.option is not None and not 0 <= node.option < len(options):
            raise ValueError(
                f"`remat._plan._milp.solve` got node {i} with option {node.option}, but only "
                f"{len(options)} options."
            )


def materialised(nodes: Sequence[Node], recomputed: frozenset[int] | set[int]) -> set[int]:
    """The recomputed nodes that XLA materialises: those that are not fusible, and fusible
    ones computed from a materialised one (a chain of elementwise ops from saved values is
    fused into its consumers and costs no memory of its own).

    Example:
      >>> from remat._plan._milp import Node, materialised
      >>> mm = Node(bytes=4, flops=100)  # a matmul
      >>> act = Node(bytes=4, flops=0, inputs=(0,), fusible=True)  # its activation
      >>> sorted(materialised([mm, act], {0, 1})), sorted(materialised([mm, act], {1}))
      ([0, 1], [])
    """
    out = {i for i in recomputed if not nodes[i].fusible}
    changed = True
    while changed:
        changed = False
        for i in recomputed:
            if i not in out and any(u in out for u in nodes[i].inputs):
                out.add(i)
                changed = True
    return out


def _solution(nodes: Sequence[Node], options: Sequence[Option], x: np.ndarray) -> Solution:
    n = len(nodes)
    saved = frozenset(i for i in range(n) if x[i] > 0.5)
    recomputed = frozenset(i for i in range(n) if x[n + i] > 0.5)
    chosen = tuple(k for k in range(len(options)) if x[2 * n + 1 + k] > 0.5)
    off = 2 * n + 1 + len(options)
    offloaded = frozenset(i for i in range(n) if x.size > off + i and x[off + i] > 0.5)
    groups: dict[int, float] = {}
    for i in materialised(nodes, recomputed):
        if nodes[i].needed:
            groups[nodes[i].group] = groups.get(nodes[i].group, 0) + nodes[i].bytes
    transients = [*groups.values(), *(options[k].transient for k in chosen)]
    return Solution(
        saved=saved,
        recomputed=recomputed,
        recompute_flops=float(sum(nodes[i].recompute_flops for i in recomputed))
        + float(sum(options[k].flops for k in chosen)),
        saved_bytes=int(sum(nodes[i].bytes * nodes[i].multiplicity for i in saved))
        + int(sum(options[k].bytes for k in chosen)),
        transient_bytes=int(max(transients, default=0)),
        options=chosen,
        offloaded=offloaded,
        offload_flops=float(sum(nodes[i].offload_flops or 0.0 for i in offloaded)),
        slice_bytes=int(sum(nodes[i].bytes for i in saved if nodes[i].multiplicity > 1))
        + int(sum(options[k].sliced for k in chosen)),
    )


def solve(
    nodes: Sequence[Node],
    budget_bytes: float,
    *,
    options: Sequence[Option] = (),
    fixed_bytes: float = 0,
    transient_weight: float = 1.0,
    stored_weight: float = 1.0,
    slice_weight: float = 0.0,
    minimize: str = "flops",
    max_flops: float | None = None,
    min_flops: float | None = None,
    max_saved: float | None = None,
    option_saved: Sequence[float] | None = None,
    time_limit: float = 30.0,
    exclude: Sequence[Solution] = (),
    exclude_costly: Sequence[Solution] = (),
) -> Solution | None:
    """Chooses the values to save and to recompute, or returns None when nothing fits.

    Args:
      nodes: the graph (see `Node`).
      budget_bytes: the memory budget.
      options: alternatives, exactly one chosen per group (see `Option`); nodes that belong
        to an option exist only when it is chosen.
      fixed_bytes: memory that does not depend on the choice.
      transient_weight: the fraction of the transient memory counted against the budget
        (calibrated on the compiled program: XLA fuses much of a step's recomputation).
      stored_weight: the factor by which stored bytes (saved nodes, options' bytes) are
        counted (calibrated likewise; 1 unless the compiled program keeps more or less).
      slice_weight: the factor on one step's copy of the values saved per step (read out of
        the stacked buffers by the step's backward pass; see `Solution.slice_bytes`). With
        several scans it is counted for each, which overestimates.
      minimize: ``"flops"`` (the cheapest choice that fits) or ``"memory"`` (the smallest
        memory reachable at all, whatever it costs; the budget is ignored).
      max_flops: with ``minimize="memory"``, the most recompute FLOPs allowed (options'
        FLOPs included): the smallest memory of any choice that recomputes at most this much.
        ``None``: no limit.
      min_flops: the fewest recompute FLOPs allowed (options' FLOPs included): e.g. above
        those of a candidate found over the budget on the compiled program. ``None``: no
        limit.
      max_saved: the most bytes stored (saved values times their multiplicity, and the
        options' bytes; unweighted, `Solution.saved_bytes`), whatever the memory budget.
        ``None``: no limit.
      option_saved: each option's bytes in the ``max_saved`` bound, where they differ from
        its ``bytes`` (e.g. options charged what the compiled program keeps at the peak).
      time_limit: seconds HiGHS may take.
      exclude: solutions not to return again (their saved values and options; a "no-good"
        cut each), e.g. candidates found over the budget on the compiled program.
      exclude_costly: solutions whose recomputation is not to be chosen again: at least
        one value that costs FLOPs to recompute (``flops > 0``) is recomputed where it is
        not, or not where it is, or an option differs, from each (solutions that differ
        only in which of the values recomputed for free they save, e.g. a value or its
        reshape, cost the same and compile alike).

    Returns:
      A `Solution`, or None when no choice fits ``budget_bytes``.

    Raises:
      ValueError: for a node whose inputs or option are not in the graph.

    Example:
      A chain ``a -> b`` (20 and 10 FLOPs) in a scan of 10 steps, both needed by the backward
      pass. Saving both costs 10 * (4 + 4) bytes; recomputing ``b`` from a saved ``a`` costs
      10 * 10 FLOPs and 10 * 4 + 4 bytes (one step's ``b`` is live while it is used).

      >>> from remat._plan._milp import Node, solve
      >>> a = Node(bytes=4, flops=20, multiplicity=10, needed=True)
      >>> b = Node(bytes=4, flops=10, inputs=(0,), multiplicity=10, needed=True)
      >>> s = solve([a, b], budget_bytes=80)
      >>> sorted(s.saved), sorted(s.recomputed), s.recompute_flops
      ([0, 1], [], 0.0)
      >>> s = solve([a, b], budget_bytes=50)
      >>> sorted(s.saved), sorted(s.recomputed), s.recompute_flops, s.memory_bytes
      ([0], [1], 100.0, 44)
    """
    _check(nodes, options)
    if minimize not in ("flops", "memory"):
        raise ValueError(
            f"`remat._plan._milp.solve` got minimize={minimize!r}; use 'flops' or 'memory'."
        )
    if min_flops is None and max_saved is None:  # no optimum needs a dominated option
        out = dominated_out(nodes, options, stored_weight, slice_weight, exclude, exclude_costly)
        if out is not None:
            kept, nodes_, options_, exclude_, costly_ = out
            solution = solve(nodes_, budget_bytes, options=options_, fixed_bytes=fixed_bytes,
                             transient_weight=transient_weight, stored_weight=stored_weight,
                             slice_weight=slice_weight, minimize=minimize, max_flops=max_flops,
                             time_limit=time_limit, exclude=exclude_, exclude_costly=costly_)  # fmt: skip
            if solution is None:
                return None
            return dataclasses.replace(solution, options=tuple(kept[k] for k in solution.options))
    n, m = len(nodes), len(options)
    # save[0..n), recompute[0..n), transient, chosen[0..m), offload[0..n), materialised[0..n)
    nvar = 4 * n + 1 + m
    t, y, off, z = 2 * n, 2 * n + 1, 2 * n + 1 + m, 3 * n + 1 + m
    mem = np.zeros(nvar)
    flops = np.zeros(nvar)
    for i, node in enumerate(nodes):
        mem[i] = stored_weight * node.bytes * node.multiplicity
        if node.multiplicity > 1:
            mem[i] += slice_weight * node.bytes
        flops[n + i] = node.recompute_flops
        flops[off + i] = node.offload_flops or 0.0
    for k, opt in enumerate(options):
        mem[y + k] = stored_weight * opt.bytes + slice_weight * opt.sliced
        flops[y + k] = opt.flops
    scale_mem = max(float(np.abs(mem).max()), 1.0)
    # The transient variable counts units of ``scale_mem`` bytes: in bytes its coefficient in
    # the rows below would be 1 / scale_mem, under HiGHS's smallest matrix value (1e-9) for a
    # step over a GB, which dropped it and so forbade every recomputation that materialises.
    mem[t] = transient_weight * scale_mem
    scale_flops = max(float(flops.sum()), 1.0)
    # Lexicographic objectives: first the fewest FLOPs (or the least memory), then, among
    # those, the least memory (or FLOPs). A tiny tie-breaking term in one objective instead
    # misleads HiGHS into stopping at worse solutions.
    first, second = flops / scale_flops, mem / scale_mem
    if minimize == "memory":
        first, second = second, first
    else:
        # Among choices of equal memory (e.g. a value and its `checkpoint_name` alias), the
        # same one at every budget: a tiny preference for saving earlier values keeps the
        # plans, and so the measured peaks, from changing while the budget does not bind.
        second = second.copy()
        second[:n] += 1e-6 * (np.arange(n) + 1) / max(n, 1)

    data, rows, cols, lo, hi = [], [], [], [], []

    def row(coeffs: dict[int, float], low: float, high: float) -> None:
        r = len(lo)
        for k, v in coeffs.items():
            rows.append(r)
            cols.append(k)
            data.append(v)
        lo.append(low)
        hi.append(high)

    for i, node in enumerate(nodes):
        exists = {} if node.option is None else {y + node.option: -1.0}
        bound = 0.0 if node.option is not None else 1.0
        if node.needed:
            row({i: 1.0, n + i: 1.0, off + i: 1.0, **exists}, bound, np.inf)  # S+R+O >= exists
        row({i: 1.0, n + i: 1.0, off + i: 1.0, **exists}, -np.inf, bound)  # S+R+O <= exists
        for u in sorted(set(node.inputs)):
            row({n + i: 1.0, u: -1.0, n + u: -1.0, off + u: -1.0}, -np.inf, 0.0)
        # materialised[i] >= recompute[i] (not fusible), or >= recompute[i] + materialised[u] - 1
        if not node.fusible:
            row({z + i: 1.0, n + i: -1.0}, 0.0, np.inf)
        for u in sorted(set(node.inputs)) if node.fusible else ():
            row({z + i: 1.0, n + i: -1.0, z + u: -1.0}, -1.0, np.inf)
    for g in sorted({node.group for node in nodes}):
        coeffs = {
            z + i: node.bytes / scale_mem
            for i, node in enumerate(nodes)
            if node.group == g and node.needed
        }
        if coeffs:
            coeffs[t] = -1.0
            row(coeffs, -np.inf, 0.0)
    for k, opt in enumerate(options):
        if opt.transient:
            row({y + k: opt.transient / scale_mem, t: -1.0}, -np.inf, 0.0)
    for g in sorted({opt.group for opt in options}):
        row({y + k: 1.0 for k, opt in enumerate(options) if opt.group == g}, 1.0, 1.0)
    if minimize == "flops":
        coeffs = {k: mem[k] / scale_mem for k in range(nvar) if mem[k]}
        row(coeffs, -np.inf, (budget_bytes - fixed_bytes) / scale_mem)

    def differs(chosen: dict[int, bool]) -> None:
        """A no-good row: at least one of these binary variables differs from ``chosen``
        (``sum(1 - x over the chosen) + sum(x over the others) >= 1``)."""
        coeffs = {v: (-1.0 if on else 1.0) for v, on in chosen.items()}
        row(coeffs, 1.0 - sum(chosen.values()), np.inf)

    saveable = [i for i in range(n) if nodes[i].saveable]
    costly = [i for i in range(n) if nodes[i].recomputable and nodes[i].flops > 0]
    for ex in exclude:  # at least one save or option variable differs from ``ex``
        chosen = {i: i in ex.saved for i in saveable}
        differs(chosen | {y + k: k in ex.options for k in range(m)})
    for ex in exclude_costly:  # at least one costly recompute or option variable differs
        chosen = {n + i: i in ex.recomputed for i in costly}
        differs(chosen | {y + k: k in ex.options for k in range(m)})
    if max_flops is not None:
        coeffs = {k: flops[k] / scale_flops for k in range(nvar) if flops[k]}
        row(coeffs, -np.inf, max_flops / scale_flops + 1e-9)
    if min_flops is not None:
        coeffs = {k: flops[k] / scale_flops for k in range(nvar) if flops[k]}
        row(coeffs, min_flops / scale_flops, np.inf)
    if max_saved is not None:
        stored = {i: node.bytes * node.multiplicity / scale_mem for i, node in enumerate(nodes)}
        kept = [opt.bytes for opt in options] if option_saved is None else option_saved
        stored.update({y + k: b / scale_mem for k, b in enumerate(kept)})
        row({k: v for k, v in stored.items() if v}, -np.inf, max_saved / scale_mem)
    upper = np.ones(nvar)
    for i, node in enumerate(nodes):
        upper[i] = 1.0 if node.saveable else 0.0
        upper[n + i] = 1.0 if node.recomputable else 0.0
        upper[off + i] = 1.0 if node.saveable and node.offload_flops is not None else 0.0
    upper[t] = np.inf
    integrality = np.ones(nvar)
    integrality[t] = 0
    integrality[z:] = 0  # materialised[i] is 0 or 1 at every vertex once recompute[] is
    matrix = sparse.csr_array((data, (rows, cols)), shape=(len(lo), nvar))
    bounds = Bounds(np.zeros(nvar), upper)
    # HiGHS's presolve has been seen to call feasible programs of this shape infeasible; these
    # programs are small, so they are solved without it.
    options_ = {"time_limit": time_limit, "mip_rel_gap": 1e-9, "presolve": False}
    constraints = [LinearConstraint(matrix, np.array(lo), np.array(hi))] if lo else []
    with _HIGHS:
        result = milp(first, constraints=constraints, integrality=integrality, bounds=bounds,
                      options=options_)  # fmt: skip
        if result.x is not None:
            best = float(first @ np.round(result.x))
            keep = LinearConstraint(first[None, :], -np.inf, best + 1e-9 * max(1.0, abs(best)))
            tie = milp(second, constraints=[*constraints, keep], integrality=integrality,
                       bounds=bounds, options=options_)  # fmt: skip
            if tie.x is not None:
                result = tie
    if result.x is None:
        return None
    solution = _solution(nodes, options, np.round(result.x))
    used = (
        fixed_bytes
        + stored_weight * solution.saved_bytes
        + slice_weight * solution.slice_bytes
        + transient_weight * solution.transient_bytes
    )
    if minimize == "flops" and used > budget_bytes * (1 + 1e-6):
        return None
    return solution
