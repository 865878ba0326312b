"""A small GPT-style decoder for the demo, tests and benchmarks, and its unrolled twin.

Written with Flax linen: token and position embeddings, ``layers`` pre-LayerNorm blocks of
causal multi-head self-attention and a GELU MLP, stacked with `flax.linen.scan` (one
`lax.scan` over stacked parameters, as real large models are written), a final LayerNorm and
logits tied to the token embedding; the loss is the mean next-token cross-entropy.

Inside each block the interesting intermediate values carry a `checkpoint_name` (see
`GPT_NAMES`), so ``"names:..."`` strategies have something to select:

- ``"qkv"``: the fused query/key/value projection, ``(batch, seq, 3 * d_model)``;
- ``"attn_scores"``: the scaled query-key products before the mask and softmax,
  ``(batch, heads, seq, seq)``;
- ``"attn_probs"``: the attention probabilities after the softmax, same shape;
- ``"attn_out"``: the attention output after its projection, ``(batch, seq, d_model)``;
- ``"mlp_hidden"``: the MLP's up-projection before the GELU, ``(batch, seq, 4 * d_model)``;
- ``"block_out"``: the block's output (the residual stream), ``(batch, seq, d_model)``.

`make_gpt_unrolled` builds the same model with its blocks called in a Python loop
(``block_0``, ``block_1``, ... as most models are written), with the same weights, unstacked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

GPT_NAMES = ("qkv", "attn_scores", "attn_probs", "attn_out", "mlp_hidden", "block_out")

_BAD_SHAPE = (
    "`remat._models._gpt.make_gpt` got d_model={d_model} and heads={heads}; d_model must be a "
    "positive multiple of heads (e.g. d_model=128, heads=4)."
)


class Block(nn.Module):
    """One pre-LayerNorm decoder block: causal self-attention, then an MLP."""

    d_model: int
    heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, _: None) -> tuple[jax.Array, None]:
        batch, seq, d = x.shape
        head_dim = d // self.heads
        dense = lambda n, name: nn.Dense(  # noqa: E731
            n, use_bias=False, dtype=self.dtype, param_dtype=self.dtype, name=name
        )
        norm = lambda name: nn.LayerNorm(dtype=self.dtype, param_dtype=self.dtype, name=name)  # noqa: E731

        h = norm("ln_attn")(x)
        qkv = checkpoint_name(dense(3 * d, "qkv")(h), "qkv")
        q, k, v = jnp.split(qkv.reshape(batch, seq, 3, self.heads, head_dim), 3, axis=2)
        q, k, v = (t.squeeze(2) for t in (q, k, v))  # (batch, seq, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(self.dtype)
        scores = checkpoint_name(scores, "attn_scores")
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(self.dtype)
        probs = checkpoint_name(probs, "attn_probs")
        attn = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, d)
        attn = checkpoint_name(dense(d, "attn_proj")(attn), "attn_out")
        x = x + attn

        h = norm("ln_mlp")(x)
        h = checkpoint_name(dense(4 * d, "mlp_up")(h), "mlp_hidden")
        h = dense(d, "mlp_down")(jax.nn.gelu(h))
        x = checkpoint_name(x + h, "block_out")
        return x, None


class GPT(nn.Module):
    """Embeddings, a scanned stack of `Block`s, a final LayerNorm and tied logits."""

    layers: int
    d_model: int
    heads: int
    vocab: int
    seq: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(
            self.vocab, self.d_model, dtype=self.dtype, param_dtype=self.dtype, name="embed"
        )
        pos = self.param(
            "pos_embed", nn.initializers.normal(0.02), (self.seq, self.d_model), self.dtype
        )
        x = embed(tokens) + pos[: tokens.shape[1]]
        x = self.stack(x)
        x = nn.LayerNorm(dtype=self.dtype, param_dtype=self.dtype, name="ln_final")(x)
        return embed.attend(x)

    def stack(self, x: jax.Array) -> jax.Array:
        """The `Block`s, as one ``nn.scan`` over stacked parameters (``blocks``)."""
        blocks = nn.scan(
            Block,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.layers,
        )(self.d_model, self.heads, self.dtype, name="blocks")
        return blocks(x, None)[0]


class UnrolledGPT(GPT):
    """`GPT` with its `Block`s called one after the other in a Python loop."""

    def stack(self, x: jax.Array) -> jax.Array:
        """The `Block`s in a Python loop, with parameters ``block_0``, ``block_1``, ..."""
        for i in range(self.layers):
            x, _ = Block(self.d_model, self.heads, self.dtype, name=f"block_{i}")(x, None)
        return x


def _cross_entropy(model: nn.Module) -> Callable[..., jax.Array]:
    def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, tokens[:, :-1]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        target = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
        return -jnp.mean(target)

    return loss_fn


def make_gpt_unrolled(
    layers: int = 4,
    d_model: int = 128,
    seq: int = 128,
    batch: int = 8,
    heads: int = 4,
    vocab: int = 256,
    seed: int = 0,
    dtype: Any = jnp.float32,
) -> tuple[Callable[..., jax.Array], tuple[Any, jax.Array]]:
    """The demo GPT of `make_gpt` with its blocks in a Python loop: the same model and weights.

    Takes `make_gpt`'s arguments. The parameters are `make_gpt`'s with the stacked
    ``blocks`` split into ``block_0``, ``block_1``, ...; the loss is the same function of
    them, so values and gradients equal `make_gpt`'s (the gradient split the same way).

    Example:
      >>> import jax
      >>> from remat._models._gpt import make_gpt, make_gpt_unrolled
      >>> sizes = dict(layers=2, d_model=16, seq=8, batch=2, heads=2)
      >>> loss_fn, (params, tokens) = make_gpt_unrolled(**sizes)
      >>> sorted(params)
      ['block_0', 'block_1', 'embed', 'ln_final', 'pos_embed']
      >>> scanned, (stacked, _) = make_gpt(**sizes)
      >>> bool(abs(jax.jit(loss_fn)(params, tokens) - jax.jit(scanned)(stacked, tokens)) < 1e-5)
      True
    """
    _, (stacked, tokens) = make_gpt(layers, d_model, seq, batch, heads, vocab, seed, dtype)
    params = {k: v for k, v in stacked.items() if k != "blocks"}
    for i in range(layers):
        params[f"block_{i}"] = jax.tree.map(lambda a, i=i: a[i], stacked["blocks"])
    model = UnrolledGPT(
        layers=layers, d_model=d_model, heads=heads, vocab=vocab, seq=seq, dtype=dtype
    )
    return _cross_entropy(model), (params, tokens)


def make_gpt(
    layers: int = 4,
    d_model: int = 128,
    seq: int = 128,
    batch: int = 8,
    heads: int = 4,
    vocab: int = 256,
    seed: int = 0,
    dtype: Any = jnp.float32,
) -> tuple[Callable[..., jax.Array], tuple[Any, jax.Array]]:
    """Builds the demo GPT and one batch of random tokens.

    Args:
      layers: number of decoder blocks (the length of the layer scan).
      d_model: width of the residual stream; a multiple of ``heads``.
      seq: sequence length the model runs at.
      batch: sequences per batch.
      heads: attention heads.
      vocab: vocabulary size.
      seed: seed for the parameters and the tokens.
      dtype: dtype of the parameters and the computation (the softmax runs in float32).

    Returns:
      ``(loss_fn, (params, tokens))``: ``loss_fn(params, tokens)`` is the mean next-token
      cross-entropy (a scalar); ``params`` is a pytree (a dict) whose per-layer leaves are
      stacked along a leading ``layers`` axis, ``tokens`` an int32 ``(batch, seq + 1)``
      array. Differentiate with respect to argument 0 (``argnums=0``).

    Raises:
      ValueError: ``d_model`` is not a positive multiple of ``heads``.

    Example:
      >>> import jax
      >>> from remat._models._gpt import make_gpt
      >>> loss_fn, (params, tokens) = make_gpt(layers=2, d_model=16, seq=8, batch=2, heads=2)
      >>> tokens.shape
      (2, 9)
      >>> params["blocks"]["qkv"]["kernel"].shape
      (2, 16, 48)
      >>> bool(jax.numpy.isfinite(jax.jit(loss_fn)(params, tokens)))
      True
    """
    if heads < 1 or d_model < 1 or d_model % heads:
        raise ValueError(_BAD_SHAPE.format(d_model=d_model, heads=heads))
    model = GPT(layers=layers, d_model=d_model, heads=heads, vocab=vocab, seq=seq, dtype=dtype)
    param_key, token_key = jax.random.split(jax.random.key(seed))
    tokens = jax.random.randint(token_key, (batch, seq + 1), 0, vocab, dtype=jnp.int32)
    params = jax.jit(model.init)(param_key, tokens[:, :-1])["params"]
    return _cross_entropy(model), (params, tokens)


def make_demo_gpt() -> tuple[Callable[..., jax.Array], tuple[Any, jax.Array]]:
    """`make_gpt` at ``remat demo``'s sizes (8 layers, d_model 128, seq 128, batch 8, 4
    heads): a factory for the command line, e.g. ``remat memory
    remat._models._gpt:make_demo_gpt``."""
    return make_gpt(layers=8, d_model=128, seq=128, batch=8, heads=4)
