"""Unrolled transformers (layers in a Python loop): remat's plans against the peak as written.

Models, each with its layers in a Python loop and activations dominating memory:

- plain JAX: a pre-norm transformer over a list of parameter dicts (`roll_memory.py`'s);
- linen: the demo GPT's unrolled twin (`remat._models._gpt.make_gpt_unrolled`);
- nnx: pre-norm MLP blocks in an `nnx.List`;
- Equinox: a list of `eqx.Module` MLP blocks;
- Hugging Face Flax GPT-2 and BERT from small configs with random weights (no download),
  when `transformers` 4.x (the last to ship the Flax models) is installed.

Per model: the compiled peak of the training step as written; with every layer checkpointed
by hand (``jax.checkpoint`` / ``nn.remat`` / ``nnx.remat`` / ``eqx.filter_checkpoint``, or
Hugging Face's ``gradient_checkpointing=True``); `remat.plan` at 50% and 35% of the peak as
written (measured peak and matmul FLOPs relative to as written); and the time to trace,
detect and roll. Peak = `remat._measure._peak.compiled_memory` of the compiled step.

Usage:
  PYTHONPATH=src python benchmarks/unrolled_bench.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import jax
import jax.numpy as jnp

import remat
from remat._measure._hlo import hlo_flops
from remat._measure._peak import peak_bytes
from remat._plan._plan import plan_budgets
from remat._trace._roll_explain import explain_no_roll
from remat._trace._roll_rewrite import list_runs

MIB = 2**20


def compiled(fn, *args):
    return jax.jit(jax.value_and_grad(fn)).lower(*args).compile()


### Models: (loss as written, loss checkpointed per layer by hand, args)


def plain_jax(layers=8, seq=256, width=64):
    from roll_memory import block, layer_params

    key = jax.random.key(0)
    params = [layer_params(k, width) for k in jax.random.split(key, layers)]
    x = jax.random.normal(key, (seq, width))

    def make(ckpt):
        def loss(params, x):
            mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
            f = jax.checkpoint(block) if ckpt else block
            for p in params:
                x = f(p, x, mask)
            return jnp.mean(x**2)

        return loss

    return make(False), make(True), (params, x)


def linen_gpt(layers=8):
    import flax.linen as nn

    from remat._models import _gpt

    sizes = dict(layers=layers, d_model=64, seq=128, batch=4, heads=4)
    loss, args = _gpt.make_gpt_unrolled(**sizes)
    original = _gpt.Block
    _gpt.Block = nn.remat(original)  # the same model with nn.remat around every block
    try:
        by_hand, _ = _gpt.make_gpt_unrolled(**sizes)
    finally:
        _gpt.Block = original
    return loss, by_hand, args


def nnx_mlp(layers=8, rows=2048, width=64):
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(width, rngs=rngs)
            self.up = nnx.Linear(width, 4 * width, rngs=rngs)
            self.down = nnx.Linear(4 * width, width, rngs=rngs)

        def __call__(self, x):
            return x + self.down(jax.nn.gelu(self.up(self.norm(x))))

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])

    graphdef, state = nnx.split(Model(nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (rows, width))

    def make(ckpt):
        def loss(state, x):
            model = nnx.merge(graphdef, state)
            for b in model.blocks:
                x = nnx.remat(lambda b, x: b(x))(b, x) if ckpt else b(x)
            return jnp.mean(x**2)

        return loss

    return make(False), make(True), (state, x)


def equinox_mlp(layers=8, rows=2048, width=64):
    import equinox as eqx

    class Block(eqx.Module):
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.up = eqx.nn.Linear(width, 4 * width, key=k1)
            self.down = eqx.nn.Linear(4 * width, width, key=k2)

        def __call__(self, x):
            return x + self.down(jax.nn.gelu(self.up(x)))

    blocks = [Block(k) for k in jax.random.split(jax.random.key(0), layers)]
    x = jax.random.normal(jax.random.key(1), (rows, width))

    def make(ckpt):
        def loss(blocks, x):
            for b in blocks:
                f = eqx.filter_checkpoint(jax.vmap(b)) if ckpt else jax.vmap(b)
                x = f(x)
            return jnp.mean(x**2)

        return loss

    return make(False), make(True), (blocks, x)


def hf(kind, layers=6):
    """Hugging Face Flax GPT-2 or BERT, small config, random weights, no download."""
    import transformers as tr

    ids = jax.random.randint(jax.random.key(0), (4, 128), 0, 512)
    if kind == "gpt2":
        config = tr.GPT2Config(vocab_size=512, n_positions=128, n_embd=64, n_layer=layers,
                               n_head=4)  # fmt: skip
        cls = tr.FlaxGPT2LMHeadModel
    else:
        config = tr.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=layers,
                               num_attention_heads=4, intermediate_size=256,
                               max_position_embeddings=128)  # fmt: skip
        cls = tr.FlaxBertForMaskedLM

    def make(ckpt):
        try:
            model = cls(config, seed=0, **({"gradient_checkpointing": True} if ckpt else {}))
        except TypeError:  # FlaxGPT2 has no gradient checkpointing in transformers 4.x
            return None, None

        def loss(params, ids):
            logits = model(ids, params=params, train=False).logits
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, ids[..., None], axis=-1))

        return loss, model.params

    (loss, params), (by_hand, _) = make(False), make(True)
    return loss, by_hand, (params, ids)


MODELS = {
    "plain JAX transformer (list of dicts)": plain_jax,
    "linen GPT, blocks in a loop": linen_gpt,
    "nnx MLP blocks (nnx.List)": nnx_mlp,
    "Equinox MLP blocks (list of modules)": equinox_mlp,
    "Hugging Face FlaxGPT2LMHeadModel": lambda: hf("gpt2"),
    "Hugging Face FlaxBertForMaskedLM": lambda: hf("bert"),
}


def row(name, build) -> str:
    loss, by_hand, args = build()
    start = time.perf_counter()
    runs = list_runs(loss, *args)
    detect = time.perf_counter() - start
    written = compiled(loss, *args)
    base, base_flops = peak_bytes(written), hlo_flops(written.as_text())
    cells = [name, f"{base / MIB:.2f}"]
    if by_hand is None:
        cells.append("n/a (the model has no per-layer checkpoint option)")
    else:
        cells.append(f"{peak_bytes(compiled(by_hand, *args)) / base:.2f}")
    if not runs:
        why = explain_no_roll(jax.make_jaxpr(loss)(*args))
        return "| " + " | ".join([*cells, "-", "-", "-"]) + f" |\n\nnothing rolled: {why}"
    for p in plan_budgets(loss, *args, budgets=[0.5, 0.35], schedules=False):
        if isinstance(p, remat.InfeasibleBudget):
            cells.append(f"no fit (>= {p.smallest_peak_bytes / base:.2f})")
        else:
            cells.append(
                f"{p.measured_peak_bytes / base:.2f}, {p.measured.flops / base_flops:.2f}x"
            )
    layers = "+".join(str(r.length) for r in runs)
    cells.append(f"{layers} layers, {detect:.2f} s")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="substrings of the model names to run")
    a = parser.parse_args()
    print(
        f"jax {jax.__version__}, {jax.default_backend()} backend, {platform.machine()}; "
        "peak and FLOPs relative to the training step as written\n"
    )
    print("| model | peak MiB as written | checkpoint per layer by hand | plan 50%: peak, FLOPs "
          "| plan 35%: peak, FLOPs | rolled (trace + detect) |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|")
    for name, build in MODELS.items():
        if a.only and not any(s in name for s in a.only):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                print(row(name, build), flush=True)
            except ImportError as err:
                print(f"| {name} | skipped: {err} | | | | |", flush=True)


if __name__ == "__main__":
    main()
