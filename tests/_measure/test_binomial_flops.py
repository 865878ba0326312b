"""`remat.Binomial`'s FLOPs are exact: its backward loops' trip counts come from the schedule.

The backward sweep advances a different number of steps from each restored snapshot, so XLA
sees a ``while`` loop with a data-dependent trip count inside a loop over the schedule's
rows; the sweep names the totals (`remat._core._flop_tags`) and the HLO reader counts them.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._core._flop_tags import branch_scope, trip_scope
from remat._measure._hlo import hlo_flops
from remat._measure._step import ANALYSIS_OPTIONS  # HLO read, never run

B, D = 8, 16
F = 2 * B * D * D  # one step's matmul: (B, D) @ (D, D)


def loss(schedule, n, differentiate_w=True):
    def f(ws, x):
        step = lambda c, w: (jnp.tanh(c @ w), None)  # noqa: E731
        c, _ = remat.scan(step, x, ws, schedule=schedule)
        return jnp.sum(c**2)

    return f


def grad_flops(schedule, n):
    ws = jnp.full((n, D, D), 0.05)
    x = jnp.ones((B, D))
    text = jax.jit(jax.grad(loss(schedule, n))).lower(ws, x).compile(ANALYSIS_OPTIONS).as_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error", remat.RematWarning)  # no loop left uncounted
        return hlo_flops(text)


@pytest.mark.parametrize(("n", "snapshots"), [(8, 2), (13, 3), (20, 2), (6, 1)])
def test_binomial_grad_flops_by_hand(n, snapshots):
    # The forward sweep runs n steps; the backward advances revolve_cost - (n - 1) more
    # (the schedule's own sweep is the first n - 1 advances); each of the n reversals
    # recomputes its step (F) and runs its backward (2F: the carry's and the weight's).
    advances = remat.revolve_cost(n, snapshots) - (n - 1)
    want = n * F + advances * F + n * 3 * F
    assert grad_flops(remat.Binomial(snapshots), n) == want


def test_binomial_with_a_snapshot_per_step_costs_what_per_step_costs():
    n = 9
    assert grad_flops(remat.Binomial(n - 1), n) == grad_flops("per_step", n) == 4 * n * F


def test_second_order_counts_the_row_switch_by_its_kinds():
    # grad of grad runs the differentiable twin: a `lax.switch` over unit rows whose branch
    # counts are named; without them every row would count as a reversal.
    n = 8
    ws, x = jnp.full((n, D, D), 0.05), jnp.ones((B, D))
    f = loss(remat.Binomial(2), n)
    gg = jax.grad(lambda ws: jnp.sum(jax.grad(f)(ws, x) ** 2))
    text = jax.jit(gg).lower(ws).compile(ANALYSIS_OPTIONS).as_text()
    counted = hlo_flops(text)
    untagged = hlo_flops(text.replace("remat_branches_", "untagged_"))
    assert counted < untagged


def test_tags_count_fractional_trips_and_weighted_branches():
    def f(x, n):
        with jax.named_scope(trip_scope(7, 1)):
            y = jax.lax.fori_loop(0, n, lambda i, c: c @ c, x)
        with jax.named_scope(branch_scope([0, 1], 1)):
            y = jax.lax.cond(n > 100, lambda c: c @ c @ c, lambda c: c, y)
        return y

    text = jax.jit(f).lower(jnp.ones((4, 4)), 3).compile(ANALYSIS_OPTIONS).as_text()
    mm = 2 * 4 * 4 * 4
    assert hlo_flops(text) == 7 * mm + 2 * mm  # 7 trips; the true branch (two matmuls)
