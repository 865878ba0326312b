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
from remat._measure._hlo import hlo_flops
from remat._measure._peak import peak_bytes
from remat._measure._phases import loop_phases
from remat._measure._xla_dump import compile_with_dump
from remat._trace._jaxpr_walk import sites
from remat._trace._rewrite import lax_loop, rewrite_scans
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


def attention(w, xs):
    """A causal attention layer as MaxText writes it: the mask and the masked scores made by
    jitted calls (``jnp.tril``, ``jnp.where``, as in `remat._models._maxtext`), the query and
    the context named."""
    t = xs.shape[0]

    def step(c, w):
        q = checkpoint_name(c @ w, "q")
        mask = jax.jit(jnp.tril)(jnp.ones((t, t), bool))
        s = jax.jit(jnp.where)(mask, q @ c.T, -1e9)  # a Python float: converted in the call
        return jax.jit(jax.nn.silu)(checkpoint_name(jax.nn.softmax(s) @ c, "ctx")) + c, None

    return jnp.sum(jax.lax.scan(step, xs, w)[0] ** 2)


def test_the_kept_form_compiles_as_the_program_as_written_under_the_same_policy():
    # The save set of the names "q" and "ctx" three ways: the policy around the body as
    # written, and the planner's rewrite with its calls kept and inlined. Kept, the program is
    # the written one's to the byte in every loop phase; inlined, XLA fuses the masked fill's
    # float32 broadcast into the forward loop where, kept, it is made before the loop and
    # passed in (512 x 512 x 4 bytes less in the forward phase here; 2 GiB at Llama-3-8B
    # shapes, `benchmarks/preset_gap.py`). The fill's conversion inside ``jnp.where``'s call
    # is folded when the body is flattened: the walk of the kept form leaves it out as well.
    args = (jnp.ones((2, 8, 8)) * 0.1, jnp.ones((512, 8)))
    info = planned_scans(attention, *args)[0]
    eqns = flatten(info.jaxpr).jaxpr.eqns
    at = {id(e.outvars[0]): j for j, e in enumerate(eqns)}
    named = [j for j, e in enumerate(eqns) if e.params.get("name") in ("q", "ctx")]
    names = tuple(value_name(0, k, 0, 1) for j in named for k in (at[id(eqns[j].invars[0])], j))
    policy = jax.checkpoint_policies.save_only_these_names("q", "ctx")

    def as_written(info, _):
        def body(consts, carry, xs):
            outs = jax.core.eval_jaxpr(info.jaxpr.jaxpr, info.jaxpr.consts, *consts, *carry, *xs)
            return list(outs[: info.num_carry]), list(outs[info.num_carry :])

        return jax.checkpoint(body, policy=policy, prevent_cse=False)

    forms = {
        "written": rewrite_scans(attention, as_written, lax_loop),
        "kept": rewrite(attention, {0: ScanChoice(names=names, kept_calls=True)}),
        "inlined": rewrite(attention, {0: ScanChoice(names=names)}),
    }
    read, want = {}, jax.value_and_grad(attention)(*args)
    for label, fn in forms.items():
        compiled, dump = compile_with_dump(jax.jit(jax.value_and_grad(fn)).lower(*args))
        read[label] = (peak_bytes(compiled), hlo_flops(compiled.as_text()), loop_phases(dump))
        assert_tree_allclose(compiled(*args), want)
    assert read["kept"] == read["written"]
    written, inlined = read["written"][2], read["inlined"][2]
    assert written.forward - inlined.forward == 512 * 512 * 4
    assert read["inlined"][:2] == read["written"][:2]  # the peak is the backward loop's
