"""`remat.revolve_schedule` and `remat.revolve_cost`: optimality, and a simulator of the actions."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import remat
from remat._scan._revolve import revolve_schedule


@functools.cache
def _recurrence_table(n_max: int, s_max: int) -> list[list[int]]:
    """A(n, s) by the recurrence in _revolve's docstring, by dynamic programming (not its code)."""
    a = [[0] * (s_max + 1) for _ in range(n_max + 1)]
    for n in range(2, n_max + 1):
        a[n][0] = n * (n - 1) // 2
        for s in range(1, s_max + 1):
            a[n][s] = min(m + a[n - m][s - 1] + a[m][s] for m in range(1, n))
    return a


def simulate(n: int, snapshots: int, actions) -> int:
    """Executes ``actions`` on symbolic carries (their step indices); returns the advances.

    Checks every rule of the schedule: slot 0 holds index 0 and is never written; stores
    use slots 1..snapshots; restores read a slot that holds a carry; each reversal has the
    input of its step current, in the order n-1, ..., 0; the first sweep (before the first
    reversal) only advances and stores.
    """
    slots = {0: 0}
    current = 0
    expected = n - 1
    advances = 0
    seen_reverse = False
    for kind, arg in actions:
        assert isinstance(arg, int)
        if kind == "advance":
            assert arg >= 1
            current += arg
            assert current <= n - 1, "advanced past the last step's input"
            advances += arg
        elif kind == "store":
            assert 1 <= arg <= snapshots, f"store into slot {arg} with {snapshots} snapshots"
            slots[arg] = current
        elif kind == "restore":
            assert seen_reverse, "the first sweep must not restore"
            assert arg in slots, f"restore from empty slot {arg}"
            current = slots[arg]
        elif kind == "reverse":
            assert arg == expected, f"reversed step {arg}, expected {expected}"
            assert current == arg, f"reversing step {arg} with carry {current} current"
            expected -= 1
            seen_reverse = True
        else:
            raise AssertionError(f"unknown action {kind!r}")
    assert expected == -1, "not every step was reversed"
    assert len(slots) - 1 <= snapshots
    return advances


def test_closed_form_equals_recurrence():
    table = _recurrence_table(200, 10)
    for n in range(1, 201):
        for s in range(11):
            assert remat.revolve_cost(n, s) == table[n][s], (n, s)


def test_schedule_simulates_and_is_optimal_up_to_200_steps_and_10_snapshots():
    table = _recurrence_table(200, 10)
    for n in range(1, 201):
        for s in range(11):
            actions = revolve_schedule(n, s)
            assert simulate(n, s, actions) == table[n][s], (n, s)


def test_hand_worked_schedules():
    # No snapshots: restart from slot 0 before every reversal, 2 + 1 + 0 advances.
    assert remat.revolve_schedule(3, 0) == (
        ("advance", 2),
        ("reverse", 2),
        ("restore", 0),
        ("advance", 1),
        ("reverse", 1),
        ("restore", 0),
        ("reverse", 0),
    )
    # Enough snapshots: one forward sweep storing every carry, then reverse from the slots.
    actions = remat.revolve_schedule(4, 3)
    assert sum(arg for kind, arg in actions if kind == "advance") == 3
    assert remat.revolve_schedule(1, 5) == (("reverse", 0),)
    # Griewank's example sizes: beta(c, t) = C(c + t, c) steps take exactly t sweeps, e.g.
    # c = 3 (2 snapshots), t = 3: 20 steps, A = 3 * 20 - C(6, 2) = 45.
    assert remat.revolve_cost(20, 2) == 45


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), s=st.integers(0, 40))
def test_large_schedules_simulate_to_the_closed_form(n, s):
    assert simulate(n, s, revolve_schedule(n, s)) == remat.revolve_cost(n, s)


def test_more_snapshots_never_cost_more():
    for n in (10, 97, 1000):
        costs = [remat.revolve_cost(n, s) for s in range(0, 12)]
        assert costs == sorted(costs, reverse=True)
        assert costs[0] == n * (n - 1) // 2


@pytest.mark.parametrize(
    ("n", "snapshots", "match"),
    [(0, 1, "n=0"), (2.0, 1, "n=2.0"), (True, 1, "n=True"), (5, -1, "snapshots=-1")],
)
def test_errors_name_the_function(n, snapshots, match):
    with pytest.raises(ValueError, match=rf"`remat.revolve_schedule` got {match}"):
        remat.revolve_schedule(n, snapshots)
    with pytest.raises(ValueError, match=rf"`remat.revolve_cost` got {match}"):
        remat.revolve_cost(n, snapshots)


def test_compiled_table_replays_the_schedule():
    """`remat.scan`'s Binomial backward table (`_plan`), replayed on symbolic carries: the
    forward sweep stores the first sweep's snapshots and the last step's input; each table row
    (one unit action) restores, advances or reverses one step, and stores consistently; in
    all, A(n, s) advances."""
    from remat._scan._scan_binomial import ADVANCE, REVERSE, _plan

    for n in range(1, 121):
        for s in range(1, 9):
            stores, first, slots, table, macros = _plan(n, s)
            assert slots <= s and max(stores) == n - 1
            rows = {row: index for index, row in stores.items()}  # forward pass writes
            assert 0 <= first <= slots and rows[first] == n - 1
            current, expected, advances = n - 1, n - 1, n - 1  # the forward's first sweep
            for restore, index, kind, store in table.tolist():
                if restore >= 0:
                    current = 0 if restore == 0 else rows[restore - 1]
                assert current == index
                if kind == ADVANCE:
                    current += 1
                    advances += 1
                else:
                    assert kind == REVERSE and current == expected
                    expected -= 1
                if store >= 1:
                    rows[store - 1] = current
            assert expected == -1
            assert advances == remat.revolve_cost(n, s), (n, s)
            # The macro rows (restore, start, advance, store, reverse) replay the same way.
            rows = {row: index for index, row in stores.items()}
            current, expected, advances = n - 1, n - 1, n - 1
            for restore, start, advance, store, reverse in macros.tolist():
                if restore >= 0:
                    current = 0 if restore == 0 else rows[restore - 1]
                assert current == start
                current += advance
                advances += advance
                if store >= 1:
                    rows[store - 1] = current
                if reverse:
                    assert current == expected
                    expected -= 1
            assert expected == -1 and advances == remat.revolve_cost(n, s)
