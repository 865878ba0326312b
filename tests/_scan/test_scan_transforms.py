"""`remat.scan`'s `Binomial` memory under every transformation, read from XLA.

Forward mode needs no stored steps, so a `Binomial` scan under `jax.jvp` keeps none; under
`vmap` of `grad` and forward-over-reverse its memory is flat in N; under `grad` of `grad`
it grows as ``sqrt(N)`` (the backward sweep runs in ``~sqrt(T)`` checkpointed blocks),
far below the linear growth of a per-step checkpointed `lax.scan`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._measure._step import ANALYSIS_OPTIONS  # compiled to be read, as remat does

D = 64  # carry width: one carry is 256 bytes
CARRY = D * 4
W = jnp.eye(D) * 0.5


def loss(n, schedule):
    def f(c0):
        step = lambda c, _: (jnp.tanh(W @ c), None)  # noqa: E731
        return remat.scan(step, c0, length=n, schedule=schedule)[0].sum()

    return f


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile(ANALYSIS_OPTIONS).memory_analysis().temp_size_in_bytes


TRANSFORMS = {
    "jvp": (lambda f: lambda c: jax.jvp(f, (c,), (c,)), jnp.ones(D)),
    "vmap_grad": (lambda f: jax.vmap(jax.grad(f)), jnp.ones((4, D))),
    "hvp": (lambda f: lambda c: jax.jvp(jax.grad(f), (c,), (c,)), jnp.ones(D)),
    "grad_of_grad": (lambda f: jax.grad(lambda c: jnp.sum(jax.grad(f)(c) ** 2)), jnp.ones(D)),
}


def temps(schedule, name, sizes=(64, 1024)):
    transform, arg = TRANSFORMS[name]
    return {n: temp_bytes(transform(loss(n, schedule)), arg) for n in sizes}


def test_binomial_jvp_stores_no_step():
    binomial = temps(remat.Binomial(4), "jvp")
    assert binomial[64] == binomial[1024]
    assert binomial[1024] <= 8 * CARRY  # a few carries and tangents, no buffer per step


def test_binomial_vmap_of_grad_is_flat_in_n():
    binomial = temps(remat.Binomial(4), "vmap_grad")
    per_step = temps("per_step", "vmap_grad")
    assert binomial[64] == binomial[1024]
    # per-step checkpointing keeps every step's batched carry: 4 * 256 bytes per step.
    assert per_step[1024] - per_step[64] >= (1024 - 64) * 4 * CARRY
    assert binomial[1024] < per_step[64]


def test_binomial_forward_over_reverse_is_flat_in_n():
    binomial = temps(remat.Binomial(4), "hvp")
    per_step = temps("per_step", "hvp")
    # Only the constant tables (one int per step) grow: no carry is kept per step.
    assert binomial[1024] - binomial[64] <= (1024 - 64) * 4
    assert per_step[1024] - per_step[64] >= (1024 - 64) * CARRY


def test_binomial_grad_of_grad_is_sublinear_in_n():
    binomial = temps(remat.Binomial(4), "grad_of_grad", (64, 1024))
    per_step = temps("per_step", "grad_of_grad", (64, 256))
    # 4x the steps: per-step checkpointing keeps about 4x the carries.
    assert per_step[256] >= 3.5 * per_step[64]
    # 16x the steps, 37x the table rows (N times the repetition number, 3 at N=64 and 8 at
    # N=1024): about sqrt(37) = 6.1x the memory, not 16x.
    assert binomial[1024] <= 7 * binomial[64], binomial


@pytest.mark.xfail(
    strict=True,
    reason="`Binomial` under `grad` of `vmap`: the batching rule of its linear map vmaps Revolve's "
    "backward sweep whole, so the sweep accumulates the gradient of an unbatched weight once "
    "per example (a (B, D, D) buffer); per_step and Nested batch the step instead",
)
def test_binomial_grad_of_vmap_accumulates_an_unbatched_weight_once():
    """A per-example model batched with `jax.vmap` (the Equinox way) against the same scan
    with the batch in its carry: the same program for XLA but for the batching."""
    b, n = 16, 256

    def run(w, c0):
        return remat.scan(
            lambda c, _: (jnp.tanh(c @ w), None), c0, length=n, schedule=remat.Binomial(4)
        )[0]

    w, c = jnp.eye(D) * 0.5, jnp.ones((b, D))
    vmapped = temp_bytes(jax.grad(lambda w, c: jax.vmap(lambda ci: run(w, ci))(c).sum()), w, c)
    batched = temp_bytes(jax.grad(lambda w, c: run(w, c).sum()), w, c)
    # One (D, D) weight gradient per example would be b * 16 KiB = 256 KiB more.
    assert vmapped <= batched + b * D * 4, (vmapped, batched)
