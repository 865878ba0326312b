"""A plan travels into the user's own training step: ``remat.apply(loss_fn, plan)`` (a `Plan`
or a plan file) on a loss made inside a jitted ``train_step`` at every call, closing over
the batch and the dropout key, as the Flax and optax examples write it.

Every planned step is compared with the plain step: losses, gradients, parameters and
optimizer state after several steps, and the compiled peak.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
import pytest

import remat
from conftest import assert_tree_allclose
from remat._measure._peak import peak_bytes
from remat._plan._compile import COMPILER_OPTIONS

L, B, D, H = 4, 64, 32, 128


@functools.cache
def linen_setup():
    import flax.linen as nn
    from flax.training import train_state

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.gelu(nn.Dense(H)(x))
            h = nn.Dropout(0.1, deterministic=False)(h)
            return x + nn.Dense(D)(h), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(
                Block, variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True}, length=L,
            )  # fmt: skip
            x, _ = stack()(x, None)
            return nn.Dense(10)(x)

    model = Model()
    key = jax.random.key(0)
    x, y = jax.random.normal(key, (B, D)), jnp.arange(B) % 10
    params = model.init({"params": key, "dropout": key}, x)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

    def loss(params, x, y, key):
        logits = model.apply({"params": params}, x, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    plan = remat.plan(loss, params, x, y, key, budget="60%")
    return state, x, y, key, plan


def linen_train_step(strategy):
    @jax.jit
    def train_step(state, x, y, key):
        dropout_key = jax.random.fold_in(key, state.step)

        def loss_fn(params):  # a new closure at every call, over the batch and the key
            logits = state.apply_fn({"params": params}, x, rngs={"dropout": dropout_key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

        if strategy is not None:
            loss_fn = remat.apply(loss_fn, strategy)
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads), loss, logits, grads

    return train_step


def run_steps(step, state, *batch, n=3):
    history = []
    for _ in range(n):
        state, *out = step(state, *batch)
        history.append(out)
    return state, history


def step_peak(step, *args):
    """The compiled peak of a jitted step (compiled as the planner compiles: read, not run)."""
    return peak_bytes(step.lower(*args).compile(COMPILER_OPTIONS))


@functools.cache
def linen_plain():
    """The plain step's run and peak, shared by both forms of the plan."""
    state, x, y, key, _ = linen_setup()
    step = linen_train_step(None)
    return (*run_steps(step, state, x, y, key), step_peak(step, state, x, y, key))


@pytest.mark.parametrize("form", ["plan", "file"])
def test_linen_train_state_step_with_a_plan(form, tmp_path):
    state, x, y, key, plan = linen_setup()
    strategy = plan if form == "plan" else str(plan.to_json(tmp_path / "plan.json"))
    plain_state, plain, plain_peak = linen_plain()
    planned_step = linen_train_step(strategy)
    planned_state, planned = run_steps(planned_step, state, x, y, key)
    assert_tree_allclose(planned, plain)  # losses, logits (aux) and gradients, per step
    assert_tree_allclose(planned_state.params, plain_state.params)
    assert_tree_allclose(planned_state.opt_state, plain_state.opt_state)
    assert int(planned_state.step) == 3
    # the plan's memory, in the user's own step
    assert step_peak(planned_step, state, x, y, key) < plain_peak


def test_a_plan_for_other_shapes_or_another_program_is_refused(tmp_path):
    state, x, y, key, plan = linen_setup()
    with pytest.raises(ValueError, match="planned for other shapes") as err:
        linen_train_step(plan)(state, x[: B // 2], y[: B // 2], key)
    assert plan.scan_fingerprint in str(err.value)
    assert plan.scan_structure in str(err.value)

    def other(ws, x):
        return jnp.sum(jax.lax.scan(lambda c, w: (jnp.sin(c @ w), None), x, ws)[0])

    with pytest.raises(ValueError, match="a plan for another program") as err:
        remat.apply(other, plan)(jnp.ones((3, D, D)), jnp.ones((B, D)))
    assert plan.scan_fingerprint in str(err.value)
    with pytest.raises(ValueError, match=r"`remat.apply` cannot read"):
        remat.apply(other, "no/such/plan.json")
    with pytest.raises(ValueError, match=r"`remat.apply` cannot read .*directory"):
        remat.apply(other, str(tmp_path))
    with pytest.raises(ValueError, match="drop `override`"):
        remat.apply(other, plan, override=True)


def test_a_plan_applied_inside_shard_map():
    """Inside `shard_map` with its replication checks (the default) the traced loss has
    `pvary` equations that the plan's program lacks: refused, and the error says to plan at
    the per-device shapes and pass `check_vma=False`; with that, the plan applies there."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    state, x, y, key, plan = linen_setup()
    mesh = jax.make_mesh((1,), ("data",))

    def step(strategy, check_vma):
        def shard_loss(state, x, y, key):  # each device's loss, on its shard of the batch
            def loss_fn(params):
                logits = state.apply_fn({"params": params}, x, rngs={"dropout": key})
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            f = loss_fn if strategy is None else remat.apply(loss_fn, strategy)
            return jax.lax.pmean(jax.value_and_grad(f)(state.params), "data")

        specs = dict(in_specs=(P(), P("data"), P("data"), P()), out_specs=P())
        return jax.jit(jax.shard_map(shard_loss, mesh=mesh, check_vma=check_vma, **specs))

    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match="a plan for another program") as err:
        step(plan, True)(state, *batch, key)
    assert "Inside `shard_map` (manual axes data)" in str(err.value)
    assert "pass `check_vma=False`" in str(err.value)
    planned = step(plan, False)(state, *batch, key)
    assert_tree_allclose(planned, step(None, False)(state, *batch, key))
    with pytest.raises(ValueError, match="planned for other shapes") as err:
        linen_train_step(plan)(state, x[: B // 2], y[: B // 2], key)
    assert "shard_map" not in str(err.value)


def plain_loss(ws, x, key):
    def layer(c, wk):
        w, k = wk
        h = jnp.tanh(c @ w["w1"])
        h = h * jax.random.bernoulli(k, 0.9, h.shape) / 0.9
        return c + h @ w["w2"], None

    keys = jax.random.split(key, ws["w1"].shape[0])
    return jnp.mean(jax.lax.scan(layer, x, (ws, keys))[0] ** 2)


def test_plain_jax_optax_step_with_a_plan():
    k = jax.random.split(jax.random.key(3), 2)
    ws = {"w1": jax.random.normal(k[0], (L, D, H)) * 0.1,
          "w2": jax.random.normal(k[1], (L, H, D)) * 0.1}  # fmt: skip
    x, key = jnp.ones((B, D)), jax.random.key(4)
    tx = optax.adam(1e-2)
    plan = remat.plan(plain_loss, ws, x, key, budget="60%")

    def make(strategy):
        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step(ws, opt_state, x, key):
            loss_fn = functools.partial(plain_loss, x=x, key=key)
            if strategy is not None:
                loss_fn = remat.apply(strategy=strategy)(loss_fn)  # the decorator form
            loss, grads = jax.value_and_grad(loss_fn)(ws)
            updates, opt_state = tx.update(grads, opt_state, ws)
            return optax.apply_updates(ws, updates), opt_state, loss

        return step

    out = {}
    for label, strategy in (("plain", None), ("plan", plan)):
        params, opt_state, losses = jax.tree.map(jnp.copy, ws), tx.init(ws), []
        step = make(strategy)  # jitted once, called at every step
        for i in range(3):
            params, opt_state, loss = step(params, opt_state, x, jax.random.key(i))
            losses.append(loss)
        out[label] = (params, opt_state, losses)
    assert_tree_allclose(out["plan"], out["plain"])


def test_nnx_split_state_step_with_a_plan():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(D, H, rngs=rngs)
            self.b = nnx.Linear(H, D, rngs=rngs)

        def __call__(self, h):
            return h + self.b(jnp.tanh(self.a(h)))

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return Block(nnx.Rngs(key))

    graphdef, state = nnx.split(make(jax.random.split(jax.random.key(5), L)))

    def forward(state, x):
        blocks = nnx.merge(graphdef, state)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            return block(h)

        return jnp.mean(run(x, blocks) ** 2)

    x = jnp.ones((B, D))
    plan = remat.plan(forward, state, x, budget="75%")

    def step(strategy):
        @jax.jit
        def train_step(state, x):
            loss_fn = lambda s: forward(s, x)  # noqa: E731
            if strategy is not None:
                loss_fn = remat.apply(loss_fn, strategy)
            loss, grads = jax.value_and_grad(loss_fn)(state)
            return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), loss

        return train_step

    plain, planned = state, state
    plain_step, planned_step = step(None), step(plan)  # jitted once, called at every step
    for _ in range(3):
        plain, plain_loss_ = plain_step(plain, x)
        planned, planned_loss = planned_step(planned, x)
        assert_tree_allclose(planned_loss, plain_loss_)
    assert_tree_allclose(planned, plain)
