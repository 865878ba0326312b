"""A small GPT written the usual way: Flax linen blocks called in a Python loop (no scan).

remat rolls the identical blocks into one scan (``rolled_4_layers``), so every command works
on it as on a scanned model:

    remat measure examples/gpt.py:make --strategy full
    remat compare examples/gpt.py:make --strategies 'full,dots'
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

LAYERS, D_MODEL, HEADS, SEQ, BATCH, VOCAB = 4, 32, 2, 16, 2, 64


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and a GELU MLP, each with a residual."""

    d_model: int
    heads: int

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(h, h, mask=mask)
        h = nn.Dense(4 * self.d_model)(nn.LayerNorm()(x))
        return x + nn.Dense(self.d_model)(nn.gelu(h))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a tied output projection."""

    layers: int = LAYERS
    d_model: int = D_MODEL
    heads: int = HEADS
    vocab: int = VOCAB

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.d_model)
        x = embed(tokens) + self.param(
            "pos", nn.initializers.normal(0.02), (tokens.shape[1], self.d_model)
        )
        for _ in range(self.layers):  # the blocks in a Python loop
            x = Block(self.d_model, self.heads)(x)
        return embed.attend(nn.LayerNorm()(x))


def make():
    """The next-token cross-entropy and its arguments (parameters, a batch of tokens)."""
    model = GPT()
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
    # under jax.jit: one compile for the whole initialisation, not one per operation
    params = jax.jit(model.init)(jax.random.key(0), tokens[:, :-1])["params"]

    def loss(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return loss, (params, tokens)
