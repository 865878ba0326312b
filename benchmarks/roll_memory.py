"""What rolling costs and saves: the compiled peak of an unrolled transformer's training step.

One model (a pre-norm transformer: attention with a causal mask and softmax, an MLP with
gelu, layer norms; layers in a Python loop over a list of parameter dicts), compiled side by
side in this one process in six forms:

- as written (the Python loop);
- ``jax.checkpoint`` around each layer by hand (``nn.remat`` per layer);
- per-layer ``custom_vjp`` checkpoints whose recomputation waits for the incoming
  cotangent (``lax.optimization_barrier``), no scan;
- stacked inside the step (``jnp.stack``), scanned, every step checkpointed;
- ``roll(fn)``: the layers rolled into a `lax.scan` that selects each layer's weights
  with `lax.switch` (no copy);
- ``remat.apply(fn, "full")``: the same (rolled by default), every step checkpointed;
- stacked by hand (the parameters passed in already stacked, as `nn.scan` or `nnx.scan`
  with a vmapped init keep them), scanned, without and with a checkpointed body.

Peak = `remat._measure._peak.peak_bytes` of the compiled step. Prints a markdown table for docs/rolling.md.

Usage:
  PYTHONPATH=src python benchmarks/roll_memory.py [--layers 12] [--seq 256] [--width 64]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import remat
from remat._measure._peak import peak_bytes
from remat._trace._roll_rewrite import list_runs, roll


def norm(h, g):
    mu = h.mean(-1, keepdims=True)
    return (h - mu) * jax.lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def block(p, x, mask):
    h = norm(x, p["g1"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    a = jax.nn.softmax(jnp.where(mask, q @ k.T / q.shape[-1] ** 0.5, -1e9), axis=-1)
    x = x + (a @ v) @ p["o"]
    return x + jax.nn.gelu(norm(x, p["g2"]) @ p["up"], approximate=False) @ p["down"]


def layer_params(key, width):
    ks = jax.random.split(key, 4)
    return {
        "g1": jnp.ones(width),
        "qkv": jax.random.normal(ks[0], (width, 3 * width)) / width**0.5,
        "o": jax.random.normal(ks[1], (width, width)) / width**0.5,
        "g2": jnp.ones(width),
        "up": jax.random.normal(ks[2], (width, 4 * width)) / width**0.5,
        "down": jax.random.normal(ks[3], (4 * width, width)) / (2 * width),
    }


def unrolled(layers, x):
    mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
    for p in layers:
        x = block(p, x, mask)
    return jnp.mean(x**2)


def per_layer_checkpoint(layers, x):
    mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
    for p in layers:
        x = jax.checkpoint(block)(p, x, mask)
    return jnp.mean(x**2)


def stacked_inside(layers, x):
    """The stacked construction: per-layer weights stacked inside the step, then scanned."""
    return stacked(True)(jax.tree.map(lambda *ws: jnp.stack(ws), *layers), x)


def barrier_checkpoint(f):
    """Per-layer checkpoint whose recomputation waits for the incoming cotangent."""

    @jax.custom_vjp
    def g(*args):
        return f(*args)

    def fwd(*args):
        return f(*args), args

    def bwd(args, ct):
        args, ct = jax.lax.optimization_barrier((args, ct))
        return jax.vjp(f, *args)[1](ct)

    g.defvjp(fwd, bwd)
    return g


def per_layer_barrier(layers, x):
    mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
    for p in layers:
        x = barrier_checkpoint(block)(p, x, mask)
    return jnp.mean(x**2)


def stacked(checkpoint):
    def loss(params, x):
        mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))

        def step(h, p):
            return block(p, h, mask), None

        body = jax.checkpoint(step, prevent_cse=False) if checkpoint else step
        return jnp.mean(jax.lax.scan(body, x, params)[0] ** 2)

    return loss


def peak(fn, *args) -> int:
    return peak_bytes(jax.jit(jax.value_and_grad(fn)).lower(*args).compile())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=64)
    a = parser.parse_args()
    key = jax.random.key(0)
    layers = [layer_params(k, a.width) for k in jax.random.split(key, a.layers)]
    x = jax.random.normal(key, (a.seq, a.width))
    stack = jax.tree.map(lambda *ws: jnp.stack(ws), *layers)
    weights = sum(w.nbytes for w in jax.tree.leaves(layers))

    t0 = time.perf_counter()
    (run,) = list_runs(unrolled, layers, x)
    detect = time.perf_counter() - t0
    rows = [
        ("as written (Python loop)", peak(unrolled, layers, x)),
        ("`jax.checkpoint` per layer by hand", peak(per_layer_checkpoint, layers, x)),
        (
            "barrier: per-layer `custom_vjp` + `optimization_barrier`",
            peak(per_layer_barrier, layers, x),
        ),
        ("stacked, rolled, every step checkpointed", peak(stacked_inside, layers, x)),
        ("`roll(fn)` (selected)", peak(roll(unrolled), layers, x)),
        ('selected, `remat.apply(fn, "full")`', peak(remat.apply(unrolled, "full"), layers, x)),
        ("stacked by hand, `lax.scan`", peak(stacked(False), stack, x)),
        ("stacked by hand, scan + checkpointed body", peak(stacked(True), stack, x)),
    ]
    base = rows[0][1]
    print(
        f"{a.layers} layers, sequence {a.seq}, width {a.width}: weights {weights / 2**20:.2f} "
        f"MiB; run of {run.length} layers x {run.period} eqns found in {detect:.2f} s "
        f"(trace included); jax {jax.__version__}, {jax.default_backend()} backend\n"
    )
    print("| form | peak MiB | of as written |")
    print("|---|---:|---:|")
    for name, value in rows:
        print(f"| {name} | {value / 2**20:.2f} | {value / base:.2f} |")


if __name__ == "__main__":
    main()
