"""Planning, comparing and linting from shapes alone (`jax.ShapeDtypeStruct` arguments).

The planner compiles and reads memory and FLOPs; it never runs the step. A plan made from
shapes must be the plan made from arrays of those shapes, and must load and run on arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import checkpoint_policies as cp

import remat
from conftest import assert_tree_allclose, mlp_stack
from remat._plan._memo import forget
from remat._plan._plan import plan_budgets


def shapes(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


@pytest.fixture(scope="module")
def stack():
    loss, args = mlp_stack(layers=6, d=8, batch=96, seed=3)
    return loss, args, shapes(args)


def test_plan_from_shapes_is_the_plan_from_arrays_and_runs_on_arrays(stack, tmp_path):
    loss, args, specs = stack
    forget()
    from_shapes = remat.plan(loss, *specs, budget="60%", verbose=False)
    forget()
    from_arrays = remat.plan(loss, *args, budget="60%", verbose=False)
    assert from_shapes.scans == from_arrays.scans
    assert from_shapes.fingerprint == from_arrays.fingerprint
    assert from_shapes.measured_peak_bytes == from_arrays.measured_peak_bytes
    assert from_shapes.measured_peak_bytes <= from_shapes.budget_bytes
    assert from_shapes.measured.backend == jax.default_backend()
    assert "checked on" in from_shapes.explain()
    # What carries to the machine that holds the values: the plan file.
    path = from_shapes.to_json(tmp_path / "plan.json")
    loaded = remat.load_plan(path, loss, *args)
    assert_tree_allclose(jax.grad(loaded.fn)(*args), jax.grad(loss)(*args))
    assert_tree_allclose(jax.grad(from_shapes.fn)(*args), jax.grad(loss)(*args))


def test_plan_budgets_and_an_optimizer_step_from_shapes(stack):
    loss, _, specs = stack
    plans = plan_budgets(loss, *specs, budgets=["80%", "50%"], verbose=False)
    assert all(p.measured_peak_bytes <= p.budget_bytes for p in plans)
    planned = remat.plan(loss, *specs, budget="70%", optimizer=optax.adam(1e-3), verbose=False)
    assert planned.measured_peak_bytes <= planned.budget_bytes


def test_compare_from_shapes_measures_and_refuses_to_time(stack):
    loss, args, specs = stack
    report = remat.compare(loss, *specs, strategies=["full"], repeats=0, progress=False)
    same = remat.compare(loss, *args, strategies=["full"], repeats=0, progress=False)
    assert [m.peak_bytes for _, m in report.rows] == [m.peak_bytes for _, m in same.rows]
    with pytest.raises(TypeError, match=r"`remat.compare` got a `jax.ShapeDtypeStruct` at "
                       r"args\[0\]\[0\] with repeats=1.*Pass repeats=0"):  # fmt: skip
        remat.compare(loss, *specs, strategies=["full"], repeats=1, progress=False)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's CSE behaviour")
def test_lint_compiles_from_shapes_to_find_undone_checkpoints():
    def loss(x):  # a checkpoint outside any loop: XLA on CPU undoes it (RM005)
        layer = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x @ x)), policy=cp.nothing_saveable)
        return jnp.sum(layer(x))

    found = remat.lint(loss, jax.ShapeDtypeStruct((16, 16), jnp.float32))
    assert [f.code for f in found] == ["RM005"]
