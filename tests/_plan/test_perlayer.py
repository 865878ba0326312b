"""Per-layer plans (`remat._plan._perlayer`): chosen between the uniform plans' memory levels,
verified like any plan, and carried everywhere a plan goes (explain, policy, files, apply)."""

from __future__ import annotations

import json

import jax
import pytest

import remat
from conftest import assert_tree_allclose, mlp_stack
from remat._measure._peak import compiled_memory
from remat._plan._compile import peak_of
from remat._plan._costmodel import model_scans
from remat._plan._json import read_plan
from remat._plan._memo import saved_of
from remat._plan._milp import Node, Option, solve
from remat._plan._options import candidates
from remat._plan._perlayer import first_carry, pareto_points, period_candidates
from remat._plan._plan import plan_budgets
from remat._trace._tag import ScanChoice, planned_scans, rewrite

DATA = __import__("pathlib").Path(__file__).parent.parent / "data"


@pytest.fixture(scope="module")
def stack():
    return mlp_stack(layers=8, d=32, batch=256)


def _peak(loss, args, choice):
    step = jax.jit(jax.grad(rewrite(loss, {0: choice})))
    return compiled_memory(step.lower(*args).compile()).peak_bytes


@pytest.fixture(scope="module")
def planned(stack):
    """Plans halfway between the least memory that saves the matmul output in every layer
    (as segments: one scan of all the layers) and none."""
    loss, args = stack
    keep = ("remat_s0_e0",)
    every = _peak(loss, args, ScanChoice(names=keep, pattern=(keep,) * 8))
    none = _peak(loss, args, ScanChoice(names=()))
    return remat.plan(loss, *args, budget=(every + none) // 2, per_layer=True)


def test_a_budget_between_uniform_levels_gets_a_per_layer_plan(stack, planned):
    loss, args = stack
    (scan,) = planned.scans
    g = len(scan.pattern)
    assert scan.schedule == "per_step" and g == 8  # a save set per layer (two runs)
    assert set(map(len, scan.pattern)) == {0, 1}  # one value, in some of the layers
    assert planned.measured_peak_bytes <= planned.budget_bytes
    # Recomputes the matmul in the layers that save nothing: that fraction of what the same
    # form (period g) recomputes with nothing saved (measured on the compiled programs).
    keep = ("remat_s0_e0",)

    def flops(pattern):
        choice = ScanChoice(names=keep, pattern=pattern)
        return remat.measure(rewrite(loss, {0: choice}), *args, repeats=0).flops

    every_g, none_g = flops((keep,) * g), flops(((),) * g)
    recomputing = scan.pattern.count(()) / g
    assert planned.measured.flops == pytest.approx(every_g + recomputing * (none_g - every_g))
    nothing = remat.plan(loss, *args, budget="40%", per_layer=False)
    assert nothing.scans[0].names == () and planned.flops_ratio < nothing.flops_ratio
    # Saving the value in every layer does not fit this budget: the mix beats both uniform
    # plans there.
    every = remat.plan(loss, *args, budget="100%", per_layer=False)
    assert every.scans[0].names and every.measured_peak_bytes > planned.budget_bytes
    assert_tree_allclose(jax.grad(planned.fn)(*args), jax.grad(loss)(*args))


def test_plan_budgets_plans_per_layer_too(stack, planned):
    loss, args = stack
    (again,) = plan_budgets(
        loss, *args, budgets=[planned.budget_bytes], per_layer=True, verbose=False
    )
    assert again.scans == planned.scans
    assert again.stats.step_compiles <= 1  # the program is known


def test_of_two_plans_with_equal_flops_the_smaller_one_wins(stack):
    """Both fit 100%: the uniform plan that recomputes nothing, and the same save set in every
    layer run as segments, which keeps the first layer's input where it lives (the step's
    argument) instead of a stacked copy. Equal FLOPs: the one that saves a carry less, with
    the smaller compiled peak, is returned."""
    loss, args = stack
    uniform = remat.plan(loss, *args, budget="100%", verbose=False)
    assert "pattern" not in json.dumps(uniform.to_dict())  # a uniform plan writes none
    p = remat.plan(loss, *args, budget="100%", per_layer=True, verbose=False)
    names = uniform.scans[0].names
    assert p.scans[0].pattern == (names,) * 8
    assert p.measured.flops == uniform.measured.flops
    carry = 256 * 32 * 4  # batch x d, float32
    assert saved_of(p.measured) == saved_of(uniform.measured) - carry
    assert p.measured_peak_bytes < uniform.measured_peak_bytes
    assert p.measured_peak_bytes <= p.budget_bytes
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args))


def test_explain_shows_which_layers_save_what(planned):
    text = planned.explain(width=200)
    (scan,) = planned.scans
    g = len(scan.pattern)
    saved = next(names for names in scan.pattern if names)[0]
    saving = sorted(i for i in range(8) if scan.pattern[i % g])
    assert f"layers {','.join(map(str, saving))} save {{{saved}}}" in text
    rest = sorted(set(range(8)) - set(saving))
    assert f"layers {','.join(map(str, rest))} save nothing" in text
    assert "policy=plan.position_policy(k)" in text and "as a scan of its own" in text


def test_policy_says_what_to_use_instead(planned):
    with pytest.raises(ValueError, match=r"`Plan.policy` cannot express.*remat.apply") as err:
        planned.policy  # noqa: B018
    (scan,) = planned.scans
    text = planned.explain(width=200)  # the same lines, in the same names, as explain's
    lines = [line for line in text.splitlines() if "per layer: layers" in line]
    assert lines
    for line in lines:
        said = line.split("per layer: ")[1].split("│")[0].strip()
        assert said in str(err.value)
    for k, names in enumerate(scan.pattern):
        assert planned.position_policy(k).names == frozenset(names)
        assert planned.position_policy(k + len(scan.pattern)).names == frozenset(names)
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


def test_mixes_of_two_pareto_points_in_two_runs_of_layers():
    """Each pair of the layer's Pareto points mixed at each count of layers, the layers
    saving less first, and each point in every layer; a mix's bytes, FLOPs and transient are
    the layers' (worked from the points), less the first layer's input carry. Long scans get
    evenly spread counts."""
    from remat._plan._perlayer import counts

    loss, args = mlp_stack(layers=6, d=8, batch=8)
    models = model_scans(planned_scans(loss, *args))
    cands = candidates(models, schedules=False)
    points = pareto_points(cands[0], 6)
    assert [p.flops for p in points] == sorted(p.flops for p in points)  # fewest first
    assert (
        len(points) >= 2 and points[0].flops == 0 and points[-1].step_bytes < points[0].step_bytes
    )
    mixes = period_candidates(models, cands)
    pairs = len(points) * (len(points) - 1) // 2
    carry = 8 * 8 * 4  # batch x d, float32: every point keeps the layer's input
    assert [first_carry(p, models[0]) for p in points] == [carry] * len(points)
    assert len(mixes) == 5 * pairs + len(points)  # 1..5 of 6 layers; each point in all 6
    assert all(c.nodes == () and len(c.pattern) == c.schedule.g == 6 for c in mixes)
    a, b = points[0], points[-1]
    half = next(c for c in mixes if c.pattern == (b.saved,) * 3 + (a.saved,) * 3)
    # The first layer keeps the scan's initial carry, not a copy of it.
    assert half.option.bytes == 3 * (a.step_bytes + b.step_bytes) - carry
    same = next(c for c in mixes if c.pattern == (b.saved,) * 6)
    assert same.option.bytes == 6 * b.step_bytes - carry and same.option.flops == 6 * b.flops
    assert half.option.flops == pytest.approx(3 * (a.flops + b.flops))
    assert half.option.sliced == max(a.step_bytes, b.step_bytes)
    assert half.option.transient == max(a.transient, b.transient)
    one_of_six = next(c for c in mixes if c.pattern == (b.saved,) * 5 + (a.saved,))
    assert one_of_six.option.bytes == a.step_bytes + 5 * b.step_bytes - carry
    assert counts(6) == [1, 2, 3, 4, 5] and counts(80, most=3) == [20, 40, 60]
    assert counts(6, most=2) == [2, 4]


def test_the_per_layer_options_found_beside_the_rounds_are_those_found_at_once(stack):
    """`prepare` with ``later`` returns the uniform options and finds the per-layer ones on a
    thread (`_mixes`): completed, they are the mixes `period_candidates` gives, appended after
    the uniform options, and the program's `Knowledge` keeps the completed `Prepared`."""
    from remat._plan._calibrate import prepare
    from remat._plan._memo import Knowledge
    from remat._plan._mixes import completed, finding

    loss, args = stack
    prep = prepare(loss, args, 0, True, per_layer=True, later=True)
    assert finding(prep) and not any(c.pattern for c in prep.cands)
    know = Knowledge(prep)
    full = completed(prep, know)
    more = tuple(period_candidates(prep.models, prep.cands, prep.stored, prep.slice, prep.weight))
    assert more and full.cands == prep.cands + more
    assert full.options == prep.options + tuple(c.option for c in more)
    assert full.offsets == prep.offsets + (len(prep.nodes),) * len(more)
    assert [len(e) for e in full.option_extra] == [len(full.cands)]
    assert know.prepared is full and completed(prep, know) is full and not finding(full)


def test_a_mix_between_two_uniform_plans_is_chosen_by_the_solver():
    """Two save sets of one layer: {value} (4 bytes, no FLOPs) and {} (10 FLOPs); 8 layers. A
    budget between the uniform plans' memory (8 * 4 and 0 bytes stored) takes the mix of
    period 2: half the layers save the value, at half the FLOPs of saving nothing."""
    value = Node(bytes=4, flops=10, multiplicity=8, needed=True, group=0, option=0)
    every = Option(group=0)
    mix = Option(group=0, bytes=4 * 4, flops=4 * 10, sliced=4, transient=4)
    s = solve([value], budget_bytes=16 + 4 + 4, options=[every, mix], slice_weight=1.0)
    assert s.options == (1,) and s.saved == frozenset() and s.recompute_flops == 40.0
    assert s.slice_bytes == 4 and s.saved_bytes == 16
    s = solve([value], budget_bytes=32 + 4, options=[every, mix], slice_weight=1.0)
    assert s.options == (0,) and s.recompute_flops == 0.0  # room for the uniform plan


def test_a_mix_not_checked_alone_is_charged_its_siblings_extra():
    """What a group body keeps beyond the model, measured on mixes of one scan and period,
    is charged (their mean) to that period's mixes not yet checked; not to another period's,
    another scan's, or a uniform option."""
    from remat._plan._options import Candidate
    from remat._plan._perlayer import shared_extra
    from remat._trace._periodic import Period

    def mix(scan, g):
        return Candidate(scan, Period(g), Option(group=scan), (), False, (frozenset(),) * g)

    cands = [Candidate(0, "per_step", Option(group=0), (), False),
             mix(0, 2), mix(0, 2), mix(0, 2), mix(0, 4), mix(1, 2)]  # fmt: skip
    extra = {1: 100.0, 2: 300.0}
    assert shared_extra(cands, extra, 3) == 200.0
    assert shared_extra(cands, extra, 4) is None  # period 4: nothing measured
    assert shared_extra(cands, extra, 5) is None  # another scan
    assert shared_extra(cands, extra, 0) is None  # uniform: charged its own


def _vs_torch_gpt(**sizes):
    """The plain-JAX GPT block stack of `benchmarks/vs_torch.py` at ``sizes``: (loss, args)."""
    import importlib.util
    import sys

    bench = DATA.parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))  # vs_torch imports bench_common
    try:
        spec = importlib.util.spec_from_file_location("vs_torch", bench / "vs_torch.py")
        vs_torch = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(vs_torch)
    finally:
        sys.path.remove(str(bench))
    params = jax.tree.map(jax.numpy.asarray, vs_torch.init_params("gpt", **sizes))
    tokens = jax.numpy.asarray(vs_torch.init_inputs("gpt", **sizes))
    return vs_torch.make_jax_loss("gpt", sizes["heads"]), (params, tokens)


@pytest.mark.slow  # two plans of an 8-layer GPT: minutes on this loaded host
def test_a_per_layer_plan_never_recomputes_more_than_the_uniform_plan():
    """At 35% of this GPT the cheapest per-layer candidate (5 and 3 values saved in
    alternate layers) fits, and a uniform plan (5 values in every layer) that recomputes
    less fits too: planning with the per-layer options from the start compiled the mix, its
    checks went to other mixes, and the uniform plan was never compiled (+7.02% against
    +4.68% FLOPs). The uniform rounds run first now, and the mixes compete only against the
    plan they verified: compared on the compiled programs."""
    loss, args = _vs_torch_gpt(layers=8, d_model=64, heads=4, seq=64, batch=4, vocab=128)
    uniform = remat.plan(loss, *args, budget="35%", verbose=False)
    mixed = remat.plan(loss, *args, budget="35%", per_layer=True, verbose=False)
    assert uniform.flops_ratio > 1  # a budget that recomputes
    assert mixed.measured.flops <= uniform.measured.flops
    assert mixed.measured_peak_bytes <= mixed.budget_bytes
    assert_tree_allclose(jax.grad(mixed.fn)(*args), jax.grad(loss)(*args), scale=10)


def test_one_set_in_every_layer_as_segments_keeps_the_first_input_where_it_lives(stack):
    """The uniform plan that recomputes nothing stacks a copy of the first layer's input (the
    step's argument); the same set in every layer run as segments keeps the argument itself,
    a carry less. At a budget between the two peaks the planner returns the segments, at the
    uniform plan's FLOPs, with the peak the segments compile to."""
    loss, args = stack
    uniform = remat.plan(loss, *args, budget="100%", verbose=False)
    (scan,) = uniform.scans
    names = scan.names
    segments = rewrite(loss, {0: ScanChoice(names=names, pattern=(names,) * 8)})
    same = peak_of(remat.measure(segments, *args, repeats=0))  # the step `plan` compiles
    carry = 256 * 32 * 4  # batch x d, float32
    assert uniform.measured_peak_bytes - carry <= same < uniform.measured_peak_bytes
    budget = (same + uniform.measured_peak_bytes) // 2
    p = remat.plan(loss, *args, budget=budget, per_layer=True, verbose=False)
    (got,) = p.scans
    assert got.pattern == (names,) * 8
    assert p.measured.flops == uniform.measured.flops
    assert p.measured_peak_bytes == same <= budget
    assert_tree_allclose(jax.grad(p.fn)(*args), jax.grad(loss)(*args))


def test_a_mix_is_priced_from_two_others_of_its_sets_compiled_alone(stack):
    """Each layer moved from one save set to the other changes a mix's scan-alone memory by
    as much: two mixes of the same sets compiled alone price the others (more or fewer layers
    saving the set, and the set in every layer) within a layer's stored value of their
    compiles; another pair, or a mix not in two runs, is not priced."""
    from types import SimpleNamespace

    from remat._plan._alone import priced_mix
    from remat._plan._body import scan_memories
    from remat._plan._options import alone_key

    loss, args = stack
    (info,) = planned_scans(loss, *args)
    keep, none = ("remat_s0_e0",), ()

    def mix(saving):  # the last ``saving`` layers save ``keep``
        return ScanChoice(names=keep, pattern=(none,) * (8 - saving) + (keep,) * saving)

    counts = (2, 4, 6, 8)
    temps = [m.temp_bytes for m in scan_memories([(info, mix(c), 8) for c in counts])]
    prep = SimpleNamespace(cands=[SimpleNamespace(scan=0)] * 8)
    know = SimpleNamespace(alone={alone_key(0, mix(2)): temps[0], alone_key(1, mix(4)): temps[1]})
    layer = 256 * 32 * 4  # one matmul output of one layer, float32
    assert temps[1] - temps[0] > layer  # each layer saving it keeps more
    for c, temp in zip(counts[2:], temps[2:], strict=True):
        assert abs(priced_mix(prep, know, 2, mix(c)) - temp) < 0.1 * layer
    other = ScanChoice(names=keep, pattern=(keep,) * 4 + (none,) * 4)  # the sets swapped
    alternate = ScanChoice(names=keep, pattern=(none, keep) * 4)
    assert priced_mix(prep, know, 2, other) is None
    assert priced_mix(prep, know, 2, alternate) is None


def test_a_mix_keeps_the_larger_of_two_lines_of_its_sets(stack):
    """A mix's scan-alone memory is the larger of two lines through the memories of its two
    sets in every layer (`_twolines`): with both sets compiled alone as one run, every mix
    whose last run has two layers or more is priced within 16 KiB of its compile, the same
    from two mixes compiled alone (each of whose sets' lines lies below the other's memory),
    and with one set known its line is a floor; a lone last layer (an inlined loop) is not
    priced."""
    from remat._plan._alone import compile_alone
    from remat._plan._calibrate import prepare
    from remat._plan._memo import Knowledge
    from remat._plan._milp import Solution
    from remat._plan._twolines import sets_of

    loss, args = stack
    prep = prepare(loss, args, 0, True, per_layer=True)
    mixes = {o: c.pattern for o, c in enumerate(prep.cands) if c.pattern}
    know = Knowledge(prep)

    def solution(o):
        return Solution(saved=frozenset(), recomputed=frozenset(), recompute_flops=0.0,
                        saved_bytes=0, transient_bytes=0, options=(o,))  # fmt: skip

    compile_alone(prep, know, [(solution(o), prep.decode(solution(o))) for o in mixes])
    memory = {mixes[key[0]]: v for key, v in know.alone.items() if key[0] in mixes}
    runs = {o: len(dict.fromkeys(p)) for o, p in mixes.items()}
    last = {o: sum(s == p[-1] for s in p) for o, p in mixes.items()}
    one_run = [o for o in mixes if runs[o] == 1]
    two = [o for o in mixes if runs[o] == 2 and last[o] >= 2]
    assert len(one_run) == 2 and len(two) == 6
    kb16 = 16 * 1024

    def knowing(options):
        known = Knowledge(prep)
        known.alone = {k: v for k, v in know.alone.items() if k[0] in options}
        return known

    for given in (one_run, [two[0], two[-1]]):
        known = knowing(given)
        for o in two:
            low, high = sets_of(prep, known, o).bounds(mixes[o])
            assert abs(low - memory[mixes[o]]) < kb16 and abs(high - memory[mixes[o]]) < kb16
    more = next(o for o in one_run if len(mixes[o][0]) == 2)  # the set saving more
    for o in two:
        low, high = sets_of(prep, knowing([more]), o).bounds(mixes[o])
        assert high is None and low <= memory[mixes[o]] + kb16
    (lone,) = [o for o in mixes if runs[o] == 2 and last[o] == 1]
    assert sets_of(prep, knowing(one_run), lone).bounds(mixes[lone]) == (None, None)


def _first_plan(loss, args, budget, monkeypatch, over=False, first_over=False):
    """A program's first per-layer plan (an empty `_memo`); with ``over``, every per-layer
    step compiled in the uniform candidate's place measures a byte over the budget (with
    ``first_over``, only the first)."""
    import collections
    import dataclasses

    from remat._plan import _first, _memo, _rounds

    monkeypatch.setattr(_memo, "_MEMORY", collections.OrderedDict())
    over = over or first_over
    if over:
        verify = _rounds._verify
        done = []

        def over_budget(prep, know, key, choice, margin, alone=None, **kw):
            verify(prep, know, key, choice, margin, alone=alone, **kw)
            if first_over and done:
                return
            done.append(key)
            known = know.measured[key]
            measured = dataclasses.replace(known.measured, peak_bytes=budget + 1)
            know.measured[key] = dataclasses.replace(known, measured=measured)

        real = _first.instead
        monkeypatch.setattr(_first, "instead", lambda *a: real(*a[:4], over_budget, *a[5:]))
    return remat.plan(loss, *args, budget=budget, per_layer=True, verbose=False)


def test_the_per_layer_plan_is_compiled_in_the_uniform_ones_place(stack, planned, monkeypatch):
    """A program's first per-layer plan compiles the per-layer candidate that beats the
    uniform one the rounds were about to compile in its place (`_first.instead`): the plan
    the uniform-first order gives (the uniform plan compiled, then the mix), one step
    compile fewer (the un-checkpointed step and the plan's). Where that candidate measures
    over the budget, the uniform one is compiled after it, and a plan that fits returned."""
    from remat._plan import _first

    loss, args = stack
    budget = planned.budget_bytes
    first = _first_plan(loss, args, budget, monkeypatch)
    assert first.scans[0].pattern and first.stats.step_compiles == 2
    with monkeypatch.context() as m:  # the uniform candidate compiled first, as before
        m.setattr(_first, "instead", lambda *a: None)
        before = _first_plan(loss, args, budget, m)
    assert before.stats.step_compiles == 3
    assert (first.scans, first.measured.flops, first.measured_peak_bytes) == (
        before.scans, before.measured.flops, before.measured_peak_bytes)  # fmt: skip
    fallback = _first_plan(loss, args, budget, monkeypatch, over=True)
    assert fallback.stats.step_compiles >= 3  # the mix, the uniform candidate, ...
    assert fallback.scans != first.scans and fallback.measured_peak_bytes <= budget


def test_a_per_layer_step_over_the_budget_is_followed_by_the_next_one(stack, planned, monkeypatch):
    """Where the per-layer step compiled in the uniform candidate's place measures over the
    budget, the next per-layer candidate is compiled in its place (`_first.RETRIES`), looked
    for with the memory outside the scans known before the miss (a per-layer step keeps
    beyond its scans what its own pattern does): the plan the uniform rounds would reach
    after it, one step compile sooner than with no retry."""
    from remat._plan import _first, _search

    loss, args = stack
    budget = planned.budget_bytes
    margins = []
    search = _search.cheaper_candidate

    def looking(prep, know, *a, **kw):
        margins.append(know.margin)
        return search(prep, know, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(_first, "cheaper_candidate", looking)
        retried = _first_plan(loss, args, budget, m, first_over=True)
    assert len(margins) == 2 and margins[1] == margins[0]  # the margin before the miss
    assert retried.scans[0].pattern and retried.measured_peak_bytes <= budget
    with monkeypatch.context() as m:  # no retry: the uniform candidate, then the mix
        m.setattr(_first, "RETRIES", 0)
        once = _first_plan(loss, args, budget, m, first_over=True)
    assert once.stats.step_compiles == retried.stats.step_compiles + 1
    assert (retried.scans, retried.measured.flops, retried.measured_peak_bytes) == (
        once.scans, once.measured.flops, once.measured_peak_bytes)  # fmt: skip


def test_the_spread_outside_the_scans_is_the_uniform_steps():
    """`_spread.spread`, how far the memory outside the scans has differed between the steps
    measured (which uniform candidates predicted over by less are compiled, and past which
    the rounds step back), leaves out a per-layer step's: it holds what its pattern keeps
    beyond its scans alone as well (hand-worked: uniform points 100 and 130, first 110)."""
    from types import SimpleNamespace as N

    from remat._plan._memo import Known, margins
    from remat._plan._spread import spread

    def known(alone, peak, pattern=None):
        choice = N(choices={0: ScanChoice(names=("a",), pattern=pattern)})
        return Known(choice, N(peak_bytes=peak, peak_source="compiled"), peak, alone)

    mixed = (("a",), ()) * 4
    prep = N(margin=100.0)
    know = N(measured={1: known(1000.0, 1130), 2: known(900.0, 1200, mixed)})
    assert sorted(margins(prep, know)) == [100.0, 130.0, 300.0]  # every step measured
    assert sorted(margins(prep, know, uniform=True)) == [100.0, 130.0]
    assert spread(prep, know, 110.0) == 30.0  # not 200: the per-layer step's 300 left out


def test_a_lone_last_layers_scan_alone_waits_for_the_forward_pass(stack):
    """A run of one layer is no loop: its backward pass could start from the scan-alone
    program's cotangent inputs before the forward loop runs, which the step cannot (its
    cotangents come from the loss). The program ties them to the forward pass's outputs, so
    its loop phases are read (`loop_phases`: a forward loop wholly before a backward one), as
    for a mix of two loops."""
    from remat._plan._body import scan_memories

    loss, args = stack
    (info,) = planned_scans(loss, *args)
    keep, none = ("remat_s0_e0",), ()
    lone = ScanChoice(names=keep, pattern=(none,) * 7 + (keep,))
    two = ScanChoice(names=keep, pattern=(none,) * 6 + (keep,) * 2)
    got = scan_memories([(info, lone, 8), (info, two, 8)], phases=True)
    assert [m.phases is not None for m in got] == [True, True]
