"""Rolling layers written as a Python loop into a scan: detection, values, gradients, memory."""

from __future__ import annotations

import os
import time

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.extend import core as jcore

import remat
from conftest import assert_tree_allclose
from remat._measure._peak import peak_bytes
from remat._trace._roll_dataflow import _Flow, _phase
from remat._trace._roll_detect import find_runs
from remat._trace._roll_explain import explain_no_roll
from remat._trace._roll_lift import lift_layer_constants
from remat._trace._roll_rewrite import list_runs, roll, roll_jaxpr

W = 8  # width of the tiny models
X = jnp.linspace(-1.0, 1.0, 2 * W).reshape(2, W)


def check(loss, params, *args, lengths, scale=10.0, override=False):
    """Asserts the runs' lengths, the rolled scans `remat.list_scans` shows, and that
    ``remat.apply(loss, "full")`` (rolled by default, every layer checkpointed) equals
    ``loss`` with its gradient: one compile of each. Layers that checkpoint already need
    ``override=True`` for the strategy to replace their checkpoints (else they are kept)."""
    runs = list_runs(loss, params, *args)
    assert [r.length for r in runs] == lengths, runs
    scans = remat.list_scans(loss, params, *args)
    assert [s.name for s in scans] == rolled_names(lengths)
    assert [s.length for s in scans] == lengths
    assert [s.stacked for s in scans] == [r.stacked for r in runs]
    assert [s.source for s in scans] == [r.source for r in runs]
    # with nothing to roll, `apply` warns; `roll` evaluates the program as written
    rolled = remat.apply(loss, "full", override=override) if lengths else roll(loss)
    want = jax.jit(jax.value_and_grad(loss))(params, *args)
    got = jax.jit(jax.value_and_grad(rolled))(params, *args)
    assert_tree_allclose(got, want, scale=scale)
    return runs


def rolled_names(lengths):
    """``rolled_{k}_layers``, numbered from ``_2`` for a later run of as many layers."""
    names = []
    for k in lengths:
        base = f"rolled_{k}_layers"
        n = sum(name.startswith(base) for name in names)
        names.append(base if n == 0 else f"{base}_{n + 1}")
    return names


def test_runs_of_equal_length_get_names_that_select_one_scan():
    """An encoder and a decoder of three layers each (different layers, so two runs): the
    second is ``rolled_3_layers_2``, and a strategy naming either checkpoints that scan alone."""

    def loss(params, x):
        enc, dec = params
        for w in enc:
            x = jnp.tanh(x @ w)
        for w in dec:
            x = jax.nn.relu(x @ w) * 2.0
        return (x**2).sum()

    keys = jax.random.split(jax.random.key(3), 6)
    ws = [jax.random.normal(k, (W, W)) / W**0.5 for k in keys]
    params = (ws[:3], ws[3:])
    check(loss, params, X, lengths=[3, 3])
    first, second = remat.list_scans(loss, params, X)
    assert (first.name, second.name) == ("rolled_3_layers", "rolled_3_layers_2")
    plain = jax.jit(jax.value_and_grad(loss))(params, X)
    for name, touched in (("rolled_3_layers", 0), ("rolled_3_layers_2", 1)):
        step = remat.apply(loss, remat.Strategy(policy="full", scans=(name,)))
        assert_tree_allclose(jax.jit(jax.value_and_grad(step))(params, X), plain)
        bodies = scan_bodies(jax.make_jaxpr(step)(params, X).jaxpr)
        checkpointed = [
            any(e.primitive.name in ("checkpoint", "remat2") for e in b.eqns) for b in bodies
        ]
        assert checkpointed == [i == touched for i in range(2)], (name, checkpointed)


def scan_bodies(jaxpr):
    """The body of each scan in ``jaxpr``, depth first (inside calls too)."""
    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "scan":
            out.append(e.params["jaxpr"].jaxpr)
        else:
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                out.extend(scan_bodies(sub))
    return out


def dense_params(key, widths):
    keys = jax.random.split(key, len(widths) - 1)
    return [
        {"w": jax.random.normal(k, (a, b)) / a**0.5, "b": jnp.full((b,), 0.01)}
        for k, a, b in zip(keys, widths[:-1], widths[1:], strict=True)
    ]


### Plain JAX


def mlp_loss(params, x):
    for p in params:
        x = x + jnp.tanh(x @ p["w"] + p["b"])
    return jnp.sum(x**2)


def test_plain_jax_list_of_dicts():
    (run,) = check(mlp_loss, dense_params(jax.random.key(0), [W] * 5), X, lengths=[4])
    assert len(run.stacked) == 2 and len(run.carry) == 1
    assert run.source.endswith("test_roll.py:" + str(mlp_loss.__code__.co_firstlineno + 2))


def test_first_layer_of_another_width_stays_outside():
    def loss(params, x):
        x = jnp.tanh(x @ params[0]["w"])
        return mlp_loss(params[1:], x)

    params = dense_params(jax.random.key(1), [4] + [W] * 5)
    (run,) = check(loss, params, X[:, :4], lengths=[4])
    assert run.stacked[0].shape == (W, W)


def test_a_sum_started_from_a_constant_rolls_with_the_first_layer():
    # `aux = 0.0`, then `aux = aux + ...` in every layer (a mixture of experts' balance
    # loss): the first layer reads the constant where the others read the previous layer's
    # sum, and the constant is the carry's initial value
    def loss(params, x):
        aux = 0.0
        for p in params:
            x = x + jnp.tanh(x @ p["w"] + p["b"])
            aux = aux + jnp.mean(x**2)
        return jnp.sum(x**2) + 0.1 * aux

    (run,) = check(loss, dense_params(jax.random.key(2), [W] * 5), X, lengths=[4])
    assert [c.shape for c in run.carry] == [X.shape, ()]


def test_a_layer_before_the_run_reading_more_values_stays_outside():
    # the layer before is checked too (it may start a sum from a constant); here its second
    # equation reads only outside values, as the layers' second does, but two, not one
    def loss(params, w0, x):
        x = jnp.tanh(x) @ (w0 * 0.9)
        for w in params:
            x = jnp.tanh(x) @ w.T
        return jnp.sum(x**2)

    ws = [jax.random.normal(k, (W, W)) / 3 for k in jax.random.split(jax.random.key(3), 5)]
    check(loss, ws[1:], ws[0], X, lengths=[4])


def test_two_runs_encoder_decoder():
    def loss(params, x):
        enc, proj, dec = params
        x = mlp_loss.__wrapped__(enc, x) if hasattr(mlp_loss, "__wrapped__") else x
        for p in enc:
            x = x + jnp.tanh(x @ p["w"] + p["b"])
        y = x @ proj
        for p in dec:
            y = y * jax.nn.sigmoid(y @ p["w"]) + p["b"]
        return jnp.sum(y**2)

    key = jax.random.key(2)
    params = (
        dense_params(key, [W] * 4),
        jnp.ones((W, 2 * W)) / W,
        dense_params(key, [2 * W] * 6),
    )
    runs = check(loss, params, X, lengths=[3, 5])
    assert [r.carry[0].shape for r in runs] == [(2, W), (2, 2 * W)]


def test_hidden_states_of_every_layer_are_per_layer_outputs():
    def loss(params, x):
        states = []
        for p in params:
            x = x + jnp.tanh(x @ p["w"] + p["b"])
            states.append(x)
        return jnp.sum(jnp.stack(states) ** 2)

    (run,) = check(loss, dense_params(jax.random.key(3), [W] * 5), X, lengths=[4])
    assert run.plan.ys  # every layer's state leaves the scan as ys


def test_per_layer_dropout_keys_from_split():
    def loss(params, x, key):
        keys = jax.random.split(key, len(params))
        for p, k in zip(params, keys, strict=True):
            h = jnp.tanh(x @ p["w"] + p["b"])
            keep = jax.random.bernoulli(k, 0.8, h.shape)
            x = x + jnp.where(keep, h / 0.8, 0.0)
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(4), [W] * 5)
    (run,) = check(loss, params, X, jax.random.key(7), lengths=[4])
    assert run.hoisted  # keys[i] slices with a per-layer index: evaluated before the scan


def test_layers_already_checkpointed_and_jitted():
    @jax.checkpoint
    def layer(p, x):
        return x + jax.nn.gelu(x @ p["w"] + p["b"], approximate=False)

    @jax.jit
    def jitted(p, x):
        return x * jax.nn.softmax(x @ p["w"])

    def loss(params, x):
        for p in params[:4]:
            x = layer(p, x)
        for p in params[4:]:
            x = jitted(p, x)
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(5), [W] * 8)
    runs = check(loss, params, X, lengths=[4, 3], override=True)
    # without override, the layers' own checkpoints are kept, and `apply` says so
    with pytest.warns(remat.RematWarning, match="kept the program's own checkpoints"):
        kept = remat.apply(loss, "full")
        assert_tree_allclose(jax.grad(kept)(params, X), jax.grad(loss)(params, X))
    assert [r.period for r in runs] == [1, 1]


def test_no_repetition_says_why():
    def loss(w, x):
        return jnp.sum(jnp.sin(x @ w) ** 2)

    check(loss, jnp.eye(W), X, lengths=[])
    why = explain_no_roll(jax.make_jaxpr(loss)(jnp.eye(W), X))
    assert why.startswith("no repeated structure found"), why


def test_widths_that_all_differ_say_which_layer():
    def loss(params, x):
        for p in params:
            x = jnp.tanh(x @ p["w"])
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(6), [W, 2 * W, 3 * W, 4 * W])
    check(loss, params, X, lengths=[])
    why = explain_no_roll(jax.make_jaxpr(loss)(params, X))
    assert why.startswith(f"layer at eqn 2 ({os.path.relpath(__file__)}:"), why
    assert "differs from the one before it: dot_general input" in why, why


def test_a_debug_print_in_each_layer_is_named_as_the_side_effect():
    def loss(params, x):
        for p in params:
            x = jnp.tanh(x @ p["w"])
            jax.debug.print("{m}", m=x.sum())
        return jnp.sum(x**2)

    why = explain_no_roll(jax.make_jaxpr(loss)([{"w": jnp.eye(W)}] * 3, X))
    assert "debug_print has a side effect" in why, why
    assert "parameters differ" not in why, why


def beside_scans(params, x):
    """A `lax.scan` over two stacked layers (scan 0), three more layers in a Python loop, and
    a loss chunked with `lax.map` over four chunks (scan 1)."""

    def layer(p, h):
        return jnp.tanh(h @ p["w"])

    with jax.named_scope("stack"):
        x, _ = jax.lax.scan(lambda h, p: (layer(p, h), None), x, params["stack"])
    for p in params["loop"]:
        x = layer(p, x)
    return jax.lax.map(lambda h: jnp.sum(h**2), x.reshape(4, -1, W)).sum()


BESIDE = {"stack": {"w": jnp.stack([jnp.eye(W)] * 2)}, "loop": [{"w": jnp.eye(W) * 0.9}] * 3}
XB = jnp.linspace(-1.0, 1.0, 8 * W).reshape(8, W)


def checkpointed_lengths(fn, *args):
    """The lengths of the top-level scans of ``fn``'s program whose body checkpoints."""
    eqns = jax.make_jaxpr(fn)(*args).eqns
    return sorted(
        e.params["length"]
        for e in eqns
        if e.primitive.name == "scan"
        and any(s.primitive is jcore.primitives.remat_p for s in e.params["jaxpr"].eqns)
    )


def test_layers_beside_scans_roll_after_them():
    """The program's own scans keep their positions and names; the rolled layers are scan 2,
    checkpointed like any other, with the gradients of the program as written."""
    written = remat.list_scans(beside_scans, BESIDE, XB, roll=False)
    scans = remat.list_scans(beside_scans, BESIDE, XB)
    assert [(s.position, s.name, s.length) for s in written] == [(0, "stack", 2), (1, "", 4)]
    assert scans[:2] == written
    rolled = scans[2]
    assert (rolled.position, rolled.name, rolled.length) == (2, "rolled_3_layers", 3)
    assert rolled.stacked == next(r.stacked for r in list_runs(beside_scans, BESIDE, XB))
    full = remat.apply(beside_scans, "full")
    assert checkpointed_lengths(full, BESIDE, XB) == [2, 3, 4]
    want = jax.jit(jax.value_and_grad(beside_scans))(BESIDE, XB)
    assert_tree_allclose(jax.jit(jax.value_and_grad(full))(BESIDE, XB), want, scale=10.0)


@pytest.mark.parametrize(("selected", "lengths"), [(0, [2]), (1, [4]), ("stack", [2]), (2, [3])])
def test_a_strategy_naming_a_scan_beside_rolled_layers_selects_it(selected, lengths):
    strategy = remat.Strategy(policy="full", scans=(selected,))
    assert checkpointed_lengths(remat.apply(beside_scans, strategy), BESIDE, XB) == lengths


def test_layers_that_each_hold_a_scan_are_left_as_written():
    """One rolled scan would fold the layers' scans into one and renumber them: `apply` warns
    and leaves the layers, whose scans keep their positions."""

    def loss(ws, x):
        for w in ws:
            x = jax.lax.scan(lambda c, v: (jnp.tanh(c * v), None), x, w)[0]
        return jnp.sum(x**2)

    ws = [jnp.ones((2, W))] * 3
    assert list_runs(loss, ws, X) == []
    assert remat.list_scans(loss, ws, X) == remat.list_scans(loss, ws, X, roll=False)
    with pytest.warns(
        remat.RematWarning, match=r"left the repeated layers \(3 at .*\) as written: each"
    ):
        assert checkpointed_lengths(remat.apply(loss, "full"), ws, X) == [2, 2, 2]


### Flax linen


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + nn.Dense(W)(jax.nn.gelu(nn.LayerNorm()(x)))


class LinenSetup(nn.Module):
    n: int = 4

    def setup(self):
        self.blocks = [LinenBlock() for _ in range(self.n)]

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return jnp.sum(x**2)


class LinenCompact(nn.Module):
    n: int = 4
    remat_blocks: bool = False
    dropout: bool = False

    @nn.compact
    def __call__(self, x):
        block = nn.remat(LinenBlock) if self.remat_blocks else LinenBlock
        for _ in range(self.n):
            x = block()(x)
            if self.dropout:
                x = nn.Dropout(0.2, deterministic=False)(x)
        return jnp.sum(x**2)


@pytest.mark.parametrize(
    "model", [LinenSetup(), LinenCompact(), LinenCompact(remat_blocks=True)], ids=str
)
def test_linen(model):
    params = model.init(jax.random.key(0), X)
    check(model.apply, params, X, lengths=[4], override=getattr(model, "remat_blocks", False))


def test_linen_dropout_rngs():
    model = LinenCompact(dropout=True)
    params = model.init(jax.random.key(0), X)

    def loss(params, x, key):
        return model.apply(params, x, rngs={"dropout": key})

    (run,) = check(loss, params, X, jax.random.key(3), lengths=[4])
    assert run.hoisted  # linen folds a per-layer constant into the key


class LinenDropBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dropout(0.5, deterministic=False)(jax.nn.gelu(nn.Dense(W)(x)))
        return x + h


class LinenRematDropout(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(4):
            x = nn.remat(LinenDropBlock)()(x)
        return jnp.sum(x**2)


@pytest.mark.parametrize("override", [False, True])
def test_linen_remat_blocks_drawing_dropout_roll(override):
    """Dropout inside `nn.remat`: linen folds a per-layer constant into the key inside each
    checkpoint; it is lifted out and hoisted, so the layers roll and each layer still draws
    its own mask (values equal the loop's, which they would not with layer 0's mask)."""
    model = LinenRematDropout()
    params = model.init(jax.random.key(0), X)

    def loss(params, x, key):
        return model.apply(params, x, rngs={"dropout": key})

    closed = jax.make_jaxpr(loss)(params, X, jax.random.key(3))
    assert not find_runs(closed)  # as traced, every checkpoint folds its own literal
    if override:
        (run,) = check(loss, params, X, jax.random.key(3), lengths=[4], override=True)
    else:  # the user's checkpoints are kept, now around each step of the rolled scan
        with pytest.warns(remat.RematWarning, match="kept the program's own checkpoints"):
            (run,) = check(loss, params, X, jax.random.key(3), lengths=[4])
    assert run.hoisted == 1 and run.period == 2
    assert jax.ShapeDtypeStruct((), jnp.uint32) in run.stacked


def test_checkpoints_folding_one_constant_are_left_as_they_are():
    """Only constants that differ between checkpoints are lifted: a program whose
    checkpoints fold the same literal rolls as it always did, the jaxpr untouched."""

    def loss(ws, x, key):
        for w in ws:
            x = jax.checkpoint(lambda x, w: x * jax.random.uniform(jax.random.fold_in(key, 7)) @ w)(
                x, w
            )
        return jnp.sum(x)

    ws = [jnp.eye(W)] * 3
    closed = jax.make_jaxpr(loss)(ws, X, jax.random.key(0))
    assert lift_layer_constants(closed) is closed
    (run,) = find_runs(closed)
    assert run.length == 3 and run.hoisted == 0


### Flax nnx


class NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.LayerNorm(W, rngs=rngs)
        self.linear = nnx.Linear(W, W, rngs=rngs)

    def __call__(self, x):
        return x + self.linear(jax.nn.gelu(self.norm(x)))


class NnxModel(nnx.Module):
    def __init__(self, n, rngs, as_list):
        blocks = [NnxBlock(rngs) for _ in range(n)]
        self.blocks = nnx.data(blocks) if as_list else nnx.List(blocks)

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return jnp.sum(x**2)


@pytest.mark.parametrize("as_list", [False, True], ids=["nnx.List", "list"])
def test_nnx(as_list):
    graphdef, state = nnx.split(NnxModel(4, nnx.Rngs(0), as_list))

    def loss(state, x):
        return nnx.merge(graphdef, state)(x)

    check(loss, state, X, lengths=[4])


### Equinox


class EqxBlock(eqx.Module):
    linear: eqx.nn.Linear
    norm: eqx.nn.LayerNorm

    def __init__(self, key):
        self.linear = eqx.nn.Linear(W, W, key=key)
        self.norm = eqx.nn.LayerNorm(W)

    def __call__(self, x):
        return x + self.linear(jax.nn.gelu(self.norm(x)))


def test_equinox_list_of_modules():
    blocks = [EqxBlock(k) for k in jax.random.split(jax.random.key(0), 4)]

    def loss(blocks, x):
        for b in blocks:
            x = b(x)
        return jnp.sum(x**2)

    check(loss, blocks, X[0], lengths=[4])


### A transformer


def attention_block(p, x, mask):
    def norm(h, g):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g

    h = norm(x, p["g1"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    a = jax.nn.softmax(jnp.where(mask, q @ k.T / W**0.5, -1e9), axis=-1)
    x = x + (a @ v) @ p["o"]
    return x + jax.nn.gelu(norm(x, p["g2"]) @ p["up"], approximate=False) @ p["down"]


def transformer_params(key, layers):
    def one(k):
        ks = jax.random.split(k, 4)
        return {
            "g1": jnp.ones(W),
            "qkv": jax.random.normal(ks[0], (W, 3 * W)) / W**0.5,
            "o": jax.random.normal(ks[1], (W, W)) / W**0.5,
            "g2": jnp.ones(W),
            "up": jax.random.normal(ks[2], (W, 4 * W)) / W**0.5,
            "down": jax.random.normal(ks[3], (4 * W, W)) / (4 * W) ** 0.5,
        }

    return {
        "embed": jax.random.normal(key, (16, W)),
        "layers": [one(k) for k in jax.random.split(key, layers)],
    }


def transformer_loss(params, tokens):
    x = params["embed"][tokens]
    mask = jnp.tril(jnp.ones((tokens.shape[0],) * 2, bool))
    for p in params["layers"]:
        x = attention_block(p, x, mask)
    return jnp.mean(x**2)


def test_transformer_four_layers():
    params, tokens = transformer_params(jax.random.key(0), 4), jnp.arange(12) % 16
    (run,) = check(transformer_loss, params, tokens, lengths=[4])
    assert len(run.stacked) == 6 and len(run.shared) == 1  # six weights; the mask is shared
    assert len(run.carry) == 1 and run.period > 40


def test_rolled_and_checkpointed_peak_is_below_as_written():
    """Activations dominate: 8 layers of a (512, 16) stream through a 4x wider MLP."""

    def loss(params, x):
        for p in params:
            x = x + jnp.tanh(jnp.tanh(x @ p["up"]) @ p["down"])
        return jnp.mean(x**2)

    key = jax.random.key(0)
    params = [
        {"up": jax.random.normal(k, (16, 64)) / 4, "down": jax.random.normal(k, (64, 16)) / 8}
        for k in jax.random.split(key, 8)
    ]
    x = jax.random.normal(key, (512, 16))

    def compiled(fn):
        return jax.jit(jax.value_and_grad(fn)).lower(params, x).compile()

    plain, rolled = compiled(loss), compiled(remat.apply(roll(loss), "full"))
    assert_tree_allclose(rolled(params, x), plain(params, x), scale=10.0)  # one compile each
    written, checkpointed = peak_bytes(plain), peak_bytes(rolled)
    print(f"peak as written {written} B, rolled + full {checkpointed} B")
    assert checkpointed < 0.7 * written


def test_two_hundred_layers_in_seconds():
    params = [{"w": jnp.eye(4) * 0.5, "b": jnp.zeros(4)} for _ in range(200)]
    x = jnp.ones((2, 4))
    t0 = time.perf_counter()
    closed = jax.make_jaxpr(mlp_loss)(params, x)
    t1 = time.perf_counter()
    (run,) = find_runs(closed)
    rolled = roll_jaxpr(closed, [run])
    t2 = time.perf_counter()
    print(
        f"200 layers, {len(closed.eqns)} eqns: trace {t1 - t0:.2f} s, detect+roll {t2 - t1:.2f} s"
    )
    assert run.length == 200 and sum(e.primitive.name == "scan" for e in rolled.eqns) == 1
    assert t2 - t1 < 10


def test_custom_vjp_layers_inside_a_jitted_loss():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

    @jax.jit
    def inner(params, x):
        for p in params:
            x = x + clip_grad(jnp.tanh(x @ p["w"] + p["b"]))
        return jnp.sum(x**2)

    def loss(params, x):
        return inner(params, x)

    (run,) = check(loss, dense_params(jax.random.key(8), [W] * 5), X, lengths=[4])
    assert run.path == (0,)  # inside the jit


def test_a_key_made_for_the_next_layer_is_carried_from_the_hoisted_equations():
    def loss(params, x, key):
        prev = key
        for i, p in enumerate(params):
            k = jax.random.fold_in(key, i)  # per-layer literal: hoisted
            x = x + jnp.tanh(x @ p["w"]) * jax.random.uniform(prev, x.shape)
            prev = k  # read by the next layer: a carry made by a hoisted equation
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(9), [W] * 5)
    (run,) = check(loss, params, X, jax.random.key(1), lengths=[4])
    assert run.hoisted and any(kind == "xs" for kind, _ in run.plan.carry_out)


def test_a_chain_of_single_plain_equations_is_not_a_run():
    # BERT's embeddings are summed as `words + token_types + positions`: two identical adds
    # in a chain, which rolled would be a scan with nothing to recompute.
    def loss(params, x, a, b):
        x = x + a + b
        for p in params:
            x = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(3), [W] * 5)
    (run,) = check(loss, params, X, X, X, lengths=[4])
    assert run.period > 1
    assert find_runs(jax.make_jaxpr(lambda x, a, b: x + a + b)(X, X, X)) == []


def test_layers_of_two_kinds_in_turn_roll_as_pairs():
    # GPT-Neo alternates global and local attention: the layers differ, the pairs repeat,
    # and the pair's period is only the gap to a token's occurrence before the last (the
    # layer's tanh-sin chain makes 24 more frequent gaps).
    def loss(params, x):
        for i, p in enumerate(params):
            h = x @ p["w"]
            for j in range(1, 25):
                h = jnp.tanh(h)
                for _ in range(j):
                    h = jnp.sin(h)
            x = x + (jnp.cos(h) if i % 2 else h) + p["b"]  # the local kind: one more equation
        return jnp.sum(x**2)

    params = dense_params(jax.random.key(4), [W] * 5)
    (run,) = check(loss, params, X, lengths=[2])
    assert run.start == 0 and run.period == len(jax.make_jaxpr(loss)(params[:2], X).eqns) - 2


def test_the_layers_start_leaves_two_layers_in_a_short_window():
    # Two layers of two residual blocks, with an equation before them and two after that
    # repeat a layer's ends (GPT-Neo's embedding sum and final norm): the window is two
    # layers and three equations. After a block's residual add one value crosses, as at a
    # layer's start, but at one boundary fewer in the window; a start there leaves one layer.
    def f(ws, x):
        x = x * 2.0
        for w in ws:
            x = x + jnp.tanh(x @ w)
            x = x + jnp.sin(x)
        return jnp.tanh(x @ ws[0])

    jaxpr = jax.make_jaxpr(f)([jnp.eye(W)] * 2, X).jaxpr
    period = (len(jaxpr.eqns) - 3) // 2
    assert [e.primitive.name for e in jaxpr.eqns[1 : 1 + period]] == [
        "dot_general",
        "tanh",
        "add",
        "sin",
        "add",
    ]
    assert _phase(_Flow.of(jaxpr), 0, len(jaxpr.eqns), period) == 1
