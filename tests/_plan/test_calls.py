"""A compiled candidate over the budget by at most `_calls.CALLS_BAND`, cheaper than every
plan that fits, is compiled once more with the scan body's jitted calls that hold no saved
value kept whole (`_calls.near_miss`): the same save set, another program for XLA."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from conftest import assert_tree_allclose
from remat._plan import _calls
from remat._plan._calibrate import prepare
from remat._plan._memo import Knowledge, Known, choice_key
from remat._plan._options import fixed_choice
from remat._trace._tag import rewrite


def loss(w, xs):
    def step(c, x):
        h = c @ w + x
        return jax.jit(jnp.tanh)(jax.jit(jnp.sin)(h) * 2.0), None

    return jnp.sum(jax.lax.scan(step, jnp.ones((2, 4)), xs)[0] ** 2)


ARGS = (jnp.eye(4) * 0.5, jnp.linspace(-1.0, 1.0, 3 * 2 * 4).reshape(3, 2, 4))


@pytest.fixture(scope="module")
def prepared():
    prep = prepare(loss, ARGS, 0, False)
    per_step = [o for o, c in enumerate(prep.cands) if c.schedule == "per_step"]
    nothing = fixed_choice(prep.cands, prep.offsets, prep.models, per_step, save=False)
    return prep, nothing


def test_the_kept_form_saves_the_same_values_and_computes_the_same(prepared):
    prep, nothing = prepared
    kept = _calls.kept_form(prep, nothing)
    assert kept is not None and choice_key(kept) != choice_key(nothing)
    ((_, scan),) = kept.choices.items()
    assert scan.kept_calls and scan.names == next(iter(nothing.choices.values())).names
    assert all(s.kept_calls for s in kept.scans)
    fn = rewrite(loss, kept.choices)
    assert_tree_allclose(jax.value_and_grad(fn)(*ARGS), jax.value_and_grad(loss)(*ARGS))


def test_a_body_without_calls_has_no_kept_form():
    def plain(w, xs):
        return jnp.sum(jax.lax.scan(lambda c, x: (jnp.tanh(c @ w + x), None), xs[0], xs)[0])

    prep = prepare(plain, ARGS, 0, False)
    per_step = [o for o, c in enumerate(prep.cands) if c.schedule == "per_step"]
    choice = fixed_choice(prep.cands, prep.offsets, prep.models, per_step, save=False)
    assert _calls.kept_form(prep, choice) is None


def _known(prep, choice, peak, flops):
    measured = dataclasses.replace(prep.baseline, peak_bytes=int(peak), flops=float(flops))
    return Known(choice, measured, int(peak))


@pytest.mark.parametrize("over, compiled", [(0.0005, 1), (0.002, 0)])
def test_only_a_near_miss_cheaper_than_every_fit_is_compiled_with_its_calls_kept(
    prepared, over, compiled
):
    prep, nothing = prepared
    budget = 10**6
    know = Knowledge(prep)
    everything = fixed_choice(prep.cands, prep.offsets, prep.models, [0], save=True)
    dear = 10 * prep.baseline.flops  # the plan that fits recomputes more
    know.measured[choice_key(everything)] = _known(prep, everything, 0.9 * budget, dear)
    know.measured[choice_key(nothing)] = _known(prep, nothing, budget * (1 + over), 0)
    verified = []
    n = _calls.near_miss(prep, know, budget, lambda _: None,
                         lambda key, choice: verified.append((key, choice)))  # fmt: skip
    assert n == len(verified) == compiled
    if compiled:
        ((key, choice),) = verified
        assert key == choice_key(_calls.kept_form(prep, nothing))
        assert all(s.kept_calls for s in choice.choices.values())


def test_a_plan_with_its_calls_kept_says_so_in_its_file(tmp_path):
    import remat
    from remat._plan._json import read_plan, scan_choices

    plan = remat.plan(loss, *ARGS, budget=1.0, verbose=False)
    kept = dataclasses.replace(
        plan, scans=tuple(dataclasses.replace(s, kept_calls=True) for s in plan.scans)
    )
    for p, name in ((plan, "inlined.json"), (kept, "kept.json")):
        p.to_json(tmp_path / name)
    assert "kept_calls" not in (tmp_path / "inlined.json").read_text()  # written where set
    read = read_plan(tmp_path / "kept.json")
    assert [s.kept_calls for s in read.scans] == [True]
    assert all(c.kept_calls for c in scan_choices(read).values())
    applied = remat.apply(loss, str(tmp_path / "kept.json"))
    assert_tree_allclose(jax.value_and_grad(applied)(*ARGS), jax.value_and_grad(loss)(*ARGS))
    inlined = remat.apply(loss, str(tmp_path / "inlined.json"))
    assert _jits(applied) > _jits(inlined) == 0  # the calls run whole only as the file says


def _jits(fn) -> int:
    from remat._trace._jaxpr_walk import sites

    return sum(s.eqn.primitive.name == "jit" for s in sites(jax.make_jaxpr(fn)(*ARGS).jaxpr))
