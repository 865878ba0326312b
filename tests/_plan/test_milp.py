"""The rematerialisation MILP on small hand-made graphs whose optimum is known."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remat._plan._milp import Node, Option, materialised, solve


def chain(n, *, bytes_=4, flops=10.0, steps=10):
    """x -> v0 -> v1 -> ... ; every value needed by the backward pass."""
    return [
        Node(
            bytes=bytes_, flops=flops, inputs=(i - 1,) if i else (), multiplicity=steps, needed=True
        )
        for i in range(n)
    ]


def test_everything_fits_nothing_recomputed():
    s = solve(chain(3), budget_bytes=10_000)
    assert s.saved == {0, 1, 2} and not s.recomputed
    assert s.recompute_flops == 0 and s.saved_bytes == 3 * 4 * 10


def test_chain_saves_what_is_cheapest_to_keep():
    # Budget for one saved value (40) + the transient of one step's recomputed values.
    # Saving v0 lets v1 and v2 be recomputed from it (20 FLOPs per step). Saving v2 instead
    # needs v0, v1 recomputed (also 20) -- but both equal: tie broken by memory, which is
    # equal too, so only the cost is pinned.
    s = solve(chain(3), budget_bytes=40 + 8)
    assert len(s.saved) == 1 and len(s.recomputed) == 2
    assert s.recompute_flops == 2 * 10 * 10


def test_expensive_values_are_saved_first():
    # v1 is a matmul (1000 FLOPs), the others elementwise (1 FLOP): keep v1, recompute the rest.
    nodes = [
        Node(bytes=4, flops=1, multiplicity=10, needed=True),
        Node(bytes=4, flops=1000, inputs=(0,), multiplicity=10, needed=True),
        Node(bytes=4, flops=1, inputs=(1,), multiplicity=10, needed=True),
    ]
    s = solve(nodes, budget_bytes=40 + 8)
    assert s.saved == {1}
    assert s.recomputed == {0, 2}
    assert s.recompute_flops == 20


def test_recompute_needs_its_inputs():
    # b is needed and cheap to recompute, but only from a, which is not recomputable and
    # not saveable: b must be saved.
    nodes = [
        Node(bytes=100, flops=0, saveable=False, recomputable=False),
        Node(bytes=4, flops=1, inputs=(0,), multiplicity=10, needed=True),
    ]
    s = solve(nodes, budget_bytes=1000)
    assert s.saved == {1} and not s.recomputed
    # Carry-like input: not recomputable but saveable; recomputing b forces saving it.
    nodes[0] = Node(bytes=1, flops=0, multiplicity=10, recomputable=False)
    s = solve(nodes, budget_bytes=10 + 4)
    assert s.saved == {0} and s.recomputed == {1}


def test_infeasible_and_minimum_memory():
    nodes = chain(3)
    assert solve(nodes, budget_bytes=5) is None
    smallest = solve(nodes, budget_bytes=5, minimize="memory")
    assert smallest.saved == set()  # recompute all three from the free input
    assert smallest.memory_bytes == 12  # one step's three values, live together
    assert solve(nodes, budget_bytes=12) is not None


def test_fixed_bytes_count_against_the_budget():
    assert solve(chain(2), budget_bytes=80).recompute_flops == 0
    assert solve(chain(2), budget_bytes=80, fixed_bytes=20).recompute_flops > 0


def test_transient_weight():
    nodes = chain(2)
    # Nothing saved: transient 8 bytes; half of it counted.
    assert solve(nodes, budget_bytes=4, transient_weight=0.5) is not None
    assert solve(nodes, budget_bytes=4, transient_weight=1.0) is None


def test_options_pick_one_schedule_per_group():
    # Scan 0 has two options: "per_step" keeps its node for 10 steps (40 bytes, 0 FLOPs);
    # "binomial" keeps 8 bytes of carries and re-runs steps (50 FLOPs).
    options = [Option(group=0), Option(group=0, bytes=8, flops=50)]
    nodes = [Node(bytes=4, flops=1000, multiplicity=10, needed=True, option=0, group=0)]
    s = solve(nodes, budget_bytes=100, options=options)
    assert s.options == (0,) and s.saved == {0} and s.recompute_flops == 0
    s = solve(nodes, budget_bytes=20, options=options)
    assert s.options == (1,) and not s.saved and s.recompute_flops == 50
    assert s.saved_bytes == 8


def test_two_groups_share_one_budget():
    options = [Option(group=0), Option(group=1)]
    nodes = [
        Node(bytes=10, flops=5, multiplicity=2, needed=True, option=0, group=0),
        Node(bytes=10, flops=50, multiplicity=2, needed=True, option=1, group=1),
    ]
    assert solve(nodes, budget_bytes=40, options=options).recompute_flops == 0
    # Room for one saved value (2 copies) plus the other's transient: save the expensive one.
    s = solve(nodes, budget_bytes=30, options=options)
    assert s.saved == {1} and s.recomputed == {0} and s.recompute_flops == 10
    # Recomputing both: the groups' transients are live one at a time (a maximum, not a sum).
    s = solve(nodes, budget_bytes=10, options=options)
    assert s.recomputed == {0, 1} and s.memory_bytes == 10


def test_bad_graph():
    with pytest.raises(ValueError, match="not another node"):
        solve([Node(bytes=1, flops=1, inputs=(3,))], 10)
    with pytest.raises(ValueError, match="minimize"):
        solve(chain(1), 10, minimize="time")


def test_deterministic():
    nodes = chain(6, flops=1.0)
    assert solve(nodes, 100) == solve(nodes, 100)


def _brute_force(nodes, budget, slice_weight=0.0):
    """Exhaustive optimum: (flops, memory) of the best feasible choice, or None."""
    n = len(nodes)
    best = None
    for choice in itertools.product((0, 1, 2), repeat=n):  # 0 neither, 1 save, 2 recompute
        S = {i for i in range(n) if choice[i] == 1}
        R = {i for i in range(n) if choice[i] == 2}
        if any(nodes[i].needed and i not in S | R for i in range(n)):
            continue
        if any(not nodes[i].saveable for i in S) or any(not nodes[i].recomputable for i in R):
            continue
        if any(u not in S | R for i in R for u in nodes[i].inputs):
            continue
        mem = sum(nodes[i].bytes * nodes[i].multiplicity for i in S)
        mem += slice_weight * sum(nodes[i].bytes for i in S if nodes[i].multiplicity > 1)
        live = set()  # materialised: not fusible, or computed from a materialised value
        for i in sorted(R):  # inputs precede their users in these graphs
            if not nodes[i].fusible or any(u in live for u in nodes[i].inputs):
                live.add(i)
        mem += sum(nodes[i].bytes for i in live if nodes[i].needed)
        if mem > budget:
            continue
        cost = sum(nodes[i].recompute_flops for i in R)
        if best is None or cost < best:
            best = cost
    return best


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        inputs = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else ()
        nodes.append(
            Node(
                bytes=draw(st.integers(1, 8)),
                flops=float(draw(st.integers(0, 20))),
                inputs=inputs,
                multiplicity=draw(st.sampled_from([1, 3])),
                needed=draw(st.booleans()),
                recomputable=draw(st.integers(0, 3)) > 0,
                fusible=draw(st.booleans()),
            )
        )
    budget = draw(st.integers(0, 60))
    return nodes, budget, draw(st.sampled_from([0.0, 1.0]))


@settings(max_examples=60, deadline=None)
@given(graphs())
def test_matches_exhaustive_search(case):
    nodes, budget, slice_weight = case
    expected = _brute_force(nodes, budget, slice_weight)
    got = solve(nodes, budget, slice_weight=slice_weight)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got.recompute_flops == pytest.approx(expected)
        assert got.memory_bytes + slice_weight * got.slice_bytes <= budget


def test_fusible_recompute_from_saved_values_costs_no_transient():
    # a: a matmul (100 FLOPs); b = act(a): elementwise (0 FLOPs). Both needed, 10 steps.
    a = Node(bytes=4, flops=100, multiplicity=10, needed=True)
    b = Node(bytes=4, flops=0, inputs=(0,), multiplicity=10, needed=True, fusible=True)
    # Save a, recompute b: b is fused into its consumers, so no transient: 40 bytes.
    s = solve([a, b], budget_bytes=40)
    assert s.saved == {0} and s.recomputed == {1} and s.transient_bytes == 0
    assert s.memory_bytes == 40
    # Not fusible (e.g. a matmul reads it): one step's b is live, so saving a costs 44
    # bytes; within 40 only recomputing both fits (8 bytes, 1000 FLOPs).
    unfused = [a, dataclasses.replace(b, fusible=False)]
    s = solve(unfused, budget_bytes=44)
    assert s.saved == {0} and s.memory_bytes == 44 and s.recompute_flops == 0
    assert solve(unfused, budget_bytes=43).recompute_flops == 1000
    # Recompute both: a is a matmul, so b (computed from it) is materialised too: 8 bytes.
    s = solve([a, b], budget_bytes=8)
    assert s.recomputed == {0, 1} and s.transient_bytes == 8 and s.recompute_flops == 1000


def test_materialised_follows_chains_from_recomputed_matmuls():
    mm = Node(bytes=1, flops=10)
    e1 = Node(bytes=1, flops=0, inputs=(0,), fusible=True)
    e2 = Node(bytes=1, flops=0, inputs=(1,), fusible=True)
    nodes = [mm, e1, e2]
    assert materialised(nodes, {0, 1, 2}) == {0, 1, 2}
    assert materialised(nodes, {1, 2}) == set()  # mm saved: the chain is fused
    assert materialised(nodes, {2}) == set()


def test_slice_weight_counts_one_step_of_saved_values():
    # Saving a (4 bytes x 10 steps) with slice_weight 1: 40 + 4 bytes (recomputing it would
    # cost 4 bytes and 1000 FLOPs); an invariant value (multiplicity 1) is not sliced.
    a = Node(bytes=4, flops=100, multiplicity=10, needed=True)
    assert solve([a], budget_bytes=43, slice_weight=1.0).recompute_flops == 1000
    assert solve([a], budget_bytes=43, slice_weight=0.0).recompute_flops == 0
    s = solve([a], budget_bytes=44, slice_weight=1.0)
    assert s.saved == {0} and s.slice_bytes == 4 and s.saved_bytes == 40
    w = Node(bytes=4, flops=100, multiplicity=1, needed=True)
    s = solve([w], budget_bytes=4, slice_weight=1.0)
    assert s.saved == {0} and s.slice_bytes == 0


def test_max_flops_gives_the_least_memory_within_a_flops_limit():
    # chain of three needed values, 10 FLOPs each, 10 steps (see test_chain_*): saving all
    # costs 120 bytes and 0 FLOPs; saving v0 only costs 40 + 8 bytes and 200 FLOPs.
    nodes = chain(3)
    assert solve(nodes, 0, minimize="memory", max_flops=0).memory_bytes == 120
    s = solve(nodes, 0, minimize="memory", max_flops=200)
    assert s.recompute_flops == 200 and s.memory_bytes == 48
    # 100 FLOPs: one value recomputed from a saved one: 80 + 4 bytes.
    assert solve(nodes, 0, minimize="memory", max_flops=150).memory_bytes == 84


def test_recomputes_values_of_gigabytes():
    """At the sizes of real models the transient memory keeps its place in the program: its
    coefficient, one over the memory scale, was under HiGHS's smallest matrix value (1e-9)
    above 1 GB and was dropped, so nothing that materialises could be recomputed."""
    gib = 2**30
    a = Node(bytes=4 * gib, flops=20, multiplicity=10, needed=True, fusible=False)
    b = Node(bytes=4 * gib, flops=10, inputs=(0,), multiplicity=10, needed=True, fusible=False)
    s = solve([a, b], budget_bytes=50 * gib)
    # Saving ``a`` and recomputing ``b``: 40 GiB stored and one step's ``b``, 4 GiB, live.
    assert (sorted(s.saved), sorted(s.recomputed)) == ([0], [1])
    assert (s.saved_bytes, s.transient_bytes, s.recompute_flops) == (40 * gib, 4 * gib, 100.0)
    # The least memory recomputes both: one step's ``a`` and ``b`` live, nothing stored.
    least = solve([a, b], budget_bytes=0, minimize="memory")
    assert (least.saved_bytes, least.transient_bytes) == (0, 8 * gib)


def test_gib_sized_values_can_be_recomputed():
    """One step of a scanned MLP sharded over a TPU slice: GiB-sized values (the transient
    variable's coefficients are not lost under HiGHS's smallest matrix value). Saving the
    matmul output and recomputing the tanh from it fits 15.75 GiB; the least memory saves
    only the carry."""
    gib = 2**30
    common = dict(multiplicity=8, repeats=8, needed=True, saveable=True, group=0, option=0)
    nodes = [
        Node(bytes=gib // 4, flops=0.0, inputs=(), recomputable=False, **common),  # carry
        Node(bytes=gib, flops=4.4e12, inputs=(0,), recomputable=True, **common),  # h @ w1
        Node(bytes=gib, flops=0.0, inputs=(1,), recomputable=True, **common),  # tanh
    ]
    weights = dict(options=[Option(0, 0.0, 0.0)], fixed_bytes=1.06 * gib,
                   transient_weight=2.0, stored_weight=0.93, slice_weight=0.93)  # fmt: skip
    s = solve(nodes, int(15.75 * gib), **weights)
    assert (s.saved, s.recomputed, s.recompute_flops) == ({0, 1}, {2}, 0.0)
    least = solve(nodes, int(15.75 * gib), minimize="memory", **weights)
    assert (least.saved, least.recomputed) == ({0}, {1, 2})


def test_exclude_costly_changes_what_is_recomputed_not_a_free_alias():
    # x -> a (matmul) -> a2 (a's reshape: free), and x -> b (matmul); a2 and b are needed.
    # One matmul's output fits beside x: save a (or a2, the same data) and recompute b, or
    # save b and recompute a. A plain no-good cut may return the same recomputation with a2
    # saved in a's place; `exclude_costly` must recompute the other matmul.
    nodes = [
        Node(bytes=4, flops=0, multiplicity=10, recomputable=False),
        Node(bytes=8, flops=100, inputs=(0,), multiplicity=10),
        Node(bytes=8, flops=0, inputs=(1,), multiplicity=10, needed=True),
        Node(bytes=8, flops=100, inputs=(0,), multiplicity=10, needed=True),
    ]
    matmuls = {1, 3}
    budget = 140  # x and one matmul's output (120) and one step's recomputed values
    first = solve(nodes, budget_bytes=budget)
    assert first.recompute_flops == 1000 and len(first.recomputed & matmuls) == 1
    other = solve(nodes, budget_bytes=budget, exclude_costly=[first])
    assert other.recompute_flops == first.recompute_flops
    assert other.recomputed & matmuls == matmuls - first.recomputed
    # Both ruled out: recomputing both matmuls (a dearer tier) is what is left.
    both = solve(nodes, budget_bytes=budget, exclude_costly=[first, other])
    assert both.recomputed >= matmuls and both.recompute_flops == 2000
