"""Equinox modules passed whole, as ``eqx.filter_value_and_grad(loss)(model, x)`` takes
them: array leaves traced (floating point ones differentiated), every other leaf (the
dropout's ``inference`` bool, its rate, activation functions) static, on every entry point."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose
from remat._plan._plan import plan_budgets
from remat._trace._eqx import Split, combined, has_modules, split_modules

eqx = pytest.importorskip("equinox")


class Block(eqx.Module):
    norm: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    drop: eqx.nn.Dropout

    def __init__(self, d, key):
        self.norm = eqx.nn.LayerNorm(d)
        self.mlp = eqx.nn.MLP(d, d, 2 * d, depth=1, activation=jax.nn.gelu, key=key)
        self.drop = eqx.nn.Dropout(0.1)

    def __call__(self, x, key):
        return x + self.drop(jax.vmap(self.mlp)(jax.vmap(self.norm)(x)), key=key)


class Model(eqx.Module):
    """Layers in a Python list, looped over: Equinox's own way of writing a stack."""

    blocks: list
    head: eqx.nn.Linear
    steps: jax.Array  # an integer leaf: traced, not differentiated

    def __init__(self, d, layers, key):
        keys = jax.random.split(key, layers + 1)
        self.blocks = [Block(d, k) for k in keys[:layers]]
        self.head = eqx.nn.Linear(d, 1, key=keys[-1])
        self.steps = jnp.zeros((), jnp.int32)

    def __call__(self, x, key):
        for block, k in zip(self.blocks, jax.random.split(key, len(self.blocks)), strict=True):
            x = block(x, k)
        return jax.vmap(self.head)(x)


def loss(model, x, key):
    return jnp.mean(model(x, key) ** 2)


def make(d=8, layers=3, tokens=32):
    model = Model(d, layers, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (tokens, d))
    return model, x, jax.random.key(2)


@pytest.fixture(scope="module")
def small():
    """`make()`: built once (its modules initialise op by op), for the tests that only read it."""
    return make()


def test_split_keeps_arrays_as_leaves_and_the_rest_static(small):
    model, x, key = small
    (split, x2, key2) = split_modules((model, x, key))
    assert isinstance(split, Split) and x2 is x and key2 is key
    arrays = jax.tree_util.tree_leaves(split)
    assert arrays == [a for a in jax.tree_util.tree_leaves(model) if eqx.is_array(a)]
    assert not has_modules(split_modules((model,)))
    # the static part: the bool, the rate and the activation function, in the structure
    assert jax.tree_util.tree_structure(split) == jax.tree_util.tree_structure(
        split_modules((model,))[0]
    )
    assert float(combined(loss)(split, x, key)) == float(loss(model, x, key))


def test_measure_is_the_measure_of_the_split_program(small):
    model, x, key = small
    arrays, static = eqx.partition(model, eqx.is_array)
    by_hand = remat.measure(lambda a, x, k: loss(eqx.combine(a, static), x, k), arrays, x, key,
                            repeats=0)  # fmt: skip
    m = remat.measure(loss, model, x, key, repeats=0)
    assert (m.peak_bytes, m.flops) == (by_hand.peak_bytes, by_hand.flops)
    full = remat.measure(loss, model, x, key, strategy="full", repeats=0)  # rolled, then full
    assert full.flops > m.flops and full.peak_bytes < m.peak_bytes


def test_apply_lint_and_compare_take_the_module(small):
    model, x, key = small
    grads = eqx.filter_grad(remat.apply(loss, "full"))(model, x, key)
    assert_tree_allclose(grads, eqx.filter_grad(loss)(model, x, key))
    assert remat.lint(loss, model, x, key, strategy="full") == []
    report = remat.compare(loss, model, x, key, strategies=["full"], repeats=0, progress=False)
    assert report.labels == ("none", "full")


def test_planned_whole_at_35_percent_with_equinox_gradients(tmp_path):
    """The issue's case: the model passed whole (a dropout's ``inference`` bool, an int
    leaf, activation functions among its leaves), planned at 35% of its peak; the plan's
    gradients, and those of the plan saved and loaded, are ``eqx.filter_grad``'s of the loss,
    in the module's structure."""
    model, x, key = make(layers=8, tokens=128)
    # one compile each, not one per operation (their values are what the test compares)
    value_and_grad = lambda f: eqx.filter_jit(eqx.filter_value_and_grad(f))(model, x, key)  # noqa: E731
    want = value_and_grad(loss)
    (plan,) = plan_budgets(loss, model, x, key, budgets=["35%"], verbose=False)
    assert isinstance(plan, remat.Plan), plan
    assert plan.rolled and plan.measured_peak_bytes <= plan.budget_bytes
    assert plan.measured_peak_bytes <= 0.35 * plan.baseline_peak_bytes
    assert_tree_allclose(value_and_grad(plan.fn), want)
    path = tmp_path / "plan.json"
    plan.to_json(path)
    loaded = remat.load_plan(path, loss, model, x, key)
    assert_tree_allclose(value_and_grad(loaded.fn), want)
    assert_tree_allclose(value_and_grad(remat.apply(loss, path)), want)


def test_plan_step_is_equinox_own_optax_step():
    """`Plan.step` takes the module whole and ``opt_state`` as Equinox makes it; one step
    equals Equinox's own loop (``filter_value_and_grad``, ``tx.update`` on
    ``eqx.filter(model, eqx.is_inexact_array)``, ``eqx.apply_updates``): bools and rates
    static, the int leaf traced and left as it is."""
    optax = pytest.importorskip("optax")
    tx = optax.adam(1e-2)
    model, x, key = make(layers=4, tokens=128)
    plan = remat.plan(loss, model, x, key, budget="80%", optimizer=tx, verbose=False)
    assert plan.rolled

    def own_step(model, opt_state):
        value, grads = eqx.filter_value_and_grad(loss)(model, x, key)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), opt_state, value

    state = tx.init(eqx.filter(model, eqx.is_inexact_array))
    want_model, want_state, want_value = own_step(model, state)
    copy = lambda t: jax.tree_util.tree_map(lambda a: jnp.copy(a) if eqx.is_array(a) else a, t)  # noqa: E731
    got_model, got_state, got_value = plan.step(copy(model), copy(state), x, key)  # donated
    assert isinstance(got_model, Model) and got_model.blocks[0].drop.p == 0.1
    arrays = lambda m: eqx.filter(m, eqx.is_array)  # noqa: E731
    assert_tree_allclose(
        (arrays(got_model), got_state, got_value), (arrays(want_model), want_state, want_value)
    )
    assert int(got_model.steps) == 0  # the int leaf passes through
    again = plan.step(got_model, got_state, x, key)  # the same compiled step, no retrace error
    assert_tree_allclose(again[2], own_step(want_model, want_state)[2])


def test_cli_measures_an_equinox_target(tmp_path, capsys):
    from remat._cli._cli import main

    path = tmp_path / "eqx_model.py"
    path.write_text(
        textwrap.dedent(
            """
            import jax, jax.numpy as jnp, equinox as eqx

            def make():
                mlp = eqx.nn.MLP(8, 1, 16, depth=2, key=jax.random.key(0))
                loss = lambda m, x: jnp.mean(jax.vmap(m)(x) ** 2)
                return loss, (mlp, jnp.ones((4, 8)))
            """
        )
    )
    assert main(["measure", f"{path}:make", "--repeats", "0"]) == 0
    assert "peak" in capsys.readouterr().out
