"""A larger budget never gets a dearer plan.

A linen `nn.scan` over `nn.remat(Block, policy=nothing_saveable)` (the MaxText way): as
written it saves nothing, so a budget above its peak buys cheaper plans. The model puts the
candidate that recomputes nothing far under the larger budget, so it is compiled without a
check of its scans alone (`_ahead.ample`), and it measures over; the solver then offers its
equals (values that cost no FLOPs to recompute, saved or not), each with the same peak. Once
a compiled candidate is over, the next ones must be checked alone first, else the rounds
compile those equals until they end and return the program as written, dearer than the plan
found at the smaller budget.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._plan import _memo

D, L, T, B = 32, 3, 17, 8


@pytest.fixture(scope="module")
def scanned():
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            x = x + nn.SelfAttention(num_heads=2)(nn.LayerNorm()(x))
            y = nn.Dense(4 * D)(nn.LayerNorm()(x))
            return x + nn.Dense(D)(nn.gelu(y)), None

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = nn.remat(Block, policy=jax.checkpoint_policies.nothing_saveable,
                             prevent_cse=False)  # fmt: skip
            x, _ = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                           length=L)(name="encoder")(x, None)  # fmt: skip
            return nn.Dense(10)(x[:, 0])

    net = Net()
    x = jnp.asarray(np.random.default_rng(0).normal(size=(B, T, D)), jnp.float32)
    params = net.init(jax.random.key(0), x)["params"]

    def loss(p, x):
        return jnp.mean(net.apply({"params": p}, x) ** 2)

    return loss, (params, x)


@pytest.mark.slow  # two plans of a small scan: ~20 s of CPU, over the default run's share
def test_a_larger_budget_never_gets_a_dearer_plan(scanned):
    loss, args = scanned
    written = remat.measure(loss, *args).peak_bytes
    _memo.forget()
    # The larger budget first: its plan cannot be the smaller budget's, found later.
    plans = [remat.plan(loss, *args, budget=int(written * f), verbose=False) for f in (1.3, 1.1)]
    for p in plans:
        assert p.measured_peak_bytes <= p.budget_bytes
    assert plans[0].flops_ratio <= plans[1].flops_ratio
    # No two compiled candidates of one tier measured over the larger budget.
    (know,) = [k for k in _memo._MEMORY.values() if k.prepared.fingerprint == plans[0].fingerprint]
    over = [round(_memo.cost(know.prepared, k)) for k in know.measured.values()
            if k.measured.peak_bytes > plans[0].budget_bytes]  # fmt: skip
    assert len(over) == len(set(over))
