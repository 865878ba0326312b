"""`remat.scan`: every schedule against plain `lax.scan`, recomputation counted, memory read."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from conftest import assert_tree_allclose, nnx_stack
from remat._measure._step import ANALYSIS_OPTIONS  # compiled to be read, as remat does
from remat._scan._scan import nested_lengths

SCHEDULES = ["per_step", remat.Nested(2), remat.Binomial(1), remat.Binomial(4)]
W0 = jnp.array([[0.9, 0.1], [-0.2, 0.8]])


def make_step(w):
    """A tiny step with a pytree carry (float + int counter), pytree xs (float + int), ys,
    and a closed-over weight ``w``."""

    def step(carry, x):
        h, k = carry["h"], carry["k"]
        h = jnp.tanh(w @ h + x["u"]) * (1.0 + 0.01 * x["t"])
        return {"h": h, "k": k + x["t"]}, (jnp.sum(h * h), k)

    return step


def loss(w, h0, u, schedule, reverse=False):
    n = u.shape[0]
    xs = {"u": u, "t": jnp.arange(n, dtype=jnp.int32) % 3}
    carry, (ys, ks) = remat.scan(
        make_step(w), {"h": h0, "k": jnp.int32(0)}, xs, reverse=reverse, schedule=schedule
    )
    weights = jnp.cos(jnp.arange(n, dtype=jnp.float32))
    return jnp.sum(carry["h"] ** 2) + jnp.sum(ys * weights) / n, (carry, ks)


def inputs(n):
    u = 0.5 * jnp.sin(jnp.arange(2 * n, dtype=jnp.float32)).reshape(n, 2)
    return W0, jnp.array([0.3, -0.1]), u


_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=(3, 4))


@pytest.mark.parametrize("n", [1, 2, 7, 64, 97, 1000])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_values_and_gradients_match_lax_scan(schedule, n):
    _check_against_lax_scan(schedule, n)


@pytest.mark.parametrize("n", [2, 97])
def test_three_level_nested_matches_lax_scan(n):
    _check_against_lax_scan(remat.Nested(3), n)


def _check_against_lax_scan(schedule, n):
    args = inputs(n)
    want = _grad(*args, "none")
    got = _grad(*args, schedule)
    # Values (loss, final carry incl. the int counter, the int ys) and the gradients with
    # respect to the closed-over weight, the initial carry and the inputs.
    assert_tree_allclose(got, want, scale=10.0)


@pytest.mark.parametrize(
    ("schedule", "n"), [(remat.Nested(2), 97), (remat.Nested(3), 7), (remat.Binomial(3), 97)]
)
def test_reverse_matches_lax_scan(schedule, n):
    args = inputs(n)
    assert_tree_allclose(_grad(*args, schedule, True), _grad(*args, "none", True), scale=10.0)


@pytest.mark.parametrize("schedule", [remat.Nested(2), remat.Binomial(2)], ids=str)
def test_xs_none_with_length_and_matching_lax_scan_forward(schedule):
    def f(c):
        return remat.scan(lambda c, _: (jnp.sin(c) + 0.1, c), c, length=13, schedule=schedule)

    def g(c):
        return jax.lax.scan(lambda c, _: (jnp.sin(c) + 0.1, c), c, length=13)

    assert_tree_allclose(f(0.4), g(0.4))
    assert_tree_allclose(
        jax.grad(lambda c: f(c)[1].sum())(0.4), jax.grad(lambda c: g(c)[1].sum())(0.4)
    )


def test_explicit_nested_lengths_and_policies():
    args = inputs(97)
    want = _grad(*args, "none")
    # lengths whose product exceeds N (7 * 15 = 105 >= 97): a remainder block.
    assert_tree_allclose(_grad(*args, remat.Nested(2, lengths=(7, 15))), want, scale=10.0)

    @jax.jit
    def grads(w):
        carry, xs = {"h": args[1], "k": jnp.int32(0)}, {"u": args[2], "t": jnp.ones(97, jnp.int32)}
        out = [jax.grad(lambda w: jax.lax.scan(make_step(w), carry, xs)[0]["h"].sum())(w)]
        for schedule in ("per_step", remat.Nested(2), remat.Binomial(3)):
            f = lambda w, schedule=schedule: remat.scan(  # noqa: E731
                make_step(w), carry, xs, schedule=schedule, policy="dots"
            )
            out.append(jax.grad(lambda w, f=f: f(w)[0]["h"].sum())(w))
        return out

    want, *got = grads(args[0])
    for g in got:
        assert_tree_allclose(g, want, scale=10.0)


def test_vmap_of_binomial_gradient():
    w, h0, u = inputs(20)
    h0s = jnp.stack([h0, -h0, 2 * h0])

    def grad(schedule):
        return jax.grad(lambda w, h0: loss(w, h0, u, schedule)[0])

    batched = jax.jit(jax.vmap(grad(remat.Binomial(2)), in_axes=(None, 0)))(w, h0s)
    want = jax.jit(jax.vmap(grad("none"), in_axes=(None, 0)))(w, h0s)
    assert_tree_allclose(batched, want)


@pytest.mark.parametrize(("n", "snapshots"), [(1, 1), (2, 1), (7, 2), (64, 3), (200, 6)])
def test_binomial_runs_the_body_revolve_cost_plus_n_plus_one_times(n, snapshots):
    """One gradient runs the body A(n, s) + n + 1 times.

    Accounting: the forward pass runs all n steps once (it produces ys and the final carry
    and, on the way, performs the schedule's first sweep: the n - 1 advances to the last
    step's input, storing the snapshots); the backward pass runs the remaining
    A(n, s) - (n - 1) advances and one forward inside each of the n one-step VJPs. Total:
    n + A - (n - 1) + n = A + n + 1.
    """
    calls = []

    def step(c, x):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sin(c) * x, c

    xs = jnp.linspace(0.5, 1.0, n)
    grad = jax.jit(
        jax.grad(
            lambda c: sum(
                jnp.sum(t) for t in remat.scan(step, c, xs, schedule=remat.Binomial(snapshots))
            )
        )
    )
    grad(0.3).block_until_ready()
    calls.clear()
    grad(0.3).block_until_ready()
    jax.effects_barrier()
    assert len(calls) == remat.revolve_cost(n, snapshots) + n + 1
    # Without differentiation the body runs n times.
    calls.clear()
    jax.block_until_ready(remat.scan(step, 0.3, xs, schedule=remat.Binomial(snapshots)))
    jax.effects_barrier()
    assert len(calls) == n


D = 64  # carry width of the memory tests: one carry is 256 bytes


def _compiled(schedule, n):
    w = jnp.eye(D) * 0.5

    def f(c0):
        return remat.scan(lambda c, _: (jnp.tanh(w @ c), None), c0, length=n, schedule=schedule)[
            0
        ].sum()

    return jax.jit(jax.grad(f)).lower(jnp.ones(D)).compile(ANALYSIS_OPTIONS)


def _temp_bytes(schedule, n):
    return _compiled(schedule, n).memory_analysis().temp_size_in_bytes


def test_binomial_memory_is_flat_in_n_and_per_step_is_linear():
    carry = D * 4
    compiled = {n: _compiled(remat.Binomial(4), n) for n in (64, 4096)}
    binomial = {n: c.memory_analysis().temp_size_in_bytes for n, c in compiled.items()}
    assert binomial[64] == binomial[4096]
    # The program does not grow with N either: the same HLO instructions (the schedule is a
    # constant table, printed elided), the same loops. (Instructions only: the source-frame
    # tables printed after them differ with the caller's stack.)
    hlo = {n: [ln for ln in c.as_text().splitlines() if " = " in ln] for n, c in compiled.items()}
    assert len(hlo[64]) == len(hlo[4096])
    assert sum(" while(" in line for line in hlo[64]) == sum(
        " while(" in line for line in hlo[4096]
    )
    # 4 snapshots, the last step's input, the current carry and its cotangent, plus a few
    # carry-sized temporaries of one step's VJP.
    assert binomial[4096] <= 12 * carry
    per_step = {n: _temp_bytes("per_step", n) for n in (64, 1024)}
    assert per_step[1024] - per_step[64] >= (1024 - 64) * carry
    assert binomial[4096] < per_step[64]


def test_nested_memory_grows_as_the_sum_of_block_lengths():
    carry = D * 4
    temps = {n: _temp_bytes(remat.Nested(2), n) for n in (256, 1024, 4096)}
    for small, big in ((256, 1024), (1024, 4096)):
        stored = sum(nested_lengths(big, 2)) - sum(nested_lengths(small, 2))  # ~ sqrt growth
        assert abs((temps[big] - temps[small]) - stored * carry) <= 2 * carry, temps
    # sqrt(N): 16x more steps cost about 4x more stored carries, far below linear.
    assert temps[4096] - temps[256] < 4 * sum(nested_lengths(4096, 2)) * carry


@pytest.mark.slow
@pytest.mark.parametrize("snapshots", [2, 8, 16])
def test_binomial_memory_flat_sweep(snapshots):
    temps = {n: _temp_bytes(remat.Binomial(snapshots), n) for n in (64, 256, 1024, 4096, 16384)}
    assert len(set(temps.values())) == 1, temps


@pytest.mark.parametrize("n", [1, 2, 12, 97, 128, 1000, 4096, 4097])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_nested_lengths_cover_n_with_near_equal_blocks(n, levels):
    lengths = nested_lengths(n, levels)
    assert len(lengths) == levels
    assert math.prod(lengths) >= n
    # The fewest stored carries with a remainder block: near-equal lengths ~ n**(1/levels).
    root = math.ceil(n ** (1 / levels) - 1e-9)
    assert sum(lengths) <= 1.25 * levels * root + 1, lengths


def test_nested_lengths_prefer_exact_factorisations_and_handle_primes():
    assert nested_lengths(128, 2) == (16, 8)  # exact, sum 24, beside (12, 11) with remainder
    assert nested_lengths(4096, 3) == (16, 16, 16)
    assert nested_lengths(97, 2) == (10, 10)  # prime: a 7-step remainder block
    assert nested_lengths(4097, 2) == (64, 65)  # 17 * 241 is far from square


def test_errors_name_remat_scan():
    step = lambda c, x: (c + x, c)  # noqa: E731
    xs = jnp.ones(5)
    with pytest.raises(ValueError, match=r"`remat.scan` got schedule='binomial'"):
        remat.scan(step, 0.0, xs, schedule="binomial")
    with pytest.raises(ValueError, match=r"`remat.Binomial` got snapshots=0"):
        remat.scan(step, 0.0, xs, schedule=remat.Binomial(0))
    with pytest.raises(ValueError, match=r"`remat.scan` got length=4 but xs has 5 steps"):
        remat.scan(step, 0.0, xs, length=4)
    with pytest.raises(ValueError, match=r"`remat.scan` got xs=None and length=None"):
        remat.scan(step, 0.0)
    with pytest.raises(ValueError, match=r"`remat.scan` got xs leaves with different"):
        remat.scan(step, 0.0, (xs, jnp.ones(4)))
    # `lax.scan`'s own error types, with remat's advice appended to `lax.scan`'s message.
    with pytest.raises(IndexError, match=r"`remat.scan` got an xs leaf of shape \(\)"):
        remat.scan(step, 0.0, jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"`remat.scan` got length=-1"):
        remat.scan(step, 0.0, length=-1)
    with pytest.raises(ValueError, match=r"product 4 is less than the scan length 5"):
        remat.scan(step, 0.0, xs, schedule=remat.Nested(2, lengths=(2, 2)))
    with pytest.raises(ValueError, match=r"`remat.scan` got strategy 'bogus'"):
        remat.scan(step, 0.0, xs, policy="bogus")
    with pytest.raises(TypeError, match=r"(?s)must have equal types.*schedule=Binomial"):
        remat.scan(lambda c, x: (jnp.stack([c, x]), c), 0.0, xs, schedule=remat.Binomial(2))
    with pytest.raises(TypeError, match=r"(?s)must have equal types.*schedule=Binomial"):
        remat.scan(step, jnp.int32(0), xs, schedule=remat.Binomial(2))  # int32 -> float32


def test_zero_length_scan_is_plain():
    for schedule in ("none", *SCHEDULES):
        c, ys = remat.scan(lambda c, x: (c + x, c), 1.0, jnp.zeros((0,)), schedule=schedule)
        assert float(c) == 1.0
        assert np.shape(ys) == (0,)


def test_apply_switches_an_nnx_layer_stack_to_binomial():
    """`remat.apply(fn, Strategy(schedule=Binomial(8)))` on an `nnx.scan` stack: same
    gradients as the plain stack, less compiled temp memory than plain and per-step
    checkpointing. (`Nested` through `apply` is tested in tests/_trace/test_rewrite.py.)"""
    layers, batch, width = 32, 8, 16
    loss, state = nnx_stack(layers, width)
    x = jax.random.normal(jax.random.key(1), (batch, width))
    variants = {
        "plain": loss,
        "per_step": remat.apply(loss, "full"),
        "binomial": remat.apply(loss, remat.Strategy(schedule=remat.Binomial(8))),
    }
    temps, grads = {}, {}
    for name, f in variants.items():
        compiled = jax.jit(jax.value_and_grad(f)).lower(state, x).compile()
        temps[name] = compiled.memory_analysis().temp_size_in_bytes
        grads[name] = compiled(state, x)
    for name in ("per_step", "binomial"):
        assert_tree_allclose(grads[name], grads["plain"], scale=10.0)
    assert temps["binomial"] < temps["per_step"] < temps["plain"], temps
