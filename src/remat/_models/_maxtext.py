"""A llama-style decoder built the way MaxText builds its layers, with MaxText's
``checkpoint_name``s on the same values and its ``remat_policy`` presets (`PRESETS`).

An ``nn.scan`` over ``nn.remat(layer, policy=..., prevent_cse=False)`` (MaxText's
``scan_layers=True``); the names: ``decoder_layer_input``; ``query_proj``, ``key_proj``,
``value_proj`` (after RoPE); ``context`` and ``attention_out`` (the attention's output before
the out projection: ``context`` is the name MaxText's flash-attention kernels give it);
``out_proj``; ``mlpwi_0``, ``mlpwi_1`` (the gated MLP's two input projections, before the
SiLU); ``mlpwo``. Used by ``benchmarks/maxtext_presets.py``, ``benchmarks/scale_bench.py``
and the planner's tests.

``kv_heads`` below ``heads`` is grouped-query attention (each key/value head serves
``heads // kv_heads`` query heads, as in Llama 3); ``dtype`` is the compute dtype (bf16 compute
on float32 master weights: the parameters stay float32 and are cast where they are used).
`decoder_shapes` gives the loss and `jax.ShapeDtypeStruct` s of its arguments without
allocating them: a model of any size can be measured and planned from them.

Example:
  >>> from remat._models._maxtext import PRESETS, make_decoder
  >>> from remat._models._maxtext import QUICK
  >>> loss, (params, tokens) = make_decoder(PRESETS["save_out_proj"], QUICK)
  >>> tokens.shape
  (4, 65)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

# The benchmark's sizes: the full run and ``--quick``. ``kv_heads`` (default ``heads``) and
# ``dtype`` (default float32) are optional.
FULL = dict(layers=8, d_model=128, heads=4, mlp_dim=512, seq=128, batch=8, vocab=256)
QUICK = dict(layers=4, d_model=64, heads=4, mlp_dim=256, seq=64, batch=4, vocab=128)

# MaxText's presets (`get_remat_policy` in its decoder layers module), non-offloading ones.
PROJECTIONS = ("query_proj", "key_proj", "value_proj", "qkv_proj", "kv_proj")
PRESETS: dict[str, tuple[str, ...] | None] = {
    "minimal": (*PROJECTIONS, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"),
    "minimal_with_context": (
        *PROJECTIONS,
        "context",
        "out_proj",
        "mlpwi_0",
        "mlpwi_1",
        "mlpwi",
        "mlpwo",
    ),
    "save_dot_with_context_except_mlp": (*PROJECTIONS, "context", "out_proj"),
    "save_dot_except_mlpwi": (*PROJECTIONS, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*PROJECTIONS, "out_proj"),
    "save_qkv_proj": PROJECTIONS,
    "save_out_proj": ("out_proj",),
    "full": (),
    "none": None,
}


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale.astype(x.dtype)


def rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding on ``(batch, seq, heads, head_dim)``."""
    seq, hd = x.shape[1], x.shape[-1]
    freq = 1.0 / (10000 ** (jnp.arange(0, hd, 2) / hd))
    angle = jnp.arange(seq)[:, None] * freq[None, :]  # (seq, hd/2)
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class DecoderLayer(nn.Module):
    """A llama-style decoder layer, with MaxText's checkpoint names on MaxText's values."""

    d_model: int
    heads: int
    mlp_dim: int
    kv_heads: int | None = None  # fewer than ``heads``: grouped-query attention
    dtype: Any = jnp.float32  # the compute dtype; parameters stay float32
    # The sharding of the (batch, seq, d_model) activations, as MaxText's logical axis rules
    # give it (the batch over the data and FSDP axes), or None: XLA propagates one from the
    # parameters (with FSDP sharding the weights, it keeps the activations whole).
    activations: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
        _, seq, d = x.shape
        x = constrain(x, self.activations)
        hd = d // self.heads
        kv = self.kv_heads or self.heads

        def dense(features, name, axis=-1):
            return nn.DenseGeneral(features, axis=axis, use_bias=False, name=name, dtype=self.dtype)

        x = checkpoint_name(x, "decoder_layer_input")
        h = RMSNorm(name="pre_self_attention_norm")(x)
        q = checkpoint_name(rope(dense((self.heads, hd), "query")(h)), "query_proj")
        k = checkpoint_name(rope(dense((kv, hd), "key")(h)), "key_proj")
        v = checkpoint_name(dense((kv, hd), "value")(h), "value_proj")
        if kv != self.heads:  # each key/value head serves heads // kv query heads
            k, v = (jnp.repeat(a, self.heads // kv, axis=2) for a in (k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(hd))
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)
        ctx = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v), "context")
        ctx = checkpoint_name(ctx, "attention_out")
        out = checkpoint_name(dense(d, "out", axis=(-2, -1))(ctx), "out_proj")
        x = x + out
        h = RMSNorm(name="post_self_attention_norm")(x)
        wi0 = checkpoint_name(dense(self.mlp_dim, "wi_0")(h), "mlpwi_0")
        wi1 = checkpoint_name(dense(self.mlp_dim, "wi_1")(h), "mlpwi_1")
        wo = checkpoint_name(dense(d, "wo")(nn.silu(wi0) * wi1), "mlpwo")
        return constrain(x + wo, self.activations), None


def constrain(x: jax.Array, sharding: Any) -> jax.Array:
    """``x`` constrained to ``sharding`` (None: left to XLA's propagation)."""
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


class Decoder(nn.Module):
    layers: int
    d_model: int
    heads: int
    mlp_dim: int
    vocab: int
    policy: Any = None  # a checkpoint policy, or None for no nn.remat
    remat: bool = False
    kv_heads: int | None = None
    dtype: Any = jnp.float32
    activations: Any = None  # see `DecoderLayer.activations`

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d_model, name="token_embedder", dtype=self.dtype)(tokens)
        x = constrain(x, self.activations)
        layer = DecoderLayer
        if self.remat:
            layer = nn.remat(layer, policy=self.policy, prevent_cse=False)
        stack = nn.scan(
            layer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.layers,
        )(self.d_model, self.heads, self.mlp_dim, self.kv_heads, self.dtype, self.activations,
          name="layers")  # fmt: skip
        x, _ = stack(x, None)
        x = RMSNorm(name="decoder_norm")(x)
        logits = nn.DenseGeneral(self.vocab, use_bias=False, name="logits_dense", dtype=self.dtype)
        return constrain(logits(x), self.activations)


def make_decoder(policy_names: tuple[str, ...] | None, sizes: dict):
    """``(loss, (params, tokens))`` for the decoder with a preset (``None``: no nn.remat)."""
    model, loss = _model(policy_names, sizes)
    tokens = jax.random.randint(
        jax.random.key(1), (sizes["batch"], sizes["seq"] + 1), 0, sizes["vocab"]
    )
    params = jax.jit(model.init)(jax.random.key(0), tokens[:, :-1])["params"]
    return loss, (params, tokens)


def decoder_shapes(policy_names: tuple[str, ...] | None, sizes: dict):
    """``(loss, (params, tokens))`` as `make_decoder` gives them, the arguments as
    `jax.ShapeDtypeStruct` s (float32 parameters, int32 tokens): nothing is allocated.

    Example:
      >>> from remat._models._maxtext import decoder_shapes
      >>> sizes = dict(layers=80, d_model=8192, heads=64, kv_heads=8, mlp_dim=28672,
      ...              seq=4096, batch=1, vocab=128256)
      >>> loss, (params, tokens) = decoder_shapes(None, sizes)
      >>> params["layers"]["key"]["kernel"].shape, tokens.shape
      ((80, 8192, 8, 128), (1, 4097))
    """
    model, loss = _model(policy_names, sizes)
    tokens = jax.ShapeDtypeStruct((sizes["batch"], sizes["seq"] + 1), jnp.int32)
    init = jax.eval_shape(model.init, jax.random.key(0), tokens_in(tokens))
    return loss, (init["params"], tokens)


def tokens_in(tokens: Any) -> jax.ShapeDtypeStruct:
    """The model's input: every token but the last."""
    return jax.ShapeDtypeStruct((tokens.shape[0], tokens.shape[1] - 1), tokens.dtype)


def _model(policy_names: tuple[str, ...] | None, sizes: dict):
    if policy_names is None:
        policy, use_remat = None, False
    elif policy_names:
        policy, use_remat = jax.checkpoint_policies.save_only_these_names(*policy_names), True
    else:
        policy, use_remat = jax.checkpoint_policies.nothing_saveable, True
    model = Decoder(
        sizes["layers"], sizes["d_model"], sizes["heads"], sizes["mlp_dim"], sizes["vocab"],
        policy=policy, remat=use_remat, kv_heads=sizes.get("kv_heads"),
        dtype=sizes.get("dtype", jnp.float32), activations=sizes.get("activations"),
    )  # fmt: skip

    def loss(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return model, loss


# The usual FSDP x tensor layout of a Llama's weights (`fsdp_tensor`): per parameter kind, the
# mesh axes of its dimensions (after the layers' axis of the scanned ones).
FSDP_TENSOR = {
    "query": ("fsdp", "tensor", None), "key": ("fsdp", "tensor", None),
    "value": ("fsdp", "tensor", None), "out": ("tensor", None, "fsdp"),
    "wi_0": ("fsdp", "tensor"), "wi_1": ("fsdp", "tensor"), "wo": ("tensor", "fsdp"),
    "token_embedder": ("tensor", "fsdp"), "logits_dense": ("fsdp", "tensor"),
}  # fmt: skip


def fsdp_tensor(params: Any, tokens: Any, mesh: Any) -> tuple[Any, Any]:
    """`decoder_shapes`' arguments placed over a mesh with axes ``("fsdp", "tensor")``: the
    weights as `FSDP_TENSOR` says (the rest whole), the batch over ``fsdp``; no constraint on
    the activations, so XLA's partitioner chooses their layout.

    Example:
      >>> import jax
      >>> from remat._models._maxtext import QUICK, decoder_shapes, fsdp_tensor
      >>> mesh = jax.make_mesh((1, 1), ("fsdp", "tensor"))
      >>> _, (params, tokens) = decoder_shapes(None, QUICK)
      >>> params, tokens = fsdp_tensor(params, tokens, mesh)
      >>> params["layers"]["query"]["kernel"].sharding.spec
      P(None, 'fsdp', 'tensor', None)
    """
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def place(path, leaf):
        names = [getattr(k, "key", "") for k in path]
        lead = (None,) if "layers" in names else ()
        axes = FSDP_TENSOR.get(names[-2] if len(names) > 1 else "")
        if axes is None or len(lead) + len(axes) != len(leaf.shape):
            axes, lead = (), ()
        spec = NamedSharding(mesh, P(*lead, *axes))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=spec)

    placed = jax.tree_util.tree_map_with_path(place, params)
    split = NamedSharding(mesh, P("fsdp"))
    return placed, jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=split)
