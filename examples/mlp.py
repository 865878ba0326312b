"""A scanned MLP: 8 residual blocks stacked with `jax.lax.scan`, as the CLI examples use it.

    remat measure examples/mlp.py:make --strategy full
    remat compare examples/mlp.py:make --strategies 'full,dots,names:hidden,full+nested(2)'
    remat plan examples/mlp.py:make --budget 60%
    remat lint examples/mlp.py:make

Each factory takes no arguments and returns ``(fn, args)``: the loss and what to call it with.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

LAYERS, WIDTH, HIDDEN, BATCH = 8, 64, 256, 128


def loss(params, x):
    """Mean square of the output of ``LAYERS`` residual MLP blocks."""

    def block(h, p):
        hidden = checkpoint_name(jnp.tanh(h @ p["w1"]), "hidden")
        return h + hidden @ p["w2"], None

    h, _ = jax.lax.scan(block, x, params)
    return jnp.mean(h**2)


@jax.jit  # one compile for the whole initialisation, not one per random operation
def init():
    """Parameters stacked over the layers, and a batch."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (LAYERS, WIDTH, HIDDEN)) / WIDTH**0.5,
        "w2": jax.random.normal(k2, (LAYERS, HIDDEN, WIDTH)) / HIDDEN**0.5,
    }
    return params, jax.random.normal(k3, (BATCH, WIDTH))


def make():
    """The loss and its arguments: parameters stacked over the layers, and a batch."""
    return loss, init()
