"""A training step with dropout and Adam: 6 residual MLP blocks in a scan, bf16 compute on
float32 master weights, a dropout key per block.

From the shell, the loss (the key is an argument like the others):

    remat plan examples/train.py:make --budget 70%

From Python, the whole step with Adam inside the budget (``python examples/train.py``):
`remat.plan(..., optimizer=optax.adam(1e-3))` plans value, gradient and update together, and
`plan.step` runs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LAYERS, WIDTH, HIDDEN, BATCH, KEEP = 6, 64, 256, 128, 0.9


def loss(params, x, key):
    """Mean square of the output, with dropout after each block's activation."""

    def block(h, p):
        w1, w2, k = p
        a = jax.nn.gelu(h @ w1.astype(jnp.bfloat16))
        a = a * jax.random.bernoulli(k, KEEP, a.shape) / KEEP
        return h + a @ w2.astype(jnp.bfloat16), None

    keys = jax.random.split(key, params["w1"].shape[0])
    h, _ = jax.lax.scan(block, x.astype(jnp.bfloat16), (params["w1"], params["w2"], keys))
    return jnp.mean(h.astype(jnp.float32) ** 2)


def make():
    """The loss and its arguments: float32 weights, a batch and a dropout key."""
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (LAYERS, WIDTH, HIDDEN)) * 0.02,
        "w2": jax.random.normal(k2, (LAYERS, HIDDEN, WIDTH)) * 0.02,
    }
    return loss, (params, jnp.ones((BATCH, WIDTH)), jax.random.key(1))


def main(steps: int = 3) -> list[float]:
    """Plans the step with Adam at 70% of its peak and trains ``steps`` steps with it."""
    import optax

    import remat

    fn, (params, x, _) = make()
    tx = optax.adam(1e-3)
    plan = remat.plan(fn, params, x, jax.random.key(1), budget="70%", optimizer=tx)
    print(plan.explain())
    opt_state, losses = tx.init(params), []
    for i in range(steps):  # params and opt_state are donated, as in any training loop
        params, opt_state, value = plan.step(params, opt_state, x, jax.random.key(i))
        losses.append(float(value))
    return losses


if __name__ == "__main__":
    print(main())
