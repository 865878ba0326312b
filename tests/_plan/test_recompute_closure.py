"""A fixed save set recomputes every input its recomputed values need that it does not save.

The planner's calibration points (`remat._plan._options.fixed_solution`) save by a rule:
``"unfused"`` keeps every value the backward pass reads that XLA cannot fuse. A value no
backward rule reads (the matmul output that ``jnp.split`` cuts into an LSTM's gates) is then
neither saved nor, by that rule, recomputed; but the gates are recomputed from it, so XLA
computes it again. Its FLOPs belong to the point.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp

import remat
from remat._plan._milp import Node
from remat._plan._options import fixed_solution

STEPS = 16


def test_an_input_neither_saved_nor_listed_is_recomputed_and_charged():
    nodes = (
        Node(bytes=8, flops=0.0, needed=True, recomputable=False, multiplicity=STEPS),  # carry
        Node(bytes=32, flops=100.0, inputs=(0,), repeats=STEPS, multiplicity=STEPS),  # matmul
        Node(bytes=8, flops=0.0, inputs=(1,), needed=True, fusible=True, repeats=STEPS,
             multiplicity=STEPS),  # a gate: split out of the matmul
    )  # fmt: skip
    cand = SimpleNamespace(nodes=nodes, option=SimpleNamespace(flops=0.0))
    s = fixed_solution([cand], [0], [0], "unfused")
    assert s.saved == {0} and s.recomputed == {1, 2}
    assert s.recompute_flops == 100.0 * STEPS


def _gated(w, xs):
    def step(c, x):
        h, cell = c
        i, f, g, o = jnp.split((h + x) @ w, 4, axis=-1)
        cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(g)
        return (jax.nn.sigmoid(o) * jnp.tanh(cell), cell), None

    (h, _), _ = jax.lax.scan(step, (jnp.zeros((4, 32)), jnp.zeros((4, 32))), xs)
    return jnp.sum(h**2)


def test_a_plan_of_split_gates_reports_the_flops_it_recomputes():
    w = jax.random.normal(jax.random.key(0), (32, 128)) / 6
    xs = jax.random.normal(jax.random.key(1), (STEPS, 4, 32))
    p = remat.plan(_gated, w, xs, budget=0.5, verbose=False)
    extra = p.measured.flops - p.baseline_flops  # read from the compiled step
    assert extra > 0
    assert sum(s.recompute_flops for s in p.scans) == extra
