"""Plans against programs that checkpoint already, and `Plan.policy` taken home.

The planner's baseline is the program as written (its own checkpoints included), and its
explanation says so in the user's names and lines. `Plan.policy` in the user's own scan
(``jax.checkpoint``, ``nn.remat`` in ``nn.scan``, ``nnx.remat`` in ``nnx.scan``) gives the
plan's compiled peak within 2% and the plan's gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat
from conftest import assert_tree_allclose
from remat._measure._peak import peak_bytes
from remat._plan._compile import COMPILER_OPTIONS

L, B, D, H = 4, 128, 32, 128


def peak(fn, *args):
    """The step's compiled peak, compiled as the planner compiles (read, not run)."""
    return peak_bytes(jax.jit(jax.value_and_grad(fn)).lower(*args).compile(COMPILER_OPTIONS))


def linen_loss(policy=None, remat_block=False):
    """A linen stack; with ``remat_block`` each block is ``nn.remat(Block, policy=policy)``."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h1 = checkpoint_name(nn.gelu(nn.Dense(H)(x)), "h1")
            h2 = nn.gelu(nn.Dense(H)(h1))
            return x + nn.Dense(D)(h2), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = nn.remat(Block, policy=policy, prevent_cse=False) if remat_block else Block
            stack = nn.scan(
                block, variable_axes={"params": 0}, split_rngs={"params": True}, length=L
            )
            x, _ = stack(name="layers")(x, None)
            return nn.Dense(1, name="head")(x)

    model = Model()

    def loss(params, x):
        return jnp.mean(model.apply(params, x) ** 2)

    return loss, model


@functools.cache
def linen_args():
    _, model = linen_loss()
    x = jnp.ones((B, D))
    return model.init(jax.random.key(0), x), x


def plain_step(c, w):
    h = jnp.tanh(c @ w["w1"])
    return c + jnp.tanh(h @ w["w2"]) @ w["w3"], None


@functools.cache
def plain_args():
    k = jax.random.split(jax.random.key(1), 3)
    ws = {
        "w1": jax.random.normal(k[0], (L, D, H)) * 0.1,
        "w2": jax.random.normal(k[1], (L, H, H)) * 0.1,
        "w3": jax.random.normal(k[2], (L, H, D)) * 0.1,
    }
    return ws, jnp.ones((B, D))


def plain_loss(policy=None, checkpointed=False):
    def loss(ws, x):
        step = jax.checkpoint(plain_step, policy=policy, prevent_cse=False)
        return jnp.sum(jax.lax.scan(step if checkpointed else plain_step, x, ws)[0] ** 2)

    return loss


@functools.cache
def nnx_parts():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(D, H, rngs=rngs)
            self.b = nnx.Linear(H, H, rngs=rngs)
            self.c = nnx.Linear(H, D, rngs=rngs)

        def __call__(self, h):
            return h + self.c(jnp.tanh(self.b(jnp.tanh(self.a(h)))))

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return Block(nnx.Rngs(key))

    graphdef, state = nnx.split(make(jax.random.split(jax.random.key(2), L)))
    return graphdef, state


def nnx_loss(policy=None, checkpointed=False):
    from flax import nnx

    graphdef, _ = nnx_parts()

    def loss(state, x):
        blocks = nnx.merge(graphdef, state)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            if checkpointed:
                return nnx.remat(lambda b, h: b(h), policy=policy, prevent_cse=False)(block, h)
            return block(h)

        return jnp.sum(run(x, blocks) ** 2)

    return loss


### The program as written


def test_the_plan_is_measured_against_the_program_as_written():
    h1 = jax.checkpoint_policies.save_only_these_names("h1")
    loss, _ = linen_loss(h1, remat_block=True)
    params, x = linen_args()
    plan = remat.plan(loss, params, x, budget="90%")
    assert plan.baseline_peak_bytes == peak(loss, params, x)  # as written, not stripped
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert_tree_allclose(
        jax.value_and_grad(plan.fn)(params, x), jax.value_and_grad(loss)(params, x)
    )
    (site,) = plan.written
    assert "save_only_these_names('h1')" in site and "test_plan_policy.py:" in site
    text = plan.explain(width=200)
    assert "of the peak as written" in text and "as written (matmuls)" in text
    assert "un-checkpointed" not in text
    with pytest.raises(remat.InfeasibleBudget, match="of the peak as written"):
        remat.plan(loss, params, x, budget=1024)


def test_explain_speaks_in_the_users_names():
    loss, _ = linen_loss()
    params, x = linen_args()
    plan = remat.plan(loss, params, x, budget="60%", schedules=False)
    saved = [v for s in plan.scans for v in s.saved if v.primitive != "carry"]
    assert saved, "the plan should save something at this budget"
    text = plan.explain(width=200)
    for v in saved:
        if v.user_name is not None:  # the user's name first, the planner's beside it
            assert f"{v.user_name} ({v.name})" in text
        else:  # the line to add it on, and the name to give it
            assert f"checkpoint_name(y, {v.name!r})" in text
            assert f"at {v.source}:" in text
    assert "policy=plan.policy" in text


def test_naming_advice_names_a_line_in_a_loop_once():
    """Six saved values made by one source line (a Python loop inside the step) and one of
    another: two ``checkpoint_name`` lines, and the policy names those two."""
    from types import SimpleNamespace as V

    from remat._plan._explain import paste_code

    def value(name, source, primitive="dot_general"):
        return V(name=name, user_name=None, source=source, dtype="float32", shape=(4, 8),
                 primitive=primitive)  # fmt: skip

    loop = [value(f"remat_s0_e{i}_0", "model.py:12") for i in range(6)]
    saved = [*loop, value("remat_s0_e9_0", "model.py:20", "tanh"), value("c", "", "carry")]
    scan = V(position=0, schedule="per_step", saved=saved)
    text = paste_code(V(rolled=False, scans=[scan]))
    assert text.count("at model.py:12:") == 1 and text.count("at model.py:20:") == 1
    assert "makes 6 of the saved values" in text
    assert "save_only_these_names('remat_s0_e0_0', 'remat_s0_e9_0')" in text


def test_naming_advice_gives_each_operation_of_one_line_its_name():
    """Two matmuls of one line (``jnp.tanh(h @ w1) @ w2``, or a layer's internals called
    there) are two operations, not a loop: a name each, both in the policy."""
    from types import SimpleNamespace as V

    from remat._plan._explain import paste_code

    saved = [V(name=f"remat_s0_e{i}_0", user_name=None, source="model.py:12", dtype="float32",
               shape=(4, 8), primitive="dot_general", site=(f"model.py:12:{col}",))
             for i, col in ((0, 8), (2, 20))]  # fmt: skip
    text = paste_code(V(rolled=False, scans=[V(position=0, schedule="per_step", saved=saved)]))
    assert "a loop in the step" not in text and "makes 2 of the saved values by different" in text
    assert text.count("checkpoint_name(y, 'remat_s0_e0_0')") == 1
    assert text.count("checkpoint_name(y, 'remat_s0_e2_0')") == 1
    assert "save_only_these_names('remat_s0_e0_0', 'remat_s0_e2_0')" in text


### Plan.policy in the user's own scan


@pytest.mark.parametrize("budget", ["80%", "60%"])
def test_policy_in_a_plain_scan(budget):
    args = plain_args()
    plan = remat.plan(plain_loss(), *args, budget=budget, schedules=False)
    mine = plain_loss(plan.policy, checkpointed=True)
    planned, own = peak(plan.fn, *args), peak(mine, *args)
    assert abs(own - planned) <= 0.02 * planned, (own, planned)
    assert own < peak(plain_loss(), *args)
    assert_tree_allclose(jax.grad(mine)(*args), jax.grad(plan.fn)(*args))


def test_policy_in_linen_remat():
    loss, _ = linen_loss()
    args = linen_args()
    plan = remat.plan(loss, *args, budget="60%", schedules=False)
    assert plan.policy.names or plan.policy.operations  # it saves something
    mine, _ = linen_loss(plan.policy, remat_block=True)
    planned, own = peak(plan.fn, *args), peak(mine, *args)
    assert abs(own - planned) <= 0.02 * planned, (own, planned)
    assert_tree_allclose(jax.grad(mine)(*args), jax.grad(plan.fn)(*args))


def test_policy_in_nnx_remat():
    _, state = nnx_parts()
    args = (state, jnp.ones((B, D)))
    plan = remat.plan(nnx_loss(), *args, budget="60%", schedules=False)
    mine = nnx_loss(plan.policy, checkpointed=True)
    planned, own = peak(plan.fn, *args), peak(mine, *args)
    assert abs(own - planned) <= 0.02 * planned, (own, planned)
    assert_tree_allclose(jax.grad(mine)(*args), jax.grad(plan.fn)(*args))


def test_policy_is_hashable_survives_json_and_names_beat_operations(tmp_path):
    args = plain_args()
    plan = remat.plan(plain_loss(), *args, budget="70%", schedules=False)
    hash(plan.policy)
    loaded = remat.load_plan(plan.to_json(tmp_path / "p.json"), plain_loss(), *args)
    assert loaded.policy == plan.policy
    assert loaded.scan_fingerprint == plan.scan_fingerprint
    # with the suggested names added, `save_only_these_names` saves the same values
    names = sorted(v.name for s in plan.scans for v in s.saved if v.primitive != "carry")
    assert set(names) <= plan.policy.names


def test_a_per_layer_plans_policy_error_names_values_as_the_program_does():
    """The error of `Plan.policy` on a per-layer plan lists which layers save what in the
    program's own `checkpoint_name`s, as `Plan.explain` does, not the planner's tags."""
    from remat._plan._options import SavedValue, ScanPlan
    from remat._plan._policy import plan_policy

    up = SavedValue("remat_s0_e21", "name", (8, 4), "float32", 128, 2, None, user_name="up")
    scan = ScanPlan(0, None, 4, "per_step", ("remat_s0_e21",), (up,), 0.0,
                    pattern=((), ("remat_s0_e21",)))  # fmt: skip
    with pytest.raises(ValueError, match=r"layers 0,2 save nothing; layers 1,3 save \{up\}"):
        plan_policy([scan])
    assert plan_policy([scan], position=1).names == frozenset({"remat_s0_e21", "up"})


def test_a_plan_above_a_program_that_recomputes_everything_predicts_a_real_peak(tmp_path):
    """The user's `nnx.remat` saves nothing, and a budget above that peak buys back
    recomputation. The memory outside the scans is learnt on the program as written, whose
    scans recompute everything, not on those scans compiled alone without its checkpoints
    (which would leave that memory negative, a negative predicted peak, and a plan file that
    `load_plan` refuses)."""
    _, state = nnx_parts()
    loss = nnx_loss(checkpointed=True)
    args = (state, jnp.ones((B, D)))
    written = peak(loss, *args)
    plan = remat.plan(loss, *args, budget=3 * written, schedules=False, verbose=False)
    assert plan.flops_ratio < 1.0  # it saves what the program as written recomputes
    assert abs(plan.predicted_peak_bytes - plan.measured_peak_bytes) <= plan.measured_peak_bytes / 4
    plan.to_json(tmp_path / "plan.json")
    remat.load_plan(tmp_path / "plan.json", loss, *args)
