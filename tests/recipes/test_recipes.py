"""The five seed recipes: each equals its un-checkpointed twin (written here), and really checkpoints.

"Really checkpoints" is read from the traced program: the gradient's jaxpr holds a `remat2`
(`jax.checkpoint`) equation, the saved residuals differ from the plain twin's as the seed says,
recomputation is counted in the backward pass, and for the scanned stack the compiled program's
memory is smaller.
"""

from collections import Counter

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax._src.ad_checkpoint import saved_residuals

from conftest import assert_tree_allclose
from remat import recipes
from remat._measure._step import ANALYSIS_OPTIONS  # compiled to be read, as remat does
from remat.recipes import _block, _linen, _nnx, _stack

# --- helpers that read the traced program ---


def _sub_jaxprs(value):
    if isinstance(value, jax.extend.core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax.extend.core.Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _sub_jaxprs(item)


def primitive_counts(jaxpr) -> Counter:
    """How often each primitive occurs in ``jaxpr``, nested jaxprs (scan, remat, jit) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    counts = Counter()
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] += 1
        for param in eqn.params.values():
            for sub in _sub_jaxprs(param):
                counts += primitive_counts(sub)
    return counts


def saved_intermediates(f, *args):
    """The residuals `jax.vjp` of ``f`` keeps that are not ``f``'s own arguments."""
    return [
        (aval, src)
        for aval, src in saved_residuals(f, *args)
        if not src.startswith("from the argument")
    ]


def _normal(seed, shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


# --- 1. nn_checkpoint_forward: a linen class lifted with nn.checkpoint ---


class PlainMLP(nn.Module):
    """The un-lifted twin of recipe 1."""

    features: int

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.features)(x)
        x = nn.relu(x)
        return nn.Dense(self.features)(x)


LINEN_CASES = [(0, 4, 3), (1, 1, 5), (7, 6, 2)]  # (seed, D, F)


def check_linen_forward(recipe, twin, seed, d, f):
    """``recipe(seed, x, f)`` equals the un-lifted ``twin``'s flattened output."""
    x = _normal(seed + 100, (d,))
    expected = twin.apply(twin.init(jax.random.PRNGKey(seed), x), x).reshape(-1)
    out = recipe(seed, x, f)
    assert out.shape == (f,)
    assert_tree_allclose(out, expected)


def check_linen_gradients(twin, lifted, seed, d, f):
    """The lifted class has the twin's parameters and gradients (w.r.t. params and input)."""
    x = _normal(seed + 100, (d,))
    params = twin.init(jax.random.PRNGKey(seed), x)
    # The lift does not change the parameters either.
    assert_tree_allclose(lifted.init(jax.random.PRNGKey(seed), x), params)

    def loss(module):
        return lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))

    argnums = (0, 1)
    assert_tree_allclose(
        jax.grad(loss(lifted), argnums)(params, x), jax.grad(loss(twin), argnums)(params, x)
    )


@pytest.mark.parametrize("seed, d, f", LINEN_CASES)
def test_nn_checkpoint_forward_equals_plain_mlp(seed, d, f):
    check_linen_forward(recipes.nn_checkpoint_forward, PlainMLP(features=f), seed, d, f)


@pytest.mark.parametrize("seed, d, f", LINEN_CASES)
def test_nn_checkpoint_gradients_equal_plain_mlp(seed, d, f):
    check_linen_gradients(PlainMLP(features=f), _linen.CheckpointMLP(features=f), seed, d, f)


def test_nn_checkpoint_saves_no_activation():
    x = _normal(0, (4,))
    twin, lifted = PlainMLP(features=3), _linen.CheckpointMLP(features=3)
    params = twin.init(jax.random.PRNGKey(0), x)

    def loss(module):
        return lambda p, x: jnp.sum(module.apply(p, x))

    assert primitive_counts(jax.make_jaxpr(jax.grad(loss(lifted)))(params, x))["remat2"] >= 1
    assert primitive_counts(jax.make_jaxpr(jax.grad(loss(twin)))(params, x))["remat2"] == 0
    # Without a policy nothing computed inside the module is kept; the plain MLP keeps the
    # ReLU's mask (a bool) for the backward pass.
    assert saved_intermediates(loss(lifted), params, x) == []
    plain = saved_intermediates(loss(twin), params, x)
    assert any(aval.dtype == jnp.bool_ for aval, _ in plain)


# --- 2. checkpoint_forward: an nnx MLP whose forward is wrapped with nnx.remat ---


class PlainNnxMLP(nnx.Module):
    """The un-rematted twin of recipe 2."""

    def __init__(self, num_layers, features, *, rngs):
        self.layers = nnx.List(
            [nnx.Linear(features, features, rngs=rngs) for _ in range(num_layers)]
        )

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


NNX_CASES = [(0, 3, 1), (1, 4, 2), (5, 2, 4)]  # (seed, F, N)


@pytest.mark.parametrize("seed, f, n", NNX_CASES)
def test_checkpoint_forward_equals_plain_mlp(seed, f, n):
    x = _normal(seed + 100, (f,))
    twin = PlainNnxMLP(n, f, rngs=nnx.Rngs(seed))
    expected = twin(x).reshape(-1)
    assert_tree_allclose(recipes.checkpoint_forward(seed, x, f, n), expected)
    # Floats are cast to int.
    assert_tree_allclose(recipes.checkpoint_forward(float(seed), x, float(f), float(n)), expected)


@pytest.mark.parametrize("seed, f, n", NNX_CASES)
def test_checkpoint_forward_gradients_equal_plain_mlp(seed, f, n):
    x = _normal(seed + 100, (f,))
    twin_def, twin_state = nnx.split(PlainNnxMLP(n, f, rngs=nnx.Rngs(seed)))
    model_def, model_state = nnx.split(_nnx.MLP(n, f, rngs=nnx.Rngs(seed)))
    assert_tree_allclose(model_state, twin_state)  # same parameters from the same seed

    def remat_loss(state, x):
        return jnp.sum(jnp.sin(_nnx.remat_forward(nnx.merge(model_def, state), x)))

    def plain_loss(state, x):
        return jnp.sum(jnp.sin(nnx.merge(twin_def, state)(x)))

    argnums = (0, 1)
    assert_tree_allclose(
        jax.grad(remat_loss, argnums)(twin_state, x), jax.grad(plain_loss, argnums)(twin_state, x)
    )


def test_checkpoint_forward_saves_no_activation():
    x = _normal(0, (3,))
    twin_def, state = nnx.split(PlainNnxMLP(2, 3, rngs=nnx.Rngs(0)))
    model_def, _ = nnx.split(_nnx.MLP(2, 3, rngs=nnx.Rngs(0)))

    def remat_loss(state, x):
        return jnp.sum(_nnx.remat_forward(nnx.merge(model_def, state), x))

    def plain_loss(state, x):
        return jnp.sum(nnx.merge(twin_def, state)(x))

    assert primitive_counts(jax.make_jaxpr(jax.grad(remat_loss))(state, x))["remat2"] >= 1
    assert primitive_counts(jax.make_jaxpr(jax.grad(plain_loss))(state, x))["remat2"] == 0
    assert saved_intermediates(remat_loss, state, x) == []
    plain = saved_intermediates(plain_loss, state, x)
    assert sum(aval.dtype == jnp.bool_ for aval, _ in plain) == 2  # one ReLU mask per layer


# --- 3. nn_remat_policy: a linen class lifted with nn.remat and a saving policy ---


class PlainDeepMLP(nn.Module):
    """The un-lifted twin of recipe 3."""

    features: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.features)(x))
        x = nn.relu(nn.Dense(self.features)(x))
        return nn.Dense(self.features)(x)


@pytest.mark.parametrize("seed, d, f", LINEN_CASES)
def test_nn_remat_policy_equals_plain_mlp(seed, d, f):
    check_linen_forward(recipes.nn_remat_policy, PlainDeepMLP(features=f), seed, d, f)


@pytest.mark.parametrize("seed, d, f", LINEN_CASES)
def test_nn_remat_policy_gradients_equal_plain_mlp(seed, d, f):
    twin, lifted = PlainDeepMLP(features=f), _linen.PolicyRematMLP(features=f)
    check_linen_gradients(twin, lifted, seed, d, f)


def test_nn_remat_policy_saves_the_dots_and_recomputes_the_relus():
    x = _normal(0, (4,))
    twin, lifted = PlainDeepMLP(features=3), _linen.PolicyRematMLP(features=3)
    params = twin.init(jax.random.PRNGKey(0), x)

    def loss(module):
        return lambda p, x: jnp.sum(module.apply(p, x))

    grad_jaxpr = jax.make_jaxpr(jax.grad(loss(lifted)))(params, x)
    remats = [e for e in grad_jaxpr.jaxpr.eqns if e.primitive.name == "remat2"]
    assert remats and all(
        e.params["policy"] is jax.checkpoint_policies.dots_with_no_batch_dims_saveable
        for e in remats
    )
    # The policy keeps the outputs of the two hidden Dense matmuls (the last one is not
    # needed by the backward pass) and none of the ReLUs' values or masks.
    lifted_saved = saved_intermediates(loss(lifted), params, x)
    assert len(lifted_saved) == 2
    assert all("dot_general" in src for _, src in lifted_saved)
    # The plain MLP keeps the ReLUs' masks instead.
    plain_saved = saved_intermediates(loss(twin), params, x)
    assert sum(aval.dtype == jnp.bool_ for aval, _ in plain_saved) == 2
    assert not any("dot_general" in src for _, src in plain_saved)


# --- 4. grad_checkpointed_stack: a checkpointed body in lax.scan ---


def plain_layer(y, w):
    return jax.nn.relu(y @ w), None


def plain_stack_loss(weights, x):
    y_final, _ = lax.scan(plain_layer, x, weights)
    return jnp.sum(y_final**2)


STACK_CASES = [(0, 8, 2, 3), (1, 1, 1, 4), (2, 5, 3, 2), (3, 8, 4, 5)]  # (seed, L, batch, d)


def _stack_args(seed, layers, batch, d):
    # Scale so that activations neither vanish nor explode over the stack.
    weights = _normal(seed, (layers, d, d)) / np.sqrt(d) + jnp.eye(d)
    return weights, _normal(seed + 100, (batch, d))


@pytest.mark.parametrize("seed, layers, batch, d", STACK_CASES)
def test_grad_checkpointed_stack_equals_plain_scan(seed, layers, batch, d):
    weights, x = _stack_args(seed, layers, batch, d)
    grad = recipes.grad_checkpointed_stack(weights, x)
    assert grad.shape == weights.shape
    assert_tree_allclose(grad, jax.jit(jax.grad(plain_stack_loss))(weights, x), scale=10)
    # The gradient with respect to the input too, through the same checkpointed loss.
    assert_tree_allclose(
        jax.jit(jax.grad(_stack.stack_loss, 1))(weights, x),
        jax.jit(jax.grad(plain_stack_loss, 1))(weights, x),
        scale=10,
    )


def test_grad_checkpointed_stack_hand_worked():
    # Two layers 2*I on a batch of ones: y_final = 4 * x, loss = sum(16 x^2) over 2 entries.
    # dL/dW2 = y1.T @ (2 y_final) = [[2],[2]] @ [[8, 8]] -> 16; dL/dW1 = x.T @ (2 y_final W2.T) -> 16.
    weights = jnp.stack([2 * jnp.eye(2)] * 2)
    grad = recipes.grad_checkpointed_stack(weights, jnp.ones((1, 2)))
    np.testing.assert_allclose(grad, np.full((2, 2, 2), 16.0))


def test_grad_checkpointed_stack_under_jit():
    weights, x = _stack_args(0, 8, 2, 3)
    assert_tree_allclose(
        jax.jit(recipes.grad_checkpointed_stack)(weights, x),
        recipes.grad_checkpointed_stack(weights, x),
    )


def test_grad_checkpointed_stack_saves_only_the_carry_and_recomputes_each_layer():
    layers, batch, d = 8, 2, 3
    weights, x = _stack_args(0, layers, batch, d)
    ckpt_saved = saved_intermediates(_stack.stack_loss, weights, x)
    plain_saved = saved_intermediates(plain_stack_loss, weights, x)
    # The plain scan keeps every step's ReLU mask, (L, batch, d) bools; the checkpointed one
    # keeps only the per-step carries and recomputes the rest.
    assert len(ckpt_saved) < len(plain_saved)
    assert any(
        aval.shape == (layers, batch, d) and aval.dtype == jnp.bool_ for aval, _ in plain_saved
    )
    assert not any(aval.dtype == jnp.bool_ for aval, _ in ckpt_saved)
    # Recomputation counted: the backward scan body of the checkpointed stack runs the
    # layer's matmul once more (3 dots: recompute, two transposes) than the plain one (2).
    ckpt = primitive_counts(jax.make_jaxpr(jax.grad(_stack.stack_loss))(weights, x))
    plain = primitive_counts(jax.make_jaxpr(jax.grad(plain_stack_loss))(weights, x))
    assert ckpt["remat2"] == 1 and plain["remat2"] == 0
    assert ckpt["dot_general"] == plain["dot_general"] + 1


def test_grad_checkpointed_stack_compiles_to_less_memory():
    # Inside a scan the checkpoint survives XLA on CPU too: the compiled gradient holds
    # at least the (L, batch, d) bool masks fewer bytes of temporaries.
    layers, batch, d = 16, 32, 32
    weights, x = _stack_args(0, layers, batch, d)

    def temp_bytes(loss):
        compiled = jax.jit(jax.grad(loss)).lower(weights, x).compile(ANALYSIS_OPTIONS)
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp_bytes(plain_stack_loss) - temp_bytes(_stack.stack_loss) >= layers * batch * d


# --- 5. checkpointed_block_grad: a checkpointed block inside a model ---


def plain_block(x, params):
    x = jnp.dot(x, params["w1"]) + params["b1"]
    x = jax.nn.relu(x)
    return jnp.dot(x, params["w2"]) + params["b2"]


def _block_params(seed, d, h, o):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {
        "w1": jax.random.normal(k[0], (d, h)) / np.sqrt(d),
        "b1": 0.1 * jax.random.normal(k[1], (h,)),
        "w2": jax.random.normal(k[2], (h, o)) / np.sqrt(h),
        "b2": 0.1 * jax.random.normal(k[3], (o,)),
    }


BLOCK_CASES = [(0, (1,), 8, 16, 8), (1, (3,), 4, 6, 2), (2, (), 5, 3, 7), (3, (2, 2), 3, 4, 3)]


@pytest.mark.parametrize("seed, batch, d, h, o", BLOCK_CASES)
def test_checkpointed_block_grad_equals_plain_block(seed, batch, d, h, o):
    params, x = _block_params(seed, d, h, o), _normal(seed + 100, (*batch, d))
    grad = recipes.checkpointed_block_grad(params, x)
    assert_tree_allclose(grad, jax.jit(jax.grad(lambda p: jnp.sum(plain_block(x, p))))(params))
    # The forward and the gradient with respect to the input, through the same model.
    assert_tree_allclose(jax.jit(_block.model)(x, params), jax.jit(plain_block)(x, params))

    def input_grad(model):
        return jax.jit(jax.grad(lambda x, p: jnp.sum(model(x, p))))(x, params)

    assert_tree_allclose(input_grad(_block.model), input_grad(plain_block))


def test_checkpointed_block_saves_only_its_inputs():
    params, x = _block_params(0, 4, 6, 2), _normal(1, (3, 4))

    def ckpt_loss(p, x):
        return jnp.sum(_block.model(x, p))

    def plain_loss(p, x):
        return jnp.sum(plain_block(x, p))

    assert primitive_counts(jax.make_jaxpr(jax.grad(ckpt_loss))(params, x))["remat2"] >= 1
    assert saved_intermediates(ckpt_loss, params, x) == []
    # The plain block keeps its hidden activation (and the ReLU's mask), shape (batch, H).
    plain = saved_intermediates(plain_loss, params, x)
    assert any(aval.shape == (3, 6) and aval.dtype == jnp.float32 for aval, _ in plain)


# --- bad input: every error names the recipe and what it expected ---


@pytest.mark.parametrize("name", ["nn_checkpoint_forward", "nn_remat_policy"])
def test_linen_recipes_reject_bad_input(name):
    fn = getattr(recipes, name)
    where = rf"`remat\.recipes\.{name}`"
    with pytest.raises(ValueError, match=rf"{where}.*`x`.*1-D.*shape \(2, 4\)"):
        fn(0, jnp.ones((2, 4)), 3)
    with pytest.raises(ValueError, match=rf"{where}.*`features` >= 1, got 0"):
        fn(0, jnp.ones(4), 0)
    with pytest.raises(ValueError, match=rf"{where}.*`seed` to be integral, got 0\.5"):
        fn(0.5, jnp.ones(4), 3)
    with pytest.raises(TypeError, match=rf"{where}.*`features` to be an integer, got '3'"):
        fn(0, jnp.ones(4), "3")


def test_checkpoint_forward_rejects_bad_input():
    where = r"`remat\.recipes\.checkpoint_forward`"
    x = jnp.ones(3)
    with pytest.raises(ValueError, match=rf"{where}.*`seed` to be integral, got 1\.5"):
        recipes.checkpoint_forward(1.5, x, 3, 2)
    with pytest.raises(ValueError, match=rf"{where}.*`features` to be integral, got 3\.2"):
        recipes.checkpoint_forward(0, x, 3.2, 2)
    with pytest.raises(ValueError, match=rf"{where}.*`num_layers` to be integral, got 2\.5"):
        recipes.checkpoint_forward(0, x, 3, 2.5)
    with pytest.raises(ValueError, match=rf"{where}.*`num_layers` >= 1, got 0"):
        recipes.checkpoint_forward(0, x, 3, 0.0)
    with pytest.raises(ValueError, match=rf"{where}.*`features` >= 1, got -1"):
        recipes.checkpoint_forward(0, x, -1, 2)
    with pytest.raises(ValueError, match=rf"{where}.*`x`.*1-D.*shape \(1, 3\)"):
        recipes.checkpoint_forward(0, x[None], 3, 2)
    with pytest.raises(
        ValueError, match=rf"{where}.*shape \(features,\) = \(4,\).*got shape \(3,\)"
    ):
        recipes.checkpoint_forward(0, x, 4, 2)
    with pytest.raises(TypeError, match=rf"{where}.*`num_layers` to be an integer, got True"):
        recipes.checkpoint_forward(0, x, 3, True)


def test_grad_checkpointed_stack_rejects_bad_input():
    where = r"`remat\.recipes\.grad_checkpointed_stack`"
    w, x = jnp.ones((8, 3, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match=rf"{where}.*`weights`.*3-D.*shape \(3, 3\)"):
        recipes.grad_checkpointed_stack(w[0], x)
    with pytest.raises(ValueError, match=rf"{where}.*`x`.*2-D.*shape \(3,\)"):
        recipes.grad_checkpointed_stack(w, x[0])
    with pytest.raises(ValueError, match=rf"{where}.*\(8, 3, 3\) \(d = 3\).*\(2, 4\) \(d = 4\)"):
        recipes.grad_checkpointed_stack(w, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match=rf"{where}.*square.*\(8, 3, 4\)"):
        recipes.grad_checkpointed_stack(jnp.ones((8, 3, 4)), x)
    with pytest.raises(ValueError, match=rf"{where}.*at least one layer.*\(0, 3, 3\)"):
        recipes.grad_checkpointed_stack(jnp.ones((0, 3, 3)), x)
    with pytest.raises(TypeError, match=rf"{where}.*`weights`.*floating dtype; got int32"):
        recipes.grad_checkpointed_stack(jnp.ones((8, 3, 3), jnp.int32), x)


def test_checkpointed_block_grad_rejects_bad_input():
    where = r"`remat\.recipes\.checkpointed_block_grad`"
    params, x = _block_params(0, 4, 6, 2), jnp.ones((3, 4))

    def without(key):
        return {k: v for k, v in params.items() if k != key}

    with pytest.raises(ValueError, match=rf"{where}.*missing \['b2'\]"):
        recipes.checkpointed_block_grad(without("b2"), x)
    with pytest.raises(ValueError, match=rf"{where}.*unexpected \['w3'\]"):
        recipes.checkpointed_block_grad({**params, "w3": jnp.ones(2)}, x)
    with pytest.raises(TypeError, match=rf"{where}.*dict.*got list"):
        recipes.checkpointed_block_grad(list(params.values()), x)
    bad_shapes = [
        ("w1", jnp.ones(4), r"params\['w1'\]` of shape \(D, H\), got shape \(4,\)"),
        ("b1", jnp.ones(5), r"params\['b1'\]` of shape \(H,\) = \(6,\), got shape \(5,\)"),
        (
            "w2",
            jnp.ones((5, 2)),
            r"params\['w2'\]` of shape \(H, O\) = \(6, O\), got shape \(5, 2\)",
        ),
        ("b2", jnp.ones(3), r"params\['b2'\]` of shape \(O,\) = \(2,\), got shape \(3,\)"),
    ]
    for key, value, message in bad_shapes:
        with pytest.raises(ValueError, match=rf"{where}.*{message}"):
            recipes.checkpointed_block_grad({**params, key: value}, x)
    with pytest.raises(
        ValueError,
        match=rf"{where}.*`x` of shape \(\.\.\., D\) with D = .* = 4; got shape \(3, 5\)",
    ):
        recipes.checkpointed_block_grad(params, jnp.ones((3, 5)))
    with pytest.raises(TypeError, match=rf"{where}.*`params\['b1'\]`.*floating dtype; got int32"):
        recipes.checkpointed_block_grad({**params, "b1": jnp.ones(6, jnp.int32)}, x)
