"""`remat.plan`: plans fit their budget, keep gradients exact, reload, and refuse changes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose, mlp_stack
from remat._core._budget import read_budget


def recurrence():
    """A 64-step tanh recurrence (batch 4, width 32), and its (w, xs)."""

    def loss(w, xs):
        h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros((4, 32)), xs)
        return jnp.sum(h**2)

    w = jax.random.normal(jax.random.key(1), (32, 32)) / 6
    xs = jax.random.normal(jax.random.key(2), (64, 4, 32))
    return loss, (w, xs)


@pytest.fixture(scope="module")
def stack():
    return mlp_stack()


@pytest.fixture(scope="module")
def plans(stack):
    loss, args = stack
    budgets = (1.0, 0.6, 0.45)
    return dict(zip(budgets, remat.plan_budgets(loss, *args, budgets=budgets), strict=True))


def test_plans_fit_and_keep_gradients(stack, plans):
    loss, args = stack
    ref_value, ref_grad = jax.value_and_grad(loss)(*args)
    peaks = []
    for budget, p in plans.items():
        assert p.measured_peak_bytes <= p.budget_bytes
        assert p.budget_bytes == int(budget * p.baseline_peak_bytes)
        value, grad = jax.value_and_grad(p.fn)(*args)
        assert_tree_allclose(value, ref_value)
        assert_tree_allclose(grad, ref_grad)
        peaks.append(p.measured_peak_bytes)
    # The measured peak never rises as the budget falls.
    assert peaks == sorted(peaks, reverse=True)


def test_tight_budget_recomputes_and_loose_does_not(plans):
    loose, tight = plans[1.0], plans[0.45]
    assert loose.flops_ratio == pytest.approx(1.0)
    assert tight.flops_ratio > 1.0  # recomputation happened in the compiled program
    assert tight.measured_peak_bytes < loose.measured_peak_bytes
    assert all(s.recompute_flops > 0 for s in tight.scans)


def test_plan_saves_exactly_its_names(stack, plans):
    """What JAX keeps for the backward pass is the plan's named values (and carries/args)."""
    _, args = stack
    carry_shape = args[1].shape
    for p in plans.values():
        names = {n for s in p.scans for n in s.names}
        for r in p.measured.residuals:
            if r.name is not None and r.name not in names:
                # Only the carry (named after the equation that made it) may be kept besides.
                assert r.shape == carry_shape and r.multiplicity == 8, r
        if p.scans[0].schedule == "per_step":
            saved = {v.name for v in p.scans[0].saved if v.primitive != "carry"}
            assert saved == set(p.scans[0].names)


def test_predicted_peak_close_to_measured(plans):
    for p in plans.values():
        assert abs(p.predicted_peak_bytes - p.measured_peak_bytes) <= 0.1 * p.measured_peak_bytes


def test_explain_names_every_saved_value(plans):
    p = plans[0.6]
    text = p.explain()
    for v in p.scans[0].saved:
        assert v.name in text
    assert "predicted peak" in text and "measured peak" in text and "schedule" in text


def test_infeasible_budget_gives_the_numbers(stack):
    loss, args = stack
    with pytest.raises(remat.InfeasibleBudget) as err:
        remat.plan(loss, *args, budget="5%", max_rounds=1)
    e = err.value
    assert e.smallest_peak_bytes > e.budget_bytes
    assert str(e.budget_bytes) in str(e) and str(e.smallest_peak_bytes) in str(e)
    assert "`remat.plan`" in str(e) and "5%" in str(e)


def test_json_round_trip(stack, plans, tmp_path):
    loss, args = stack
    p = plans[0.45]
    path = p.to_json(tmp_path / "plan.json")
    q = remat.load_plan(path, loss, *args)
    assert q.scans == p.scans
    assert q.measured == p.measured
    assert q.predicted_peak_bytes == p.predicted_peak_bytes
    assert q.fingerprint == p.fingerprint
    assert_tree_allclose(jax.grad(q.fn)(*args), jax.grad(p.fn)(*args))
    assert json.loads(path.read_text())["format"] == 2


def test_changed_program_is_refused(stack, plans, tmp_path):
    loss, args = stack
    path = plans[0.6].to_json(tmp_path / "plan.json")
    changed, _ = mlp_stack(act=jnp.sin)
    with pytest.raises(ValueError, match="different program"):
        remat.load_plan(path, changed, *args)
    other_shape = mlp_stack(batch=64)[1]
    with pytest.raises(ValueError, match="different program"):
        remat.load_plan(path, loss, *other_shape)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        remat.load_plan(tmp_path / "bad.json", loss, *args)


def test_long_recurrence_uses_a_sublinear_schedule():
    """Below the memory of one carry per step, only Nested/Binomial can fit."""
    loss, (w, xs) = recurrence()
    # the least per_step reaches: a carry per step
    floor = smallest_reached(loss, (w, xs), schedules=False, max_rounds=1)
    budget = floor - (64 * 4 * 32 * 4) // 4
    p = remat.plan(loss, w, xs, budget=budget)
    assert p.scans[0].schedule != "per_step"
    assert p.measured_peak_bytes <= budget
    assert_tree_allclose(jax.grad(p.fn)(w, xs), jax.grad(loss)(w, xs), scale=10)


def smallest_reached(loss, args, **kw) -> int:
    """The smallest peak the planner reaches (`remat.InfeasibleBudget.smallest_peak_bytes`),
    asked for the step's own arguments and outputs: a budget below those (1 KiB) stops
    before searching and names them (``floor_bytes``)."""
    with pytest.raises(remat.InfeasibleBudget) as err:
        remat.plan(loss, *args, budget=1024, verbose=False, **kw)
    floor = err.value.floor_bytes
    assert floor is not None and err.value.smallest_peak_bytes == floor
    with pytest.raises(remat.InfeasibleBudget) as err:
        remat.plan(loss, *args, budget=floor, verbose=False, **kw)
    assert err.value.floor_bytes is None and err.value.smallest_peak_bytes > floor
    return err.value.smallest_peak_bytes


def test_errors():
    with pytest.raises(ValueError, match="found no `scan`"):
        remat.plan(lambda x: jnp.sum(jnp.sin(x)), jnp.ones(3), budget=1.0)
    with pytest.raises(ValueError, match="budget"):
        remat.plan(lambda x: jnp.sum(jnp.sin(x)), jnp.ones(3), budget="lots")
    with pytest.raises(TypeError, match="not callable"):
        remat.plan(3, jnp.ones(3), budget=1.0)


TARGET = """
import sys
sys.path.insert(0, {tests!r})
from test_plan import mlp_stack

def make():
    return mlp_stack()
"""


def test_cli_plan(tmp_path, capsys):
    from remat._cli._cli import main

    target = tmp_path / "target.py"
    target.write_text(TARGET.format(tests=str(__import__("pathlib").Path(__file__).parent)))
    assert main(["plan", f"{target}:make", "--budget", "60%", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "predicted peak" in out and (tmp_path / "plan.json").is_file()
    loss, args = mlp_stack()
    assert remat.load_plan(tmp_path / "plan.json", loss, *args).budget_bytes > 0
    assert main(["plan", f"{target}:make", "--budget", "1%", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "arguments and outputs alone" in err


def test_two_scans_share_one_budget():
    """Two stacks of different widths: one MILP chooses for both within one budget."""

    def loss(params, x):
        a, b = params
        h, _ = jax.lax.scan(lambda h, w: (h + jnp.tanh(h @ w), None), x, a)
        h = h @ jnp.ones((16, 32)) * 0.1
        h, _ = jax.lax.scan(lambda h, w: (h + jnp.sin(h @ w), None), h, b)
        return jnp.mean(h**2)

    params = (
        jax.random.normal(jax.random.key(3), (4, 16, 16)) / 4,
        jax.random.normal(jax.random.key(4), (6, 32, 32)) / 6,
    )
    x = jax.random.normal(jax.random.key(5), (128, 16))
    p = remat.plan(loss, params, x, budget=0.7, schedules=False)
    assert [s.position for s in p.scans] == [0, 1]
    assert [s.length for s in p.scans] == [4, 6]
    assert p.measured_peak_bytes <= p.budget_bytes
    assert_tree_allclose(jax.grad(p.fn)(params, x), jax.grad(loss)(params, x))


def test_model_is_deterministic(stack):
    """Same program, same cost model and the same MILP answer (no compiles needed)."""
    from remat._plan._costmodel import model_scans
    from remat._plan._milp import solve
    from remat._trace._tag import planned_scans

    loss, args = stack
    first, second = (model_scans(planned_scans(loss, *args)) for _ in range(2))
    assert first == second
    nodes = first[0].nodes()
    needed = [v for v in first[0].values if v.needed]
    assert needed and all(v.saveable or v.primitive == "carry" for v in needed)
    budget = sum(n.bytes * n.multiplicity for n in nodes) / 3
    assert solve(nodes, budget) == solve(nodes, budget)


def test_falls_back_to_a_calibration_point(stack, monkeypatch):
    """If the solver finds nothing, the calibration point that fits (nothing saved: every
    step recomputed) is compiled and returned; below its compiled peak nothing fits."""
    from remat._plan import _rounds, _search, _settled
    from remat._plan._compile import light_peak
    from remat._plan._plan import knowledge
    from remat._trace._tag import rewrite

    loss, args = stack
    # the stack's preparation, as `plans` left it in the planner's memory (or made again)
    prep = knowledge(loss, args, 0, True, None).prepared
    _, (nothing, _) = prep.calibration[:2]
    assert nothing.scans[0].names == ()
    peak_none = light_peak(rewrite(loss, nothing.choices), args, 0)
    monkeypatch.setattr(_rounds, "solve", lambda *a, **k: None)
    monkeypatch.setattr(_search, "solve", lambda *a, **k: None)
    monkeypatch.setattr(_settled, "solve", lambda *a, **k: None)
    p = _rounds.plan_prepared(prep, read_budget(peak_none + 1))
    assert p.scans[0].names == () and p.measured_peak_bytes == peak_none
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args))
    with pytest.raises(remat.InfeasibleBudget):
        _rounds.plan_prepared(prep, read_budget(peak_none - 1))


def test_cost_model_counts_matmul_flops_and_fusible_values(stack):
    # Body: h + tanh(h @ w1) @ w2 with h (128, 16), w1 (16, 64), w2 (64, 16).
    from remat._plan._costmodel import model_scans
    from remat._trace._tag import planned_scans

    loss, args = stack
    (model,) = model_scans(planned_scans(loss, *args))
    by_primitive = {}
    for v in model.values:
        by_primitive.setdefault(v.primitive, []).append(v)
    first, second = by_primitive["dot_general"]
    # FLOPs are what the measured HLO counts: matmuls exactly, elementwise ops nothing.
    assert first.flops == 2 * 128 * 16 * 64 and second.flops == 2 * 128 * 64 * 16
    assert model.step_flops == first.flops + second.flops
    (tanh,) = by_primitive["tanh"]
    (add,) = by_primitive["add"]
    assert tanh.flops == 0 and add.flops == 0
    # A matmul's output, and a value a matmul reads (tanh's, the second matmul's operand),
    # are materialised when recomputed; the residual add is fused into its consumers.
    assert not first.fusible and not second.fusible and not tanh.fusible
    assert add.fusible


def test_calibrate3_clamps_a_negative_slice_weight():
    # Exact through the points: base 5, slice weight -0.5, transient weight 1. A negative
    # slice weight is clamped to 0; base and transient weight are then fitted by least
    # squares to peak - stored = (0, 24.5, 6.5) at transient (0, 20, 4):
    #   3 b + 24 w = 31,  24 b + 416 w = 516  ->  w = 268 / 224, b = (31 - 24 w) / 3.
    from remat._plan._fit import calibrate3
    from remat._plan._options import Choice

    def c(stored, sliced, transient):
        return Choice({}, (), 0.0, 0.0, stored=stored, sliced=sliced, transient=transient)

    points = [(c(80, 10, 0), 80.0), (c(8, 1, 20), 32.5), (c(40, 5, 4), 46.5)]
    base, stored, slice_weight, weight = calibrate3(points)
    assert (stored, slice_weight) == (1.0, 0.0)
    assert weight == pytest.approx(268 / 224)
    assert base == pytest.approx((31 - 24 * 268 / 224) / 3)
    # Three points on one line do not determine the fit.
    assert calibrate3([(c(1, 1, 1), 3.0), (c(2, 2, 2), 6.0), (c(3, 3, 3), 9.0)]) is None


def test_schedules_are_charged_what_they_keep_alone():
    """A `Nested`, `Binomial` or per-layer (``Period``) candidate is checked on its scan
    compiled alone: from then on its option is charged the difference, so the model
    reproduces the checked peak."""
    from remat._plan import _alone, _calibrate, _options
    from remat._plan._memo import Knowledge
    from remat._plan._milp import Solution

    loss, args = recurrence()
    prep = _calibrate.prepare(loss, args, 0, True, per_layer=True)
    know = Knowledge(prep)
    scheduled = [o for o, c in enumerate(prep.cands) if c.schedule != "per_step"]
    # Per-layer mixes of the layer's two Pareto points: 4, 8, ..., 60 of its 64 steps; and
    # each point in every step, run as segments (each keeps the step's input carry).
    assert [type(prep.cands[o].schedule).__name__ for o in scheduled] == (
        ["Nested"] + ["Binomial"] * 4 + ["Period"] * (15 + 2)
    )
    scheduled = scheduled[:8]  # the mixes after the third are charged as the second and third
    (fit,) = prep.scan_fits
    periods = set()
    for o in scheduled:
        cand = prep.cands[o]
        block = range(prep.offsets[o], prep.offsets[o] + len(cand.nodes))
        saved = {i for i in block if not prep.nodes[i].recomputable}
        solution = Solution(frozenset(saved), frozenset(set(block) - saved), 0.0, 0, 0, (o,))
        choice = _options.decode(solution, prep.cands, prep.offsets, prep.models, prep.weight,
                                prep.stored, prep.slice)  # fmt: skip
        alone, recharged = _alone.check_alone(prep, know, solution, choice)
        assert o in know.option_extra
        # A mix after the first was charged its sibling's: solved again only if that charge
        # was off.
        assert recharged or cand.schedule in periods
        periods.add(cand.schedule)
        stored, sliced, transient = _alone.scan_terms(prep, solution, o)
        charged = _alone.charge(cand.option, know.option_extra[o], prep.stored, prep.weight)
        own = stored - cand.option.bytes
        model = fit.fixed + prep.stored * (own + charged.bytes)
        model += prep.slice * sliced + prep.weight * max(transient, charged.transient)
        b = prep.baseline
        outside = b.argument_bytes + b.output_bytes - b.alias_bytes  # the step's own
        assert model + outside == pytest.approx(alone, rel=1e-6, abs=64)
    # With the charges, a plan below the per-step floor is predicted within 10% (the step
    # is 64 KiB: a few KiB outside the scan are a large fraction).
    smallest = smallest_reached(loss, args, schedules=False, max_rounds=1)
    p = remat.plan(loss, *args, budget=int(smallest * 0.9), verbose=False)
    assert p.scans[0].schedule != "per_step" and p.measured_peak_bytes <= p.budget_bytes
    assert abs(p.predicted_peak_bytes - p.measured_peak_bytes) <= 0.1 * p.measured_peak_bytes


def test_binomial_steps_save_everything():
    """A planned `Binomial` scan runs its steps under `everything_saveable`: the same compiled
    memory and gradients as `remat.apply` with the named strategy ``everything``."""
    from remat._plan._compile import light_peak
    from remat._trace._tag import ScanChoice, planned_scans, rewrite

    loss, args = recurrence()
    (info,) = planned_scans(loss, *args)
    for s in (1, 2):
        planned = rewrite(
            loss, {info.position: ScanChoice(names=("x",), schedule=remat.Binomial(s))}
        )
        named = remat.apply(loss, remat.Strategy("everything", schedule=remat.Binomial(s)))
        assert light_peak(planned, args, 0) == light_peak(named, args, 0)
        assert_tree_allclose(jax.grad(planned)(*args), jax.grad(loss)(*args), scale=10)


def test_smallest_budget_goes_below_every_named_strategy():
    """Asked for 1 byte the planner names the step's arguments and outputs (no plan goes
    under them); asked for those, it reports the smallest peak it reached; that budget is
    then met, at or below the smallest peak of any named strategy with any schedule."""
    from remat._plan._calibrate import prepare
    from remat._plan._compile import compile_measure, peak_of
    from remat._plan._rounds import plan_prepared

    loss, args = recurrence()
    prep = prepare(loss, args, 0, True)
    with pytest.raises(remat.InfeasibleBudget) as below:
        plan_prepared(prep, read_budget(1))
    b = prep.baseline
    assert below.value.floor_bytes == b.argument_bytes + b.output_bytes - b.alias_bytes
    with pytest.raises(remat.InfeasibleBudget) as err:
        plan_prepared(prep, read_budget(below.value.floor_bytes))
    smallest = err.value.smallest_peak_bytes
    p = plan_prepared(prep, read_budget(smallest))
    assert p.measured_peak_bytes <= smallest
    named = min(
        peak_of(
            compile_measure(
                remat.apply(loss, remat.Strategy(pol, schedule=sch)), args, 0, "named", None
            )
        )
        for pol in ("full", "dots", "everything")
        for sch in ("per_step", remat.Nested(2), remat.Binomial(1), remat.Binomial(2))
    )
    assert p.measured_peak_bytes <= named
    assert isinstance(p.scans[0].schedule, remat.Binomial)
    assert "saves all its residuals (everything_saveable)" in " ".join(p.explain().split())
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args), scale=10)


def test_infeasible_names_the_scans_inside_planned_scans():
    """Flax's `remat_scan` form: an outer scan whose checkpointed body runs an inner scan
    with an unchecked body. The planner plans the outer scan only, so the inner scan's
    residuals bound what it reaches; the error says so, and the way it names reaches less."""

    def loss(ws, x):
        def inner(h, w):
            return h + jnp.tanh(jnp.tanh(h @ w[0]) @ w[1]), None

        def outer(h, w):
            return jax.lax.scan(inner, h, w)[0], None

        return jnp.sum(jax.lax.scan(jax.checkpoint(outer), x, ws)[0] ** 2)

    k1, k2 = jax.random.split(jax.random.key(0))
    ws = (jax.random.normal(k1, (2, 4, 16, 64)) / 4, jax.random.normal(k2, (2, 4, 64, 16)) / 8)
    x = jnp.ones((64, 16))
    with pytest.raises(remat.InfeasibleBudget) as err:
        remat.plan(loss, ws, x, budget=0.7, schedules=False, verbose=False)
    assert "leaves the scans inside them as written (the 4-step scan inside scan 0;" in str(
        err.value
    )
    every = remat.measure(loss, ws, x, strategy="full", override=True, repeats=0)
    assert every.peak_bytes < err.value.smallest_peak_bytes
    assert every.peak_bytes <= err.value.budget_bytes
