"""Tests for `remat.apply`, `remat.list_scans` and `rewrite_scans`.

Every rewritten function is compared with its plain twin (values and gradients); what the
rewrite changes is read from the programs: checkpoint equations in the jaxpr, residuals kept
by `jax.vjp`, dot products in the gradient's jaxpr and XLA's compiled memory analysis.
"""

from __future__ import annotations

import functools
import inspect
import os

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend import core as jcore

import remat
from conftest import assert_tree_allclose, nnx_stack
from remat._core._strategy import offload_available
from remat._measure._step import ANALYSIS_OPTIONS  # compiled to be read, as remat does
from remat._trace._rewrite import rewrite_scans

L, B, D = 4, 8, 16  # layers, batch, width of the scanned MLP


def mlp(ws, x):
    """Two matmuls with a `sin` after each, per layer; the layers stacked with a scan."""

    def body(h, w):
        a = jnp.sin(h @ w)
        return jnp.sin(a @ w), None

    h, _ = lax.scan(body, x, ws)
    return jnp.sum(h**2)


@functools.cache
def mlp_args():
    kw, kx = jax.random.split(jax.random.key(0))
    return jax.random.normal(kw, (L, D, D)) * 0.3, jax.random.normal(kx, (B, D))


def two_scans(p, x):
    """A scan named `enc` (width 3) then a scan named `dec` (width 5) with a nested scan."""

    def enc_body(h, w):
        return jnp.tanh(h @ w), jnp.sum(h)

    def dec_body(h, w):
        with jax.named_scope("inner"):
            h, _ = lax.scan(lambda c, _: (jnp.sin(c), None), h, length=2)
        return jnp.tanh(h @ w), None

    with jax.named_scope("enc"):
        h, ys = lax.scan(enc_body, x, p["enc"])
    h = h @ p["proj"]
    with jax.named_scope("dec"):
        h, _ = lax.scan(dec_body, h, p["dec"])
    return jnp.sum(h**2) + jnp.sum(ys)


def two_scans_args():
    k = jax.random.split(jax.random.key(1), 4)
    p = {
        "enc": jax.random.normal(k[0], (3, 3, 3)) * 0.5,
        "proj": jax.random.normal(k[1], (3, 5)),
        "dec": jax.random.normal(k[2], (2, 5, 5)) * 0.5,
    }
    return p, jax.random.normal(k[3], (2, 3))


def check_twin(f, f2, *args, argnums=0):
    """Values and gradients of a scalar ``f2`` equal ``f``'s (both compiled, to keep it fast)."""
    want = _plain(f, argnums, *args)
    got = jax.jit(jax.value_and_grad(f2, argnums=argnums))(*args)
    assert_tree_allclose(got, want, scale=10)


_PLAIN: dict = {}


def _plain(f, argnums, *args):
    """The plain twin's value and gradient, computed once per (function, arguments)."""
    key = (f, argnums, tuple(map(id, jax.tree_util.tree_leaves(args))))
    if key not in _PLAIN:
        _PLAIN[key] = (jax.jit(jax.value_and_grad(f, argnums=argnums))(*args), args)
    return _PLAIN[key][0]


def n_residuals(f, *args, shape):
    """How many values of ``shape`` `jax.vjp` keeps for the backward pass (traced, not run)."""
    return sum(leaf.shape == shape for leaf in residuals(f, *args))


def residuals(f, *args):
    """The arrays `jax.vjp` keeps for the backward pass of ``f``, as shapes."""
    return jax.tree_util.tree_leaves(jax.eval_shape(lambda *a: jax.vjp(f, *a)[1], *args))


def count(jaxpr, name) -> int:
    """Equations of primitive ``name`` in ``jaxpr`` and all its sub-jaxprs."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == name
        for sub in jcore.jaxprs_in_params(eqn.params):
            n += count(sub, name)
    return n


def scans_with_checkpoint(jaxpr, out):
    """For every scan (recursively): (carry widths, whether its own body holds a checkpoint)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            body = eqn.params["jaxpr"].jaxpr
            widths = tuple(v.aval.shape[-1] for v in body.invars if v.aval.shape)
            own = any(e.primitive.name == "remat2" for e in body.eqns)
            out.append((widths, own))
        for sub in jcore.jaxprs_in_params(eqn.params):
            scans_with_checkpoint(sub, out)
    return out


### Values and gradients equal the plain function's


@pytest.mark.parametrize(
    "strategy",
    [
        "none",
        "full",
        "dots",
        "dots_no_batch",
        "everything",
        "names:nothing_named",
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        remat.Strategy("full", scans=(0,)),
    ],
)
def test_values_and_gradients_equal_plain(strategy):
    f2 = remat.apply(mlp, strategy)
    args = mlp_args()
    check_twin(mlp, f2, *args)
    assert_tree_allclose(f2(*args), mlp(*args))  # eager call
    check_twin(mlp, f2, *args, argnums=(0, 1))


def test_nested_scans_pytree_args_and_selection_values():
    args = two_scans_args()
    for strategy in ["full", remat.Strategy("dots", scans=("inner",))]:
        check_twin(two_scans, remat.apply(two_scans, strategy), *args)


def test_vmap_and_kwargs_and_pytree_outputs():
    def f(x, *, scale, ws):
        h, ys = lax.scan(lambda c, w: (jnp.sin(c @ w) * scale, c), x, ws)
        return {"h": h, "ys": (ys, ys.sum())}

    ws, x = mlp_args()
    f2 = remat.apply(f, "full")
    assert_tree_allclose(f2(x, scale=2.0, ws=ws), f(x, scale=2.0, ws=ws))
    batched = jax.vmap(lambda x: f2(x, scale=0.5, ws=ws))(x)
    assert_tree_allclose(batched, jax.vmap(lambda x: f(x, scale=0.5, ws=ws))(x))
    g2 = jax.grad(lambda ws: f2(x, scale=0.5, ws=ws)["ys"][1])(ws)
    assert_tree_allclose(g2, jax.grad(lambda ws: f(x, scale=0.5, ws=ws)["ys"][1])(ws), scale=10)


def test_traced_once_per_input_structure():
    calls = []

    def f(x, n):
        calls.append(x.shape)
        return lax.scan(lambda c, _: (jnp.sin(c), None), x, length=n)[0]

    f2 = remat.apply(f, "full")
    f2(jnp.ones(3), 2)
    f2(jnp.zeros(3), 2)  # same shapes, dtypes and static `n`: no new trace
    assert calls == [(3,)]
    f2(jnp.ones(4), 2)
    f2(jnp.ones(4), 3)  # `n` is a Python int: static, part of the cache key
    assert calls == [(3,), (4,), (4,)]
    assert_tree_allclose(f2(jnp.ones(4), 3), f(jnp.ones(4), 3))


def test_closed_over_constants_and_scan_consts_and_reverse():
    ws, x = mlp_args()
    bias = jnp.linspace(-1.0, 1.0, D)  # closed over by fn: a constant of the traced program

    def f(x, ws):
        def body(h, w):
            return jnp.sin(h @ w + bias), jnp.cos(h) * x[0]  # `x` closed over: a scan const

        h, ys = lax.scan(body, x, ws, reverse=True, unroll=2)
        return jnp.sum(h) + jnp.sum(ys**2)

    (info,) = remat.list_scans(f, x, ws)
    assert (info.num_consts, info.num_carry, info.reverse, info.unroll) == (2, 1, True, 2)
    check_twin(f, remat.apply(f, "full"), x, ws, argnums=(0, 1))


def test_scan_inside_jit_cond_and_checkpoint():
    @jax.jit
    def blocks(x, ws):
        return lax.scan(lambda c, w: (jnp.sin(c @ w), None), x, ws)[0]

    def f(ws, x):
        h = jax.checkpoint(blocks)(x, ws)  # scan inside checkpoint inside jit
        h = lax.cond(h.sum() > 0, lambda h: blocks(h, ws), lambda h: -h, h)
        return jnp.sum(h**2)

    ws, x = mlp_args()
    scans = remat.list_scans(f, ws, x)
    assert [(s.position, s.name) for s in scans] == [(0, "blocks"), (1, "blocks")]
    with pytest.warns(remat.RematWarning, match="kept the program's own checkpoints"):
        f2 = remat.apply(f, "full")
        check_twin(f, f2, ws, x)
    # the user's checkpoint (its scan left as written) + the second scan's
    assert count(jax.make_jaxpr(f2)(ws, x).jaxpr, "remat2") == 1 + 1
    f3 = remat.apply(f, "full", override=True)
    check_twin(f, f3, ws, x)
    assert count(jax.make_jaxpr(f3)(ws, x).jaxpr, "remat2") == 2  # one per scan


def test_scan_inside_jit_with_shardings_keeps_them():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(jax.make_mesh((1,), ("data",)), P("data"))

    @jax.jit
    def f(ws, x):
        blocks = jax.jit(mlp, in_shardings=(None, sharding), out_shardings=None)
        return blocks(ws, x)

    f2 = remat.apply(f, "full")
    check_twin(f, f2, *mlp_args())
    jaxpr = jax.make_jaxpr(f2)(*mlp_args()).jaxpr
    (inner,) = [e for e in jaxpr.eqns[0].params["jaxpr"].eqns if e.primitive.name == "jit"]
    assert inner.params["name"] == "mlp"
    assert inner.params["in_shardings"][1] == sharding  # the jit kept its shardings
    assert count(jaxpr, "remat2") == 1


def test_scans_inside_custom_jvp_are_left_alone():
    @jax.custom_jvp
    def g(x):
        return lax.scan(lambda c, _: (jnp.sin(c), None), x, length=3)[0]

    g.defjvp(lambda p, t: (g(p[0]), t[0]))

    def f(x):
        return jnp.sum(g(x))

    assert remat.list_scans(f, jnp.ones(3)) == []
    with pytest.warns(remat.RematWarning, match="found no `scan`"):
        check_twin(f, remat.apply(f, "full"), jnp.ones(3))


### Selection by position and by name


def test_list_scans_positions_names_sources():
    scans = remat.list_scans(two_scans, *two_scans_args())
    got = [(s.position, s.name, s.path, s.length) for s in scans]
    assert got == [
        (0, "enc", ("enc",), 3),
        (1, "dec", ("dec",), 2),
        (2, "inner", ("dec", "inner"), 2),
    ]
    # relative to the working directory, as every source line remat shows
    assert all(s.source.startswith(os.path.relpath(__file__) + ":") for s in scans)
    shapes = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), two_scans_args()
    )
    assert remat.list_scans(two_scans, *shapes) == scans  # shapes suffice, nothing allocated
    lines, first = inspect.getsourcelines(two_scans)
    enc_line = first + next(i for i, line in enumerate(lines) if "lax.scan(enc_body" in line)
    assert scans[0].source.endswith(f":{enc_line}")


def test_a_scan_without_a_named_scope_is_named_after_the_users_step_function():
    nnx_loss, state = nnx_stack(L, D)  # nnx.scan over ``def run(h, block)``
    ws, x = mlp_args()

    def loss(ws, x):
        def layer(h, w):
            return jnp.tanh(h @ w), None

        h = lax.scan(layer, x, ws)[0]
        h = lax.scan(lambda h, w: (h @ w, None), h, ws)[0]  # a lambda: no name
        return jnp.sum(lax.map(jnp.sin, h))  # lax.map's step is JAX's own: no name

    assert [s.name for s in remat.list_scans(nnx_loss, state, x)] == ["run"]
    assert [(s.name, s.path) for s in remat.list_scans(loss, ws, x)] == [
        ("layer", ()),
        ("", ()),
        ("", ()),
    ]
    selected = remat.apply(loss, remat.Strategy("full", scans=("layer",)))  # by the name
    check_twin(loss, selected, ws, x)
    first = remat.apply(loss, remat.Strategy("full", scans=(0,)))
    kept = [n_residuals(f, ws, x, shape=(L, B, D)) for f in (loss, selected, first)]
    assert kept == [4, 2, 2], kept  # the first scan keeps its carries only (3 -> 1)


@pytest.mark.parametrize(
    ("scans", "widths"),
    [((0,), {3}), (("enc",), {3}), (("dec",), {5}), ((2,), {5}), (("dec/inner",), {5})],
)
def test_only_selected_scans_get_a_checkpoint(scans, widths):
    """Read the jaxpr of the gradient: checkpoints sit only in the selected scans' bodies."""
    args = two_scans_args()
    f2 = remat.apply(two_scans, remat.Strategy("full", scans=scans))
    found = scans_with_checkpoint(jax.make_jaxpr(jax.grad(f2))(*args).jaxpr, [])
    marked = [w for w, own in found if own]
    assert marked, found
    assert {w[0] for w in marked} == widths
    # The plain rewrite of the same program: exactly one scan body holds the checkpoint.
    plain = scans_with_checkpoint(jax.make_jaxpr(f2)(*args).jaxpr, [])
    assert sum(own for _, own in plain) == 1
    depth_first = [own for _, own in plain]
    if scans in ((0,), ("enc",)):
        assert depth_first == [True, False, False]
    elif scans == ("dec",):
        assert depth_first == [False, True, False]
    else:
        assert depth_first == [False, False, True]


def test_selection_that_matches_nothing_is_an_error():
    f2 = remat.apply(two_scans, remat.Strategy("full", scans=("decoder",)))
    with pytest.raises(ValueError, match=r"`remat.apply`.*'decoder'.*0: enc, 1: dec, 2: inner"):
        f2(*two_scans_args())
    with pytest.raises(ValueError, match="matches no scan"):
        remat.apply(two_scans, remat.Strategy("full", scans=(3,)))(*two_scans_args())


### It really changes what is saved and what is recomputed


def test_residuals_counted_by_hand():
    """Per layer, plain AD keeps h, cos(h@w), a and cos(a@w); "full" keeps only the carry h;
    "dots" keeps h and the two matmul outputs (sin and cos are recomputed from them)."""
    args = mlp_args()
    stacked = (L, B, D)
    assert n_residuals(mlp, *args, shape=stacked) == 4
    assert n_residuals(remat.apply(mlp, "none"), *args, shape=stacked) == 4
    assert n_residuals(remat.apply(mlp, "everything"), *args, shape=stacked) == 4
    assert n_residuals(remat.apply(mlp, "full"), *args, shape=stacked) == 1
    assert n_residuals(remat.apply(mlp, "dots"), *args, shape=stacked) == 3


def test_names_strategy_saves_the_named_value():
    """With `a` tagged, "names:a" keeps h and a per layer; everything else is recomputed."""
    from jax.ad_checkpoint import checkpoint_name

    def tagged(ws, x):
        def body(h, w):
            a = checkpoint_name(jnp.sin(h @ w), "a")
            return jnp.sin(a @ w), None

        return jnp.sum(lax.scan(body, x, ws)[0] ** 2)

    args = mlp_args()
    f2 = remat.apply(tagged, "names:a")
    check_twin(tagged, f2, *args)
    assert n_residuals(f2, *args, shape=(L, B, D)) == 2
    assert n_residuals(remat.apply(tagged, "names:b"), *args, shape=(L, B, D)) == 1


def test_recomputation_counted_in_gradient_jaxpr():
    """Forward 2 dots; backward 2 per dot (for h and for w). "full" recomputes the 2 forward dots
    in the backward scan; "dots" saves them and recomputes only the `sin` between them."""
    args = mlp_args()

    def dots_and_sins(strategy):
        jaxpr = jax.make_jaxpr(jax.grad(remat.apply(mlp, strategy)))(*args).jaxpr
        return count(jaxpr, "dot_general"), count(jaxpr, "sin")

    assert dots_and_sins("none") == (2 + 4, 2)
    assert dots_and_sins("full") == (2 + 2 + 4, 2 + 1)
    assert dots_and_sins("dots") == (2 + 4, 2 + 1)


def test_compiled_memory_full_below_dots_below_none():
    args = mlp_args()

    def temp_bytes(strategy):
        step = jax.jit(jax.grad(remat.apply(mlp, strategy)))
        compiled = step.lower(*args).compile(ANALYSIS_OPTIONS)
        return compiled.memory_analysis().temp_size_in_bytes

    none, dots, full = temp_bytes("none"), temp_bytes("dots"), temp_bytes("full")
    assert temp_bytes(jax.checkpoint_policies.nothing_saveable) == full
    # One stacked residual is L*B*D*4 bytes; "full" keeps 3 fewer than "none", "dots" 1 fewer.
    stack = L * B * D * 4
    assert full < dots < none
    assert none - full >= 2 * stack
    assert none - dots >= stack // 2


def test_schedules_run_through_remat_scan():
    """A Strategy with a schedule runs the scan with `remat.scan`: 16 layers keep 16 carries
    per step ("per_step"), sqrt(16) = 4 with two nested levels, and at most snapshots + 1 = 3
    carry rows with Binomial(2)."""
    n = 16
    ws = jax.random.normal(jax.random.key(2), (n, D, D)) * 0.3
    x = mlp_args()[1]
    carries = {}
    for schedule in ["per_step", remat.Nested(2), remat.Binomial(2)]:
        f2 = remat.apply(mlp, remat.Strategy("full", schedule=schedule))
        check_twin(mlp, f2, ws, x, argnums=(0, 1))
        assert_tree_allclose(f2(ws, x), mlp(ws, x))  # forward only, no autodiff
        carries[str(schedule)] = [
            leaf.shape[0] for leaf in residuals(f2, ws, x) if leaf.shape[1:] == (B, D)
        ]
    assert carries["per_step"] == [n]
    assert carries["Nested(levels=2, lengths=None)"] == [4]
    assert 1 <= max(carries["Binomial(snapshots=2)"]) <= 3
    assert remat.apply(mlp, remat.Strategy("full", schedule="none")) is mlp


### The no-scan fallback and bad input


def test_no_scan_checkpoints_whole_function_with_warning():
    def f(w, x):
        return jnp.sum(jnp.cos(jnp.sin(x @ w) @ w))

    args = mlp_args()[0][0], mlp_args()[1]
    f2 = remat.apply(f, "full")
    with pytest.warns(remat.RematWarning, match=r"rarely saves memory.*scan.*Nothing could be"):
        check_twin(f, f2, *args)
    assert count(jax.make_jaxpr(f2)(*args).jaxpr, "remat2") == 1  # warned once, above
    assert remat.apply(f, "none") is f  # nothing to do, nothing to warn about
    with pytest.raises(ValueError, match=r"matches no scan.*scans are: none"):
        remat.apply(f, remat.Strategy("full", scans=(0,)))(*args)


def test_repeated_layers_are_rolled_unless_roll_is_false():
    def f(w, x):  # two identical layers sharing ``w``: rolled into a scan of 2
        return jnp.sum(jnp.sin(jnp.sin(x @ w) @ w))

    args = mlp_args()[0][0], mlp_args()[1]
    (info,) = remat.list_scans(f, *args)
    assert (info.name, info.length, info.stacked) == ("rolled_2_layers", 2, ())
    assert remat.list_scans(f, *args, roll=False) == []
    check_twin(f, remat.apply(f, "full"), *args)
    with pytest.warns(remat.RematWarning, match=r"rarely saves memory") as record:
        check_twin(f, remat.apply(f, "full", roll=False), *args)
    assert "Nothing could be rolled" not in str(record[0].message)


def test_decorator_form():
    @remat.apply(strategy="full")
    def f2(ws, x):
        return mlp(ws, x)

    check_twin(mlp, f2, *mlp_args())
    assert n_residuals(f2, *mlp_args(), shape=(L, B, D)) == 1
    with pytest.raises(ValueError, match=r"`remat.apply`.*'fulll'"):
        remat.apply(strategy="fulll")


def test_bad_inputs():
    with pytest.raises(TypeError, match=r"`remat.apply`"):
        remat.apply(3, "full")
    with pytest.raises(ValueError, match=r"`remat.apply`.*'fulll'.*none"):
        remat.apply(mlp, "fulll")
    if not offload_available():  # e.g. CPU: no separate host memory space to offload to
        with pytest.raises(ValueError, match=r"`remat.apply`.*'offload:a'.*names:a"):
            remat.apply(mlp, "offload:a")
    with pytest.raises(TypeError, match=r"`remat.list_scans`"):
        remat.list_scans("f")


def test_rewrite_scans_gives_transform_the_body_jaxpr():
    """The planner's hook: tag the body's matmul outputs and save only those."""
    from jax.ad_checkpoint import checkpoint_name

    seen = []

    def transform(info, body):
        seen.append((info.num_consts, info.num_carry, len(info.jaxpr.jaxpr.invars)))

        def tag(eqn, i, value):
            return checkpoint_name(value, "dot") if eqn.primitive.name == "dot_general" else value

        def tagged(consts, carry, xs):
            return body(consts, carry, xs, tag=tag)

        policy = jax.checkpoint_policies.save_only_these_names("dot")
        return jax.checkpoint(tagged, policy=policy, prevent_cse=False)

    args = mlp_args()
    f2 = rewrite_scans(mlp, transform)
    check_twin(mlp, f2, *args)
    assert seen[0] == (0, 1, 2)  # the body jaxpr: inputs consts + carry + xs
    # Like "dots": the carry and the two tagged matmul outputs per layer.
    assert n_residuals(f2, *args, shape=(L, B, D)) == 3
    assert n_residuals(rewrite_scans(mlp, lambda info, body: None), *args, shape=(L, B, D)) == 4


### Flax linen, Flax NNX and Equinox layer stacks


def test_flax_linen_scan():
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return jnp.sin(nn.Dense(D)(h)), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, h):
            scanned = nn.scan(
                Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=L
            )
            return scanned(name="layers")(h, None)[0]

    model, x = Stack(), mlp_args()[1]
    params = model.init(jax.random.key(0), x)

    def loss(params, x):
        return jnp.sum(model.apply(params, x) ** 2)

    assert [(s.name, s.length) for s in remat.list_scans(loss, params, x)] == [("Stack", L)]
    f2 = remat.apply(loss, "full")
    check_twin(loss, f2, params, x)
    assert n_residuals(loss, params, x, shape=(L, B, D)) > 1
    assert n_residuals(f2, params, x, shape=(L, B, D)) == 1


def test_two_linen_scans_of_one_call_are_selected_by_their_modules():
    """Both scans are named after the calling module; each body's module selects it."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return jnp.sin(nn.Dense(D)(h)), None

    class Two(nn.Module):
        @nn.compact
        def __call__(self, h):
            stack = functools.partial(nn.scan, variable_axes={"params": 0}, length=L)
            h = stack(nn.remat(Block), split_rngs={"params": True})(name="layers")(h, None)[0]
            return stack(Block, split_rngs={"params": True})(name="head")(h, None)[0]

    model, x = Two(), mlp_args()[1]
    params = model.init(jax.random.key(0), x)

    def loss(params, x):
        return jnp.sum(model.apply(params, x) ** 2)

    scans = remat.list_scans(loss, params, x)
    assert [(s.name, s.module) for s in scans] == [("Two", "layers"), ("Two", "head")]
    f2 = remat.apply(loss, remat.Strategy("full", scans=("head",)))
    check_twin(loss, f2, params, x)
    for f, marked in ((loss, [True, False]), (f2, [True, True])):  # the user's, then "head"
        assert [
            own for _, own in scans_with_checkpoint(jax.make_jaxpr(f)(params, x).jaxpr, [])
        ] == marked
    with pytest.raises(ValueError, match=r"0: Two \(body layers\), 1: Two \(body head\)"):
        remat.apply(loss, remat.Strategy("full", scans=("tied",)))(params, x)


def test_flax_nnx_scan():
    loss, state = nnx_stack(L, D)
    x = mlp_args()[1]
    f2 = remat.apply(loss, "full")
    check_twin(loss, f2, state, x)
    assert n_residuals(loss, state, x, shape=(L, B, D)) > 1
    assert n_residuals(f2, state, x, shape=(L, B, D)) == 1


def test_equinox_stacked_layers():
    eqx = pytest.importorskip("equinox")
    keys = jax.random.split(jax.random.key(0), L)
    layers = eqx.filter_vmap(lambda k: eqx.nn.Linear(D, D, key=k))(keys)
    params, static = eqx.partition(layers, eqx.is_array)

    def loss(params, x):
        def body(h, p):
            return jnp.sin(jax.vmap(eqx.combine(p, static))(h)), None

        return jnp.sum(lax.scan(body, x, params)[0] ** 2)

    x = mlp_args()[1]
    f2 = remat.apply(loss, "full")
    check_twin(loss, f2, params, x)
    assert n_residuals(loss, params, x, shape=(L, B, D)) > 1
    assert n_residuals(f2, params, x, shape=(L, B, D)) == 1


@pytest.mark.parametrize("form", ["scan", "loop"])
def test_apply_inside_shard_map_with_its_checks(form):
    """Inside `jax.shard_map` (its replication checks on, the default) a batch shard varies
    over the mesh axis and the weights do not; the rewritten program is traced with that, so
    `remat.apply` keeps the `pvary` JAX puts where they meet. Gradients equal the plain ones,
    for a scan and for layers in a Python loop (rolled)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def loss(ws, x):
        if form == "scan":
            return jnp.mean(jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0] ** 2)
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.mean(x**2)

    mesh = jax.make_mesh((1,), ("data",))
    ws = jax.random.normal(jax.random.key(0), (4, 8, 8)) / 3
    ws = ws if form == "scan" else list(ws)
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data")))

    def step(f):
        def per_device(ws, x):
            value, grads = jax.value_and_grad(f)(ws, x)
            return jax.lax.pmean((value, grads), "data")

        return jax.jit(
            jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
        )

    assert_tree_allclose(step(remat.apply(loss, "full"))(ws, x), step(loss)(ws, x))
