"""Step time on the CPU backend: a stack of layers in a Python loop against the same layers in
`lax.scan` (what rolling makes of the loop), for convolutions and for matmuls.

Rolling a Python loop into a scan (`remat.apply`, `remat.plan`) changes the program's memory,
which is the point, and its time, which XLA's CPU backend decides. This measures the
training step (`jax.value_and_grad`) of: the loop as written; the loop written as `lax.scan`
by hand (no checkpointing); and `remat.apply(loss, "full")` of the loop (rolled, every step
recomputed). Side by side in one process, medians of ``--repeats`` runs after a warm-up.

Usage:
  PYTHONPATH=src python benchmarks/conv_scan_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

import remat

LAYERS = 6


def _conv(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _dense(x, w):
    return x @ w


def _looped(layer):
    def loss(ws, x):
        for w in ws:
            x = jax.nn.relu(x + layer(x, w))
        return jnp.sum(x**2)

    return loss


def _scanned(layer):
    def loss(ws, x):
        x, _ = lax.scan(lambda h, w: (jax.nn.relu(h + layer(h, w)), None), x, jnp.stack(ws))
        return jnp.sum(x**2)

    return loss


def _median_ms(fn, args, repeats: int) -> float:
    step = jax.jit(jax.value_and_grad(fn))
    jax.block_until_ready(step(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    repeats = parser.parse_args().repeats
    keys = jax.random.split(jax.random.key(0), LAYERS + 1)
    models = {
        "conv 3x3, 16 channels, 8x16x16 (NHWC)": (
            _conv,
            [jax.random.normal(k, (3, 3, 16, 16)) * 0.05 for k in keys[1:]],
            jax.random.normal(keys[0], (8, 16, 16, 16)),
        ),
        "matmul 256x256, 512 rows": (
            _dense,
            [jax.random.normal(k, (256, 256)) * 0.05 for k in keys[1:]],
            jax.random.normal(keys[0], (512, 256)),
        ),
    }
    print(f"jax {jax.__version__}, {jax.default_backend()} backend, {LAYERS} layers, "
          f"median of {repeats}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| layers | loop as written ms | lax.scan by hand ms | remat.apply(loss, 'full') ms |")
    print("|---|---:|---:|---:|")
    for name, (layer, ws, x) in models.items():
        loop = _looped(layer)
        cols = [_median_ms(f, (ws, x), repeats) for f in (loop, _scanned(layer))]
        cols.append(_median_ms(remat.apply(loop, "full"), (ws, x), repeats))
        print(f"| {name} | " + " | ".join(f"{c:.1f} ({c / cols[0]:.1f}x)" for c in cols) + " |")


if __name__ == "__main__":
    main()
