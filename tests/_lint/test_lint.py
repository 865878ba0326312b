"""`remat.lint`: every finding has a program that triggers it and a twin that does not, and
the claim each finding makes is checked against what JAX really saves."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name

import remat
from remat._lint import _policy_info

cp = jax.checkpoint_policies
X = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
XS = jnp.stack([X, 2 * X, 3 * X])


def layer(x):
    h = checkpoint_name(jnp.sin(x @ x), "hidden")
    return jnp.tanh(checkpoint_name(h * 2.0, "out") @ x)


def checkpointed(policy, f=layer):
    return lambda x: jnp.sum(jax.checkpoint(f, policy=policy)(x))


def codes(fn, *args, **kwargs):
    return [f.code for f in remat.lint(fn, *args, measure=False, **kwargs)]


def residual_avals(fn, *args):
    """What JAX keeps for the backward pass (intermediates; arguments left out)."""
    return sorted(
        str(aval)
        for aval, src in saved_residuals(fn, *args)
        if not src.startswith(("from the argument", "from a literal", "from a constant"))
    )


def line_here() -> int:
    return inspect.currentframe().f_back.f_lineno


# --- RM001: a policy name the program never produces ---


def test_rm001_misspelt_name_is_found_with_closest_names_first():
    policy = cp.save_only_these_names("hiden")
    line = line_here() + 1
    fn = lambda x: jnp.sum(jax.checkpoint(layer, policy=policy)(x))  # noqa: E731
    (finding,) = remat.lint(fn, X, measure=False)
    assert finding.code == "RM001"
    assert finding.source.endswith(f"test_lint.py:{line}")
    assert "'hiden'" in finding.message
    assert finding.message.index("'hidden'") < finding.message.index("'out'")
    # The mechanism: a name nobody produces makes the policy save nothing at all.
    assert residual_avals(checkpointed(cp.save_only_these_names("hiden")), X) == residual_avals(
        checkpointed(cp.nothing_saveable), X
    )


def test_rm001_not_reported_for_names_that_occur():
    assert codes(checkpointed(cp.save_only_these_names("hidden", "out")), X) == []


def test_rm001_name_produced_outside_the_checkpoint_says_where():
    def fn(x):
        y = checkpoint_name(x * 3.0, "outside")
        return jnp.sum(jax.checkpoint(layer, policy=cp.save_only_these_names("outside"))(y))

    (finding,) = remat.lint(fn, X, measure=False)
    assert finding.code == "RM001"
    assert "produced outside this checkpoint" in finding.message


def test_rm001_reads_exclusion_lists_and_user_policies():
    def user_policy(prim, *_, **params):
        return prim.name == "name" and params["name"] in ("hidden", "typo")

    assert codes(checkpointed(cp.save_any_names_but_these("ot")), X) == ["RM001"]
    assert codes(checkpointed(user_policy), X) == ["RM001"]
    assert codes(checkpointed(cp.save_any_names_but_these("out")), X) == []


def _explode(*args):
    raise RuntimeError("lint must not call helpers that a policy merely refers to")


def _careful_policy(prim, *args, **params):
    if prim is None:
        _explode(prim)
    return prim.name == "name" and params["name"] == "hiden"


def test_rm001_user_policy_helpers_are_never_called():
    assert codes(checkpointed(_careful_policy), X) == ["RM001"]


# --- RM002: a name both saved and offloaded ---

_offload_a = cp.save_and_offload_only_these_names(
    names_which_can_be_saved=[],
    names_which_can_be_offloaded=["hidden", "out"],
    offload_src="device",
    offload_dst="pinned_host",
)


def _save_and_offload(prim, *args, **params):  # a hand-combined policy: saving wins
    return cp.save_only_these_names("hidden")(prim, *args, **params) or _offload_a(
        prim, *args, **params
    )


def test_rm002_name_saved_and_offloaded():
    found = remat.lint(checkpointed(_save_and_offload), X, measure=False)
    assert [f.code for f in found] == ["RM002"]
    assert "'hidden'" in found[0].message and "'out'" not in found[0].message
    assert "saving wins" in found[0].message
    # The mechanism: the combined policy saves 'hidden' rather than offloading it.
    assert _policy_info.probe(_save_and_offload, "hidden") == _policy_info.SAVE
    assert _policy_info.probe(_save_and_offload, "out") == _policy_info.OFFLOAD


_save_hidden = cp.save_only_these_names("hidden")


def _offload_and_save(prim, *args, **params):  # the other order: offloading wins
    return _offload_a(prim, *args, **params) or _save_hidden(prim, *args, **params)


def test_rm002_says_when_offloading_wins():
    (finding,) = remat.lint(checkpointed(_offload_and_save), X, measure=False)
    assert finding.code == "RM002" and "offloading wins" in finding.message
    assert _policy_info.probe(_offload_and_save, "hidden") == _policy_info.OFFLOAD


def test_rm002_not_reported_for_disjoint_sets():
    policy = cp.save_and_offload_only_these_names(
        names_which_can_be_saved=["hidden"],
        names_which_can_be_offloaded=["out"],
        offload_src="device",
        offload_dst="pinned_host",
    )
    assert _policy_info.policy_info(policy).saved_and_offloaded == frozenset()
    assert "RM002" not in codes(checkpointed(policy), X)


# --- RM003: save_anything_except_these_names ---


def test_rm003_save_anything_except_is_verified_against_installed_jax():
    policy = cp.save_anything_except_these_names("hidden")
    # What the import-time check found must match what jax.checkpoint really does.
    saves_all = residual_avals(checkpointed(policy), X) == residual_avals(
        checkpointed(cp.everything_saveable), X
    )
    assert saves_all == _policy_info.SAVE_ANYTHING_EXCEPT_IGNORES_NAMES
    assert codes(checkpointed(policy), X) == (["RM003"] if saves_all else [])


def test_rm003_not_reported_for_save_any_names_but_these():
    assert "RM003" not in codes(checkpointed(cp.save_any_names_but_these("hidden")), X)


# --- RM004: dots_with_no_batch_dims_saveable under vmap ---


def test_rm004_dots_no_batch_under_vmap_keeps_nothing():
    policy = cp.dots_with_no_batch_dims_saveable

    def batched(xs):
        return jnp.sum(jax.vmap(jax.checkpoint(layer, policy=policy))(xs))

    def batched_full(xs):
        return jnp.sum(jax.vmap(jax.checkpoint(layer, policy=cp.nothing_saveable))(xs))

    assert codes(batched, XS) == ["RM004"]
    # The mechanism: under vmap it saves exactly what nothing_saveable saves.
    assert residual_avals(batched, XS) == residual_avals(batched_full, XS)


def test_rm004_not_reported_without_vmap():
    fn = checkpointed(cp.dots_with_no_batch_dims_saveable)
    assert codes(fn, X) == []
    assert residual_avals(fn, X) != residual_avals(checkpointed(cp.nothing_saveable), X)


# --- RM006: a checkpoint that saves no memory ---


def test_rm006_everything_saveable_saves_no_memory():
    (finding,) = remat.lint(checkpointed(cp.everything_saveable), X, measure=False)
    assert finding.code == "RM006"
    assert residual_avals(checkpointed(cp.everything_saveable), X) == residual_avals(
        lambda x: jnp.sum(layer(x)), X
    )


def test_rm006_swapping_one_residual_for_another_of_the_same_size():
    def fn(x):
        y = x * 2.0  # an intermediate: the checkpoint keeps y instead of cos(y)
        return jnp.sum(jax.checkpoint(jnp.sin)(y))

    assert codes(fn, X) == ["RM006"]


def test_rm006_not_reported_when_the_checkpoint_saves_memory():
    assert codes(checkpointed(cp.nothing_saveable), X) == []


# --- RM007: a checkpoint around a whole scan ---


def _stack(x, body=layer):
    return jnp.sum(jax.lax.scan(lambda c, _: (body(c), None), x, length=5)[0])


def test_rm007_checkpoint_around_whole_scan():
    (finding,) = remat.lint(jax.checkpoint(_stack), X, measure=False)
    assert finding.code == "RM007"
    assert "5 steps" in finding.message


def test_rm007_not_reported_for_checkpointed_body_or_two_levels():
    body_checkpointed = functools.partial(_stack, body=jax.checkpoint(layer))
    assert codes(body_checkpointed, X) == []
    assert codes(jax.checkpoint(body_checkpointed), X) == []


def test_rm007_not_reported_for_blocks_of_an_outer_scan():
    # Nested checkpointing: each outer step checkpoints a whole inner scan (a block).
    def blocks(x):
        def block(c, _):
            return jax.checkpoint(
                lambda c: jax.lax.scan(lambda h, _: (layer(h), None), c, length=3)[0]
            )(c), None

        return jnp.sum(jax.lax.scan(block, x, length=2)[0])

    assert codes(blocks, X) == []
    strategy = remat.Strategy("none", schedule=remat.Nested(2))
    assert codes(_stack, X, strategy=strategy) == []


def _scan_of(n):
    return lambda x: jnp.sum(jax.lax.scan(lambda c, _: (layer(c), None), x, length=n)[0])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(("n", "levels"), [(11, 2), (17, 2), (19, 3), (23, 3), (29, 4)])
def test_rm007_not_reported_for_the_shorter_last_block_of_nested(n, levels, reverse):
    # 11 steps as Nested(2) are blocks of (3, 4): two whole blocks of 4 in a loop, then a
    # checkpointed block of 3 beside the loop; 29 as Nested(4) are (2, 2, 3, 3), whose last
    # block of 11 again ends with a block of 2, shorter than one of its inner blocks.
    def fn(x):
        return jnp.sum(jax.lax.scan(lambda c, _: (layer(c), None), x, length=n, reverse=reverse)[0])

    for policy in ["none", "full"]:
        strategy = remat.Strategy(policy, schedule=remat.Nested(levels))
        assert codes(fn, X, strategy=strategy) == []


def test_rm007_reported_beside_a_loop_of_shorter_blocks():
    # A whole scan of 6 checkpointed beside blocks of 3: longer than a block, so reported.
    def fn(x):
        def block(c, _):
            return jax.checkpoint(
                lambda c: jax.lax.scan(lambda h, _: (layer(h), None), c, length=3)[0]
            )(c), None

        h = jax.lax.scan(block, x, length=2)[0]
        return jnp.sum(jax.checkpoint(_scan_of(6))(h))

    assert codes(fn, X) == ["RM007"]


# --- RM008: nested checkpoints, inner policy overridden ---


def _nested(inner_policy, outer_policy):
    inner = jax.checkpoint(layer, policy=inner_policy)
    return lambda x: jnp.sum(jax.checkpoint(lambda y: layer(inner(y)), policy=outer_policy)(x))


def test_rm008_inner_policy_overridden_by_outer():
    save_hidden = cp.save_only_these_names("hidden")
    found = remat.lint(_nested(save_hidden, cp.everything_saveable), X, measure=False)
    assert "RM008" in [f.code for f in found]
    # The mechanism: what is kept is what the outer policy alone would keep.
    assert residual_avals(_nested(save_hidden, cp.everything_saveable), X) == residual_avals(
        _nested(cp.everything_saveable, cp.everything_saveable), X
    )
    assert residual_avals(_nested(save_hidden, cp.nothing_saveable), X) == residual_avals(
        _nested(cp.nothing_saveable, cp.nothing_saveable), X
    )


def test_rm008_not_reported_for_same_policy_or_a_loop_between():
    same = cp.save_only_these_names("hidden")
    assert "RM008" not in codes(_nested(same, cp.save_only_these_names("hidden")), X)
    two_level = jax.checkpoint(functools.partial(_stack, body=jax.checkpoint(layer, policy=same)))
    assert codes(two_level, X) == []


# --- the API ---


def test_clean_program_has_no_findings_and_findings_print_one_line():
    assert remat.lint(lambda x: jnp.sum(layer(x)), X, measure=False) == []
    (finding,) = remat.lint(checkpointed(cp.save_only_these_names("hiden")), X, measure=False)
    assert "\n" not in str(finding) and str(finding).startswith(finding.source)
    assert finding.title == remat._lint._findings.CODES["RM001"][0]


def test_lint_accepts_shape_dtype_structs_and_pytrees():
    spec = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    fn = checkpointed(cp.save_only_these_names("hiden"))
    assert codes(lambda p: fn(p["w"]), {"w": spec}) == ["RM001"]
    # measure=True (the default) compiles from the shapes: the same findings as from arrays.
    found = [f.code for f in remat.lint(lambda p: fn(p["w"]), {"w": spec})]
    assert found == [f.code for f in remat.lint(lambda p: fn(p["w"]), {"w": jnp.ones((4, 4))})]
    assert "RM001" in found


@pytest.mark.parametrize(
    ("fn", "args", "match"),
    [
        (42, (X,), r"`remat.lint` got fn=42, which is not callable"),
        (jnp.sum, ("not an array",), r"`remat.lint` got a str at args\[0\]"),
        (jnp.sum, ({"a": object()},), r"`remat.lint` got a object at args\[0\]\['a'\]"),
    ],
)
def test_lint_rejects_bad_input(fn, args, match):
    with pytest.raises(TypeError, match=match):
        remat.lint(fn, *args)


# --- RM005: recomputation the compiler removed (compiles; read via remat.measure) ---


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's CSE behaviour")
def test_rm005_checkpoint_outside_a_loop_is_undone_on_cpu():
    fn = checkpointed(cp.nothing_saveable)
    found = remat.lint(fn, X)
    assert [f.code for f in found] == ["RM005"]
    assert "CPU backend expands the optimization barriers" in found[0].message
    # The mechanism, read from the compiled program by remat.measure.
    with pytest.warns(remat.RematWarning):
        assert remat.measure(fn, X, repeats=0).recompute_eliminated


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's CSE behaviour")
def test_rm005_of_a_loss_with_aux_and_a_warning_where_the_gradient_is_not_compiled():
    loss = checkpointed(cp.nothing_saveable)

    def with_aux(x):
        return loss(x), {"norm": jnp.sum(x**2)}

    with pytest.warns(remat.RematWarning, match="did not compile the gradient.*has_aux=True"):
        assert remat.lint(with_aux, X) == []  # RM005 unchecked, and said
    assert [f.code for f in remat.lint(with_aux, X, has_aux=True)] == ["RM005"]
    with pytest.raises(
        ValueError,
        match=r"`remat.lint` got has_aux=True, so fn must return a pair \(loss, aux\).*it returned float32\[\]",
    ):
        remat.lint(loss, X, has_aux=True)
    with pytest.raises(ValueError, match=r"`remat.lint` got has_aux='yes'; pass True or False"):
        remat.lint(with_aux, X, has_aux="yes")


def test_rm005_not_reported_inside_a_scan():
    ws = jnp.stack([X, X / 2, X / 3])

    def loss(ws, x):
        body = jax.checkpoint(lambda c, w: (layer(c @ w), None))
        return jnp.sum(jax.lax.scan(body, x, ws)[0])

    assert remat.lint(loss, ws, X) == []
    assert remat.measure(loss, ws, X, repeats=0).recompute_eliminated is False


def test_rm005_skipped_without_a_scalar_loss_or_with_measure_false():
    with pytest.warns(remat.RematWarning, match=r"returns .*float32\[.*not a float scalar"):
        assert remat.lint(lambda x: jax.checkpoint(layer)(x), X) == []
    assert codes(checkpointed(cp.nothing_saveable), X) == []


# --- programs that remat or flax build ---


def _scanned_loss(ws, x):
    def body(c, w):
        return layer(c @ w), None

    return jnp.sum(jax.lax.scan(body, x, ws)[0])


def test_checkpoints_inside_loops_are_not_compiled(monkeypatch):
    import remat._measure._measure

    def no_compile(*args, **kwargs):
        raise AssertionError("lint compiled a program whose checkpoints are all in loops")

    monkeypatch.setattr(remat._measure._measure, "measure", no_compile)
    ws = jnp.stack([X, X / 2])
    assert remat.lint(_scanned_loss, ws, X, strategy="full") == []


def test_binomial_schedule_checkpoint_is_not_reported_as_saving_nothing():
    ws = jnp.stack([X / (i + 1) for i in range(5)])
    strategy = remat.Strategy("full", schedule=remat.Binomial(2))
    assert remat.lint(_scanned_loss, ws, X, strategy=strategy, measure=False) == []


def test_source_is_the_users_line_for_flax_layers():
    import flax.linen as nn

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, c, _):
            h = nn.Dense(4)(c)
            line = line_here() + 1
            h = checkpoint_name(jnp.sin(h), "hidden")
            return jnp.tanh(h), line

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            scan = nn.scan(
                Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=3
            )
            scan_lines.append(line_here() + 1)
            return scan()(x, None)

    scan_lines: list[int] = []
    model = Stack()
    params = model.init(jax.random.key(0), X)
    line = int(model.apply(params, X)[1][0])

    def loss(p, x):
        return jnp.sum(model.apply(p, x)[0])

    (finding,) = remat.lint(loss, params, X, strategy="names:hiden", measure=False)
    assert finding.code == "RM001"
    # The user's own line (the layer, or the scan call), never flax's or remat's files.
    assert finding.source.rpartition(":")[0].endswith("test_lint.py")
    assert int(finding.source.rpartition(":")[2]) in {line, *scan_lines}
