"""`remat.scan` as a drop-in: time per step of each schedule against `lax.scan` + checkpoint.

For the recurrence ``c <- tanh(W @ c + x)`` (carry of 64 float32, ``W`` closed over, one
input row per step), times the forward pass alone and the gradient (with respect to ``W``,
the initial carry and the inputs) of

- `jax.lax.scan` with a `jax.checkpoint`-ed body (the baseline),
- `remat.scan` with ``"per_step"``, ``Nested(2)`` and ``Binomial(8)``,

at N = 64, 1024 and 8192 steps. Each time is the median of ``--repeats`` calls after a
warm-up, timed round-robin across the methods (so that load from other processes falls on
all alike), and reported per step. Writes a table between ``<!-- dropin:start -->`` and
``<!-- dropin:end -->`` in BENCHMARKS.md.

Run: ``PYTHONPATH=src python benchmarks/scan_dropin_bench.py`` (about 2 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from rich.console import Console
from rich.table import Table

import remat
from bench_common import cpu_name
from remat._core._io import replace_section

WIDTH = 64
STEPS = (64, 1024, 8192)
METHODS = {
    "lax.scan + checkpoint": None,
    "remat per_step": "per_step",
    "remat Nested(2)": remat.Nested(2),
    "remat Binomial(8)": remat.Binomial(8),
}
BENCH_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MARKERS = ("<!-- dropin:start -->", "<!-- dropin:end -->")


def make_loss(schedule):
    def loss(w, c0, xs):
        def step(c, x):
            c = jnp.tanh(w @ c + x)
            return c, jnp.sum(c)

        if schedule is None:
            c, ys = jax.lax.scan(jax.checkpoint(step), c0, xs)
        else:
            c, ys = remat.scan(step, c0, xs, schedule=schedule)
        return jnp.sum(c**2) + jnp.mean(ys)

    return loss


def compile_all(n: int) -> dict:
    key = jax.random.key(0)
    w = jax.random.normal(key, (WIDTH, WIDTH)) / WIDTH**0.5
    args = (w, jnp.ones(WIDTH), 0.1 * jax.random.normal(key, (n, WIDTH)))
    out = {}
    for name, schedule in METHODS.items():
        loss = make_loss(schedule)
        for mode, fn in (("forward", loss), ("grad", jax.grad(loss, argnums=(0, 1, 2)))):
            compiled = jax.jit(fn).lower(*args).compile()
            jax.block_until_ready(compiled(*args))  # warm-up
            out[name, mode] = (compiled, args)
    return out


def time_round_robin(compiled: dict, repeats: int) -> dict:
    times: dict = {k: [] for k in compiled}
    for _ in range(repeats):
        for k, (fn, args) in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(t) for k, t in times.items()}


def machine() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} CPUs visible, {jax.devices()[0].platform} backend; "
        f"jax {jax.__version__}, Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, nargs="*", default=list(STEPS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    console = Console()
    per_step = {}
    for n in args.steps:
        seconds = time_round_robin(compile_all(n), args.repeats)
        for key, s in seconds.items():
            per_step[(n, *key)] = s / n
        console.log(f"N={n} timed")

    table = Table(title="µs per step (median)")
    lines = [
        "| N | method | forward µs/step | grad µs/step | grad vs lax.scan + checkpoint |",
        "|---:|:---|---:|---:|---:|",
    ]
    for col in ("N", "method", "forward", "grad", "grad / baseline"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for n in args.steps:
        base = per_step[n, "lax.scan + checkpoint", "grad"]
        for name in METHODS:
            fwd, grad = per_step[n, name, "forward"], per_step[n, name, "grad"]
            row = (str(n), name, f"{fwd * 1e6:.2f}", f"{grad * 1e6:.2f}", f"{grad / base:.2f}x")
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
    console.print(table)

    section = "\n".join(
        [
            MARKERS[0],
            "## `remat.scan` as a drop-in (`benchmarks/scan_dropin_bench.py`)",
            "",
            f"Machine: {machine()}. Run {datetime.date.today().isoformat()} with "
            "`PYTHONPATH=src python benchmarks/scan_dropin_bench.py`.",
            "",
            f"`c <- tanh(W @ c + x)`, carry {WIDTH} float32, one input row per step. Time per "
            "step of the jitted forward pass and of the gradient (to `W`, `c0` and `xs`), "
            f"median of {args.repeats} calls after a warm-up, round-robin across methods.",
            "",
            *lines,
            "",
            "Binomial trades time for memory: per gradient it runs the body "
            "`remat.revolve_cost(N, 8) + N + 1` times (against 2N for the others), from a "
            "table-driven loop, and keeps 9 carries instead of N.",
            MARKERS[1],
        ]
    )
    if not args.no_write:
        replace_section(BENCH_MD, MARKERS, section)
        console.print(f"wrote {BENCH_MD}")


if __name__ == "__main__":
    main()
