"""A cap on the bytes a plan saves (`remat.plan(..., saved=...)`, `remat._plan._saved`):
the plan keeps no more residuals than asked, recomputing what the cap leaves out."""

from __future__ import annotations

import jax
import pytest

import remat
from conftest import assert_tree_allclose, mlp_stack
from remat._plan._memo import saved_of

LAYERS, D, BATCH = 8, 32, 256
CARRY = BATCH * D * 4  # one layer's input, float32


@pytest.fixture(scope="module")
def stack():
    return mlp_stack(layers=LAYERS, d=D, batch=BATCH)


def test_a_cap_on_saved_bytes_recomputes_what_it_leaves_out(stack):
    """Each layer saves its input (the carry) and ``h @ w1`` (4 carries), the loss its input;
    capped at the carries alone, every layer recomputes its first matmul, 2 * batch * d * 4d
    FLOPs."""
    loss, args = stack
    free = remat.plan(loss, *args, budget="100%", verbose=False)
    assert free.flops_ratio == 1.0 and saved_of(free.measured) == (LAYERS * 5 + 1) * CARRY
    p = remat.plan(loss, *args, budget="100%", saved=(LAYERS + 1) * CARRY, verbose=False)
    assert saved_of(p.measured) <= (LAYERS + 1) * CARRY
    assert p.measured_peak_bytes <= p.budget_bytes
    assert p.measured.flops - free.measured.flops == LAYERS * 2 * BATCH * D * 4 * D
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args))
    (again,) = remat.plan_budgets(loss, *args, budgets=["100%"], saved=(LAYERS + 1) * CARRY,
                                  verbose=False)  # fmt: skip
    assert again.scans == p.scans and again.stats.step_compiles == 0  # the program is known


def test_a_cap_nothing_reaches_says_what_the_least_saved_was(stack):
    loss, args = stack
    with pytest.raises(remat.InfeasibleBudget, match=r"saved=2048 \(2048 bytes") as err:
        remat.plan(loss, *args, budget="100%", saved=2048, verbose=False)
    assert err.value.smallest_saved_bytes > 2048
    with pytest.raises(ValueError, match=r"`remat.plan` got saved='lots'"):
        remat.plan(loss, *args, budget="100%", saved="lots", verbose=False)
