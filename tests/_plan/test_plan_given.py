"""Strategies the caller gives (`remat.plan`'s ``strategies``) compete with the plan's own
candidates by their compiled FLOPs.

Near a TPU chip's memory the compiler recomputes values of its own accord, by amounts no cost
model sees (docs/tpu.md), so the model's cheapest candidate can compile dearer than a save set
it ranks below. The CPU backend never does that; here a fake compiler adds the same FLOPs to
every step the planner compiles except the one that saves MaxText's ``save_qkv_proj`` names.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import pytest

import remat
from conftest import assert_tree_allclose
from remat._models._maxtext import PRESETS, make_decoder
from remat._plan import _dearer, _memo, _rounds
from remat._plan._compile import peak_of
from remat._plan._memo import choice_key
from remat._plan._named import given_choice

QKV = "names:" + ",".join(PRESETS["save_qkv_proj"])
SIZES = dict(layers=2, d_model=32, heads=2, mlp_dim=64, seq=16, batch=2, vocab=64)


@pytest.fixture(scope="module")
def decoder():
    loss, args = make_decoder(None, SIZES)
    return loss, args, remat.measure(loss, *args, repeats=0)


@contextlib.contextmanager
def _recomputing(mark, adds, extra):
    """`_rounds` compiling as a compiler that recomputes of its own accord: each step it
    rewrites carries ``mark(choice)`` (other steps None), and a compiled step for which
    ``adds(its mark, its measurement)`` holds measures ``extra`` more FLOPs."""
    real_rewrite, real_compile = _rounds._rewrite, _rounds.compile_measure

    def rewrite(prep, choice):
        fn = real_rewrite(prep, choice)

        def marked(*args, **kwargs):
            return fn(*args, **kwargs)

        marked.mark = mark(prep, choice)
        return marked

    def compile_measure(fn, *args, **kwargs):
        out = real_compile(fn, *args, **kwargs)
        measured = out[0] if isinstance(out, tuple) else out
        if adds(getattr(fn, "mark", None), measured):
            measured = dataclasses.replace(measured, flops=measured.flops + extra)
        return (measured, *out[1:]) if isinstance(out, tuple) else measured

    _memo.forget()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_rounds, "_rewrite", rewrite)
        mp.setattr(_rounds, "compile_measure", compile_measure)
        yield


@pytest.fixture(scope="module")
def recomputing_compiler(decoder):
    """The plans of the decoder at 90% without and with ``strategies=[QKV]``, compiled by a
    compiler that adds half the un-checkpointed step's FLOPs to every plan but ``QKV``."""
    loss, args, plain = decoder
    extra = plain.flops / 2

    def is_qkv(prep, choice):
        return choice_key(choice) == choice_key(given_choice(prep, QKV)[1])

    with _recomputing(is_qkv, lambda mark, _: mark is False, extra):
        own = remat.plan(loss, *args, budget="90%", verbose=False)
        given = remat.plan(loss, *args, budget="90%", verbose=False, strategies=[QKV])
    _memo.forget()
    return own, given, extra


@pytest.fixture(scope="module")
def compiler_with_a_line(decoder):
    """The decoder's plan at 90% compiled by a compiler that, as the TPU compiler does near a
    chip's memory, recomputes of its own accord in a step whose peak is above a line (here
    just under the peak of the plan the real compiler gives), and in the step that saves
    nothing (as the TPU compiler does in `full` on a v5e, docs/tpu.md), adding half the
    un-checkpointed step's FLOPs to them; and the knowledge the plan left."""
    loss, args, plain = decoder
    _memo.forget()
    line = peak_of(remat.plan(loss, *args, budget="90%", verbose=False).measured) - 1
    extra = plain.flops / 2

    def nothing_saved(prep, choice):
        return not any(c.names for c in choice.choices.values())

    def adds(mark, measured):
        return peak_of(measured) > line or mark is True

    with _recomputing(nothing_saved, adds, extra):
        plan = remat.plan(loss, *args, budget="90%", verbose=False)
    (know,) = _memo._MEMORY.values()
    _memo.forget()
    return plan, know, line, extra


@pytest.mark.slow  # three plans (~20 s) of a compiler that recomputes of its own accord
def test_a_plan_under_the_compilers_own_recomputation_is_found(decoder, compiler_with_a_line):
    loss, args, plain = decoder
    plan, know, line, extra = compiler_with_a_line
    prep = know.prepared
    dear = [k for k in know.measured.values() if _dearer.dearer(prep, k)]
    # the model's cheapest plan compiled above the line and `full` below it, each dearer
    # than the model by ``extra``
    assert all(k.measured.flops >= plain.flops + extra for k in dear)
    assert any(peak_of(k.measured) > line for k in dear)
    assert any(not any(c.names for c in k.choice.choices.values()) for k in dear)
    # its peak is the compiler's, not the save set's: no memory outside the scans is learnt
    assert all(k.alone is None for k in dear)
    # a candidate under it, the model's FLOPs as compiled, is cheaper: the plan
    assert not _dearer.dearer(prep, know.measured[_memo.choice_key(_choice_of(know, plan))])
    assert plain.flops <= plan.measured.flops < min(k.measured.flops for k in dear)
    assert plan.measured_peak_bytes <= line
    assert_tree_allclose(jax.grad(plan.fn)(*args), jax.grad(loss)(*args))


def _choice_of(know, plan):
    """The compiled choice whose measurement is ``plan``'s."""
    (choice,) = [k.choice for k in know.measured.values() if k.measured is plan.measured]
    return choice


def _saved_names(plan) -> set[str]:
    return {v.user_name for s in plan.scans for v in s.saved if v.user_name}


@pytest.mark.slow  # two plans, 11 step compiles (~20 s): on the CPU backend `_dearer` never acts
def test_a_given_strategy_the_compiler_makes_cheaper_is_the_plan(decoder, recomputing_compiler):
    loss, args, plain = decoder
    own, given, extra = recomputing_compiler
    # on its own the planner returns its cheapest candidate, which the compiler made dearer
    assert own.measured.flops >= plain.flops + extra
    assert {"mlpwi_0", "mlpwi_1", "out_proj"} & _saved_names(own)
    # given `save_qkv_proj`, the planner compiles it (once) and returns it: cheaper measured
    assert given.measured.flops < own.measured.flops
    assert given.measured.flops < plain.flops + extra
    assert {"query_proj", "key_proj", "value_proj"} <= _saved_names(given)
    assert not {"mlpwi_0", "mlpwi_1", "out_proj"} & _saved_names(given)
    assert given.measured_peak_bytes <= given.budget_bytes
    # a round of its own, the candidates under it (`_dearer`: every plan but `QKV` compiles
    # dearer than the model), and the given strategy
    assert given.stats.step_compiles <= 2 + _dearer.COMPILES
    assert_tree_allclose(jax.grad(given.fn)(*args), jax.grad(loss)(*args))


@pytest.mark.parametrize(
    "strategies, match",
    [
        ("full", "got strategies='full'; pass a list"),
        (["names: ,"], "pass a list of strategies"),
        (["dots", "offload:a"], "pass a list of strategies"),
    ],
)
def test_strategies_are_checked_before_anything_is_compiled(decoder, strategies, match):
    loss, args, _ = decoder
    with pytest.raises(ValueError, match=match):
        remat.plan(loss, *args, budget="90%", verbose=False, strategies=strategies)


def test_a_strategy_naming_no_value_of_the_scans_is_refused_with_the_names_they_have():
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    from remat._plan._calibrate import prepare

    def loss(ws, x):
        def body(h, w):
            a = checkpoint_name(jnp.sin(h @ w), "a")
            return checkpoint_name(jnp.tanh(a @ w), "b"), None

        return (jax.lax.scan(body, x, ws)[0] ** 2).sum()

    prep = prepare(loss, (jnp.ones((3, 8, 8)), jnp.ones((4, 8))), 0, False)
    with pytest.raises(
        ValueError, match=r"no value of the program's scans has any of these names.*: a, b\)"
    ):
        given_choice(prep, "names:nope,nor_this")
    # names the program does not use are ignored, as `save_only_these_names` ignores them
    _, choice = given_choice(prep, "names:a,qkv_proj")
    (scan,) = choice.choices.values()
    assert [v.user_name for v in prep.models[0].values if v.name in scan.names] == ["a"]


@pytest.mark.parametrize("planner", ["plan", "plan_budgets"])
def test_strategies_reach_a_program_rolled_from_a_python_loop(planner):
    """Layers in a Python loop are rolled into a scan and planned; the strategies given go
    with them (a name no value has is refused there, as on a scanned program)."""
    import jax.numpy as jnp

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(jnp.sin(x @ w) @ w)
        return jnp.sum(x**2)

    args = ([jnp.full((16, 16), 0.1) for _ in range(4)], jnp.ones((256, 16)))
    with pytest.raises(ValueError, match="no value of the program's scans has any of these"):
        if planner == "plan":
            remat.plan(loss, *args, budget="60%", strategies=["names:nope"], verbose=False)
        else:  # `plan_budgets` returns the errors of budgets that do not fit, raises this one
            remat.plan_budgets(
                loss, *args, budgets=["60%"], strategies=["names:nope"], verbose=False
            )
