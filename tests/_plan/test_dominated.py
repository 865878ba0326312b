"""Options another option of their group matches or beats are left out of the integer
program: its solutions are those of the whole program, and HiGHS sees fewer variables."""

from __future__ import annotations

import itertools

import pytest

from remat._plan import _milp
from remat._plan._dominated import dominated_out
from remat._plan._milp import Node, Option, solve


def program():
    """A per-step option with nodes and nodeless mixes (bytes, FLOPs, transient): the mixes
    at 1, 3 and 5 are beaten by 0, 2 and 4 on every term."""
    nodes = [Node(bytes=4, flops=10.0, multiplicity=8, needed=True, option=0)]
    mixes = [(20, 30, 4), (24, 30, 4), (12, 60, 4), (12, 60, 6), (4, 90, 0), (4, 95, 0)]
    options = [Option(group=0)] + [Option(group=0, bytes=b, flops=f, transient=t)
                                   for b, f, t in mixes]  # fmt: skip
    return nodes, options


def test_dominated_mixes_are_left_out_and_indices_map_back():
    nodes, options = program()
    kept, nodes_, options_, _, _ = dominated_out(nodes, options, 1.0, 0.0, (), ())
    assert kept == (0, 1, 3, 5)  # the option with nodes is never left out
    assert options_ == [options[k] for k in kept] and nodes_ == nodes


@pytest.mark.parametrize("budget", [10, 16, 24, 30, 40])
@pytest.mark.parametrize("minimize", ["flops", "memory"])
def test_solutions_equal_the_whole_programs(monkeypatch, budget, minimize):
    nodes, options = program()
    got = solve(nodes, budget, options=options, minimize=minimize)
    monkeypatch.setattr(_milp, "dominated_out", lambda *a: None)
    whole = solve(nodes, budget, options=options, minimize=minimize)
    assert (got is None) == (whole is None)
    if got is not None:
        assert (got.options, got.recompute_flops, got.saved_bytes) == (
            whole.options, whole.recompute_flops, whole.saved_bytes)  # fmt: skip


def test_an_excluded_mix_beats_none_and_a_floor_keeps_them_all():
    nodes, options = program()
    first = solve(nodes, 28, options=options)  # 20 stored + 4 transient
    assert first.options == (1,) and first.recompute_flops == 30
    # Excluded, option 1 beats nothing: option 2, which it beats, is the next cheapest.
    second = solve(nodes, 28, options=options, exclude=[first])
    assert second.options == (2,) and second.recompute_flops == 30
    # A floor on the FLOPs may need a dominated option: none is left out.
    floor = solve(nodes, 100, options=options, min_flops=92.0)
    assert floor.options == (6,)


def test_every_subset_of_exclusions_agrees_with_the_whole_program(monkeypatch):
    nodes, options = program()
    pool = [solve(nodes, 100, options=options, exclude=[])]
    for _ in range(3):
        pool.append(solve(nodes, 100, options=options, exclude=pool))
    for r in range(len(pool) + 1):
        for excluded in itertools.combinations(pool, r):
            got = solve(nodes, 28, options=options, exclude=excluded)
            with monkeypatch.context() as m:
                m.setattr(_milp, "dominated_out", lambda *a: None)
                whole = solve(nodes, 28, options=options, exclude=excluded)
            assert (None if got is None else got.recompute_flops) == (
                None if whole is None else whole.recompute_flops)  # fmt: skip
