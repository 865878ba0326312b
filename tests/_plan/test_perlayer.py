"""Per-layer plans (`remat._plan._perlayer`): chosen between the uniform plans' memory levels,
verified like any plan, and carried everywhere a plan goes (explain, policy, files, apply)."""

from __future__ import annotations

import json

import jax
import pytest

import remat
from conftest import assert_tree_allclose, mlp_stack
from remat._plan._costmodel import model_scans
from remat._plan._json import read_plan
from remat._plan._milp import Node, Option, solve
from remat._plan._perlayer import period_candidates
from remat._plan._plan import plan_budgets
from remat._trace._tag import planned_scans

DATA = __import__("pathlib").Path(__file__).parent.parent / "data"


@pytest.fixture(scope="module")
def stack():
    return mlp_stack(layers=8, d=32, batch=256)


@pytest.fixture(scope="module")
def planned(stack):
    """Plans at a budget between saving the matmul output in every layer and in none."""
    loss, args = stack
    return remat.plan(loss, *args, budget="70%", per_layer=True)


def test_a_budget_between_uniform_levels_gets_a_per_layer_plan(stack, planned):
    loss, args = stack
    (scan,) = planned.scans
    assert scan.schedule == "per_step" and len(scan.pattern) == 2
    assert sorted(map(len, scan.pattern)) == [0, 1]  # one value, in every other layer
    assert planned.measured_peak_bytes <= planned.budget_bytes
    # Recomputes the matmul in half the layers: half of a uniform "nothing saved" plan's extra.
    nothing = remat.plan(loss, *args, budget="40%", per_layer=True)
    assert nothing.scans[0].pattern == () and nothing.scans[0].names == ()
    assert planned.flops_ratio - 1 == pytest.approx((nothing.flops_ratio - 1) / 2)
    assert_tree_allclose(jax.grad(planned.fn)(*args), jax.grad(loss)(*args))


def test_plan_budgets_plans_per_layer_too(stack, planned):
    loss, args = stack
    (again,) = plan_budgets(loss, *args, budgets=["70%"], per_layer=True, verbose=False)
    assert again.scans == planned.scans
    assert again.stats.step_compiles <= 1  # the program is known


def test_a_uniform_plan_stays_uniform(stack):
    loss, args = stack
    p = remat.plan(loss, *args, budget="100%", per_layer=True)
    assert all(s.pattern == () for s in p.scans)
    assert "pattern" not in json.dumps(p.to_dict())


def test_explain_shows_which_layers_save_what(planned):
    text = planned.explain(width=200)
    (scan,) = planned.scans
    saved = next(names for names in scan.pattern if names)[0]
    at = next(k for k, names in enumerate(scan.pattern) if names)
    assert f"layers {','.join(map(str, range(at, 8, 2)))} save {{{saved}}}" in text
    assert f"layers {','.join(map(str, range(1 - at, 8, 2)))} save nothing" in text
    assert "plan.position_policy(k)" in text


def test_policy_says_what_to_use_instead(planned):
    with pytest.raises(ValueError, match=r"`Plan.policy` cannot express.*remat.apply"):
        planned.policy  # noqa: B018
    (scan,) = planned.scans
    for k, names in enumerate(scan.pattern):
        assert planned.position_policy(k).names == frozenset(names)
        assert planned.position_policy(k + 2).names == frozenset(names)
    with pytest.raises(ValueError, match="position_policy"):
        planned.position_policy(-1)


def test_the_plan_file_round_trips_and_applies(stack, planned, tmp_path):
    loss, args = stack
    path = planned.to_json(tmp_path / "plan.json")
    again = read_plan(path)
    assert again.scans == planned.scans
    applied = remat.apply(loss, path)
    assert_tree_allclose(jax.grad(applied)(*args), jax.grad(loss)(*args))
    data = json.loads(path.read_text())
    data["scans"][0]["pattern"] = [["x"], []]
    del data["checksum"]
    data["format"] = 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="saves other names"):
        read_plan(bad)


def test_an_old_plan_file_without_a_pattern_loads():
    for name in ("plan_v1_binomial.json", "plan_v1_nested.json"):
        assert "pattern" not in (DATA / name).read_text()
        plan = read_plan(DATA / name)
        assert all(s.pattern == () for s in plan.scans)


def test_candidates_per_period_divide_the_length():
    loss, args = mlp_stack(layers=6, d=8, batch=8)
    (model,) = model_scans(planned_scans(loss, *args))
    assert [c.schedule.g for c in period_candidates([model])] == [2]  # the planner's default
    cands = period_candidates([model], most=4)
    assert [c.schedule.g for c in cands] == [2, 3]
    for cand in cands:
        g = cand.schedule.g
        assert len(cand.nodes) == g * len(model.values)
        assert {n.multiplicity for n in cand.nodes} == {6 // g}
        assert {n.group for n in cand.nodes} == set(range(g))  # a transient per position
    assert period_candidates([model], enabled=False) == []


def test_the_positions_of_a_per_layer_option_are_ordered_by_saved_bytes():
    """Two positions of one option, a needed value each (4 steps, 10 FLOPs, 4 bytes); room to
    save one of them: the first position saves it (the other order is the same plan)."""

    def position(group):
        return Node(bytes=4, flops=10, multiplicity=4, repeats=4, needed=True, group=group,
                    option=0)  # fmt: skip

    s = solve([position(0), position(1)], budget_bytes=16 + 4, options=[Option(group=0)])
    assert s.saved == frozenset({0}) and s.recomputed == frozenset({1})
    assert s.recompute_flops == 40.0
