"""Property tests (hypothesis): whatever the stack, strategy and schedule, `remat` computes the
same values and gradients as the plain program, and its own rewrites pass `remat.lint`.

The examples per property are few so the suite stays fast on 2 CPU cores (and derandomized,
so CI is reproducible). For a longer, random sweep: ``HYPOTHESIS_PROFILE=long pytest
tests/test_properties.py`` (200 examples per property; ``HYPOTHESIS_MAX_EXAMPLES=N`` sets
another count).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from jax.ad_checkpoint import checkpoint_name

import remat
from conftest import assert_tree_allclose

settings.register_profile(
    "remat-ci",
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "remat-ci"))
if os.environ.get("HYPOTHESIS_MAX_EXAMPLES"):  # e.g. a medium sweep: long profile, 25 examples
    PROFILE = settings(PROFILE, max_examples=int(os.environ["HYPOTHESIS_MAX_EXAMPLES"]))

STRATEGIES = ("none", "full", "dots", "dots_no_batch", "everything", "names:hidden")
SCHEDULES = st.one_of(
    st.sampled_from(["per_step", "none"]),
    st.builds(remat.Nested, levels=st.integers(2, 3)),
    st.builds(remat.Binomial, snapshots=st.integers(1, 4)),
)
# Recomputation may fuse differently from the forward pass; deep bf16 stacks need more room.
SCALE = {"float32": 10.0, "bfloat16": 4.0, "float64": 10.0}


@st.composite
def stacks(draw, dtypes=("float32", "bfloat16")):
    """A scanned layer stack: (loss, params, x, dtype), arrays as float64 numpy arrays
    (`_cast` makes them ``dtype`` where that dtype is enabled)."""
    depth = draw(st.integers(1, 12))
    width = draw(st.sampled_from([2, 3, 5]))
    batch = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(dtypes))
    pytree_carry = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.normal(size=(depth, width, width)) / np.sqrt(width),
        "b": rng.normal(size=(depth, width)) * 0.1,
    }
    x = rng.normal(size=(batch, width))
    return _loss(pytree_carry), params, x, dtype


def _cast(tree, dtype):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), tree)


def _loss(pytree_carry: bool):
    def layer(h, p):
        hidden = checkpoint_name(jnp.tanh(h @ p["w"] + p["b"]), "hidden")
        return jnp.sin(hidden) @ p["w"].T

    if pytree_carry:

        def body(carry, p):
            h = layer(carry["h"], p)
            return {"h": h, "acc": carry["acc"] + jnp.sum(h * h)}, None

        def loss(params, x):
            init = {"h": x, "acc": jnp.zeros((), x.dtype)}
            out, _ = jax.lax.scan(body, init, params)
            return jnp.sum(out["h"]) + out["acc"]

    else:

        def loss(params, x):
            out, _ = jax.lax.scan(lambda h, p: (layer(h, p), None), x, params)
            return jnp.sum(out)

    return loss


def _check_same(loss, strategy, params, x, dtype):
    params, x = _cast(params, dtype), _cast(x, dtype)
    reference = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    rewritten = remat.apply(loss, strategy)
    got = jax.jit(jax.value_and_grad(rewritten, argnums=(0, 1)))(params, x)
    assert_tree_allclose(got, reference, scale=SCALE[dtype])


def _fixed_stack(depth=8, width=5, batch=3, pytree_carry=False):
    rng = np.random.default_rng(0)
    params = {
        "w": rng.normal(size=(depth, width, width)) / np.sqrt(width),
        "b": rng.normal(size=(depth, width)) * 0.1,
    }
    return _loss(pytree_carry), params, rng.normal(size=(batch, width)), "float32"


_STRUCTURAL = {"RM001", "RM002", "RM003", "RM004", "RM007", "RM008"}


@PROFILE
# Lengths whose `Nested` blocks leave a shorter last block beside the loop of whole ones.
@example(stack=_fixed_stack(depth=11), policy="none", schedule=remat.Nested(2))
@example(stack=_fixed_stack(depth=17), policy="none", schedule=remat.Nested(2))
@example(stack=_fixed_stack(depth=19), policy="none", schedule=remat.Nested(2))
@example(stack=_fixed_stack(depth=23), policy="none", schedule=remat.Nested(2))
@example(stack=_fixed_stack(depth=11), policy="none", schedule=remat.Nested(3))
@example(stack=_fixed_stack(depth=17), policy="dots", schedule=remat.Nested(3))
@given(
    stack=stacks(dtypes=("float32", "bfloat16", "float64")),
    policy=st.sampled_from(STRATEGIES),
    schedule=SCHEDULES,
)
def test_apply_matches_reference_and_passes_lint(stack, policy, schedule):
    loss, params, x, dtype = stack
    strategy = remat.Strategy(policy, schedule=schedule)
    with jax.enable_x64(dtype == "float64"):
        assert _cast(x, dtype).dtype == jnp.dtype(dtype)
        _check_same(loss, strategy, params, x, dtype)
        # remat's own checkpoints never trip the structural findings (RM006 may: "everything").
        found = remat.lint(
            loss, _cast(params, dtype), _cast(x, dtype), strategy=strategy, measure=False
        )
        assert not {f.code for f in found} & _STRUCTURAL, found


@PROFILE
@given(
    n=st.integers(0, 12),
    schedule=SCHEDULES,
    policy=st.sampled_from([None, "full", "dots", "everything"]),
    reverse=st.booleans(),
    dtype=st.sampled_from(["float32", "bfloat16"]),
)
def test_scan_matches_lax_scan(n, schedule, policy, reverse, dtype):
    xs = jnp.linspace(-1.0, 1.0, 2 * n).reshape(n, 2).astype(dtype)

    def run(scan, c0, w):
        def step(carry, x):  # closes over w: its gradient flows through the scan's consts
            h = jnp.tanh(carry["h"] @ w + x)
            return {"h": h, "n": carry["n"] + jnp.sum(h)}, 2 * h

        out, ys = scan(step, {"h": c0, "n": jnp.zeros((), dtype)}, xs)
        return jnp.sum(out["h"]) + out["n"] + jnp.sum(ys)

    def with_remat(c0, w):
        scan = lambda f, c, xs: remat.scan(  # noqa: E731
            f, c, xs, reverse=reverse, schedule=schedule, policy=policy
        )
        return run(scan, c0, w)

    def reference(c0, w):
        return run(lambda f, c, xs: jax.lax.scan(f, c, xs, reverse=reverse), c0, w)

    c0 = jnp.asarray([0.3, -0.2], dtype)
    w = jnp.asarray([[0.9, -0.3], [0.2, 0.8]], dtype)
    expected = jax.value_and_grad(reference, argnums=(0, 1))(c0, w)
    got = jax.value_and_grad(with_remat, argnums=(0, 1))(c0, w)
    assert_tree_allclose(got, expected, scale=SCALE[dtype])


# --- plans: fit the budget or say they cannot; the same program and budget, the same plan ---

PLAN_PROFILE = settings(PROFILE, max_examples=max(1, PROFILE.max_examples // 3))
# Small stacks rarely go below ~60% of their peak, so most budgets are drawn where plans fit.
BUDGETS = st.one_of(
    st.floats(0.7, 1.0), st.floats(0.05, 1.0), st.sampled_from(["30%", "75%", "100%"])
)


@PLAN_PROFILE
@example(stack=_fixed_stack(), budget="60%")  # always one plan that fits, even in CI
@given(stack=stacks(dtypes=("float32",)), budget=BUDGETS)
def test_plans_fit_or_raise_infeasible(stack, budget):
    loss, params, x, dtype = stack
    params, x = _cast(params, dtype), _cast(x, dtype)
    try:
        plan = remat.plan(loss, params, x, budget=budget, argnums=(0, 1))
    except remat.InfeasibleBudget as err:
        assert "`remat.plan` cannot fit budget" in str(err)
        event("infeasible")
        return
    event("feasible")
    assert plan.measured_peak_bytes <= plan.budget_bytes
    expected = jax.value_and_grad(loss, argnums=(0, 1))(params, x)
    got = jax.value_and_grad(plan.fn, argnums=(0, 1))(params, x)
    assert_tree_allclose(got, expected, scale=SCALE[dtype])


# what differs between two runs of the same plan: timings, the rounds it took (a second call
# starts from what the first learned about the program), and the checksum that covers them
_TIMINGS = {"solve_seconds", "compile_seconds", "seconds", "rounds", "checksum"}


def _without_timings(data):
    if isinstance(data, dict):
        return {k: _without_timings(v) for k, v in data.items() if k not in _TIMINGS}
    if isinstance(data, list):
        return [_without_timings(v) for v in data]
    return data


def test_same_program_and_budget_give_the_same_plan():
    def loss(ws, x):
        def body(c, w):
            h = checkpoint_name(jnp.sin(c @ w), "hidden")
            return jnp.tanh(h @ w), None

        return jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2)

    ws = jnp.linspace(-0.3, 0.3, 6 * 8 * 8).reshape(6, 8, 8)
    x = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
    first = remat.plan(loss, ws, x, budget="90%")
    second = remat.plan(loss, ws, x, budget="90%")
    assert first.scans == second.scans
    assert _without_timings(first.to_dict()) == _without_timings(second.to_dict())
    assert second.rounds <= first.rounds  # the second call knows the first's compiled plans
