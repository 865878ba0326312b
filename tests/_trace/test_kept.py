"""With ``ScanChoice.kept_calls`` the planner's rewrite keeps a jitted call whole where none
of its values is saved (`remat._trace._tag.tagged_body`), and inlines it where one is;
without it, every call is inlined."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

from conftest import assert_tree_allclose
from remat._trace._jaxpr_walk import sites
from remat._trace._tag import (
    ScanChoice,
    flat_ranges,
    flatten,
    planned_scans,
    rewrite,
    tagged_body,
    value_name,
)


def loss(w, xs):
    """A scan whose body calls two jitted functions, one with a `checkpoint_name` inside."""

    def step(c, x):
        h = c @ w + x  # flattened body: dot_general 0, add 1
        a = jax.jit(lambda t: checkpoint_name(jnp.sin(t) * 2.0, "inner"))(h)  # sin 2, mul 3, name 4
        return jax.jit(jnp.tanh)(a * a), None  # mul 5, tanh 6

    return jnp.sum(jax.lax.scan(step, jnp.ones((2, 4)), xs)[0] ** 2)


ARGS = (jnp.eye(4) * 0.5, jnp.linspace(-1.0, 1.0, 3 * 2 * 4).reshape(3, 2, 4))


def jits(fn, *args) -> int:
    """The ``jit`` equations in the program, its sub-programs included."""
    return sum(s.eqn.primitive.name == "jit" for s in sites(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.fixture(scope="module")
def body():
    """The scan's info and its flattened body's equations."""
    info = planned_scans(loss, *ARGS)[0]
    return info, flatten(info.jaxpr).jaxpr.eqns


def test_the_flattened_body_matches_the_body_as_written(body):
    info, _ = body
    ranges = flat_ranges(info.jaxpr, flatten(info.jaxpr))
    assert ranges is not None and sorted(ranges.values()) == [(2, 5), (6, 7)]
    assert [e.primitive.name for e in body[1]] == [
        "dot_general", "add", "sin", "mul", "name", "mul", "tanh"
    ]  # fmt: skip


@pytest.mark.parametrize("saved, kept", [((0,), 2), ((2,), 1), ((0, 6), 1), ((3, 6), 0)])
def test_calls_holding_no_saved_value_stay_calls(body, saved, kept):
    info, _ = body
    names = tuple(value_name(0, j, 0, 1) for j in saved)
    fn = rewrite(loss, {info.position: ScanChoice(names=names, kept_calls=True)})
    base = jits(loss, *ARGS)
    assert jits(fn, *ARGS) == base - 2 + kept
    assert_tree_allclose(jax.value_and_grad(fn)(*ARGS), jax.value_and_grad(loss)(*ARGS))
    inlined = rewrite(loss, {info.position: ScanChoice(names=names)})
    assert jits(inlined, *ARGS) == base - 2


def test_a_name_inside_a_jitted_call_stays_nameable_and_is_saved(body):
    info, eqns = body
    # The program's "inner" names the product inside the first call (the planner's model
    # gives that value the user name): saving it by the planner's name saves exactly it.
    (inner,) = [e for e in eqns if e.params.get("name") == "inner"]
    j = next(j for j, e in enumerate(eqns) if e.outvars[0] is inner.invars[0])
    assert j == 3
    name = value_name(0, j, 0, 1)
    policy = jax.checkpoint_policies.save_only_these_names(name)
    fn = jax.checkpoint(tagged_body(info, [name]), policy=policy)
    consts, carry, xs = [ARGS[0]], [jnp.ones((2, 4))], [ARGS[1][0]]
    saved = [d.split(" from ")[0] for _, d in saved_residuals(fn, consts, carry, xs)]
    assert [d for d in saved if not d.startswith("from the argument")] == [f"named '{name}'"]
    assert jits(fn, consts, carry, xs) == 1  # the first call inlined, the tanh kept


def test_where_the_walk_does_not_match_the_flattened_body_every_call_is_inlined(monkeypatch):
    import remat._trace._tag as kept

    info = planned_scans(loss, *ARGS)[0]
    monkeypatch.setattr(kept, "flat_ranges", lambda closed, flat: None)
    fn = rewrite(
        loss, {info.position: ScanChoice(names=(value_name(0, 0, 0, 1),), kept_calls=True)}
    )
    assert jits(fn, *ARGS) == jits(loss, *ARGS) - 2
    assert_tree_allclose(jax.value_and_grad(fn)(*ARGS), jax.value_and_grad(loss)(*ARGS))


def test_a_name_the_planner_does_not_give_inlines_every_call(body):
    info, _ = body
    consts, carry, xs = [ARGS[0]], [jnp.ones((2, 4))], [ARGS[1][0]]
    assert jits(tagged_body(info, ["remat_s0_e0"]), consts, carry, xs) == 2
    assert jits(tagged_body(info, ["remat_s1_e0"]), consts, carry, xs) == 0  # another scan's
    assert jits(tagged_body(info, ["inner"]), consts, carry, xs) == 0
