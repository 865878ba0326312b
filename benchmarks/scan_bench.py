"""Scan schedules side by side: compiled temp memory, body evaluations and time per gradient.

For a carry-only recurrence ``c <- tanh(c @ W + b)`` (``W`` closed over, gradients to ``W``
and the initial carry) of ``N`` steps, compares

- `jax.lax.scan` with a `jax.checkpoint`-ed body (what most code does),
- Flax linen `nn.remat_scan` with lengths ``(sqrt N, sqrt N)``,
- Equinox's online binomial loop, ``equinox.internal.scan(kind="checkpointed", checkpoints=s)``,
- `remat.scan` with ``Nested(2)`` and ``Binomial(s)``, ``s`` the same as Equinox's.

Temp bytes are XLA's `memory_analysis().temp_size_in_bytes` of the compiled gradient; body
evaluations are counted by a `jax.pure_callback` in the body (in a separately compiled copy
with a small carry, so the timed program has no callback); time is the median of
``--repeats`` gradients after a warm-up, timed round-robin across the methods. Writes a
table between ``<!-- scan:start -->`` and ``<!-- scan:end -->`` in BENCHMARKS.md.

Run: ``PYTHONPATH=src python benchmarks/scan_bench.py`` (about 9 minutes wall, 2.5 minutes CPU, on 2 shared CPU cores).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import equinox.internal as eqxi
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.table import Table

import remat
from bench_common import cpu_name
from remat._core._io import replace_section

CARRIES = {"small": (1, 64), "large": (32, 64)}  # carry shape (rows, width)
STEPS = (64, 256, 1024, 4096)
SNAPSHOTS = (4, 8, 16)
BENCH_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


_SCALAR = jax.ShapeDtypeStruct((), jnp.float32)


def _tick(counter: list):
    def tick(_):
        counter.append(1)
        return np.zeros((), np.float32)

    return tick


def make_loss(method: str, n: int, width: int, counter: list | None):
    """The loss ``(W, c0) -> scalar`` for one method; ``counter`` counts body evaluations."""

    def body(w, c):
        if counter is not None:
            # A pure callback (not `jax.debug.callback`, which `jax.checkpoint` does not
            # re-run when it recomputes) that returns 0.0 and is part of the result, so every
            # evaluation of the body, recomputations included, runs it once.
            c = c + jax.pure_callback(_tick(counter), _SCALAR, jax.lax.stop_gradient(c[0, 0]))
        return jnp.tanh(c @ w + 0.1)

    kind, _, arg = method.partition(":")
    if kind == "lax":

        def loss(w, c0):
            step = jax.checkpoint(lambda c, _: (body(w, c), None), prevent_cse=False)
            return jnp.sum(jax.lax.scan(step, c0, length=n)[0] ** 2)

    elif kind == "linen":
        side = round(n**0.5)

        class Stack(nn.Module):
            @nn.compact
            def __call__(self, c):
                w = self.param("w", nn.initializers.zeros, (width, width))
                return body(w, c)

        stack = nn.remat_scan(
            Stack, lengths=(side, n // side), variable_broadcast="params",
            split_rngs={"params": False},
        )()  # fmt: skip

        def loss(w, c0):
            return jnp.sum(stack.apply({"params": {"w": w}}, c0) ** 2)

    elif kind == "equinox":

        def loss(w, c0):
            out = eqxi.scan(
                lambda c, _: (body(w, c), None),
                c0,
                None,
                length=n,
                kind="checkpointed",
                checkpoints=int(arg),
            )
            return jnp.sum(out[0] ** 2)

    else:
        schedule = remat.Nested(2) if kind == "nested" else remat.Binomial(int(arg))

        def loss(w, c0):
            out = remat.scan(lambda c, _: (body(w, c), None), c0, length=n, schedule=schedule)
            return jnp.sum(out[0] ** 2)

    return loss


def compile_gradient(method: str, n: int, shape: tuple[int, int]):
    """The compiled gradient, its arguments and its temp bytes."""
    rows, width = shape
    w = jnp.eye(width) * 0.9 + 0.01
    c0 = jnp.linspace(-1.0, 1.0, rows * width).reshape(rows, width)
    grad = jax.jit(jax.grad(make_loss(method, n, width, None), argnums=(0, 1)))
    compiled = grad.lower(w, c0).compile()
    jax.block_until_ready(compiled(w, c0))  # warm-up
    return compiled, (w, c0), compiled.memory_analysis().temp_size_in_bytes


def count_evaluations(method: str, n: int) -> int:
    """Body evaluations in one gradient (a property of the schedule, not of the carry size,
    so counted on a small carry)."""
    counter: list = []
    width = 8
    grad = jax.jit(jax.grad(make_loss(method, n, width, counter), argnums=(0, 1)))
    jax.block_until_ready(grad(jnp.eye(width) * 0.9, jnp.ones((1, width))))
    jax.effects_barrier()
    return len(counter)


def time_round_robin(compiled: dict, repeats: int) -> dict:
    """Median seconds per call; each round times every method once, so that load from other
    processes falls on all methods alike."""
    times: dict = {m: [] for m in compiled}
    for _ in range(repeats):
        for method, (fn, args, _) in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[method].append(time.perf_counter() - start)
    return {m: statistics.median(t) for m, t in times.items()}


def machine() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} CPUs visible, {jax.devices()[0].platform} backend; "
        f"jax {jax.__version__}, Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, nargs="*", default=list(STEPS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    methods = ["lax", "linen", "nested"]
    for s in SNAPSHOTS:
        methods += [f"equinox:{s}", f"binomial:{s}"]
    labels = {
        "lax": "lax.scan + checkpoint",
        "linen": "linen remat_scan (√N, √N)",
        "nested": "remat Nested(2)",
    }
    for s in SNAPSHOTS:
        labels[f"equinox:{s}"] = f"equinox checkpointed, {s}"
        labels[f"binomial:{s}"] = f"remat Binomial({s})"

    console = Console()
    results = {}
    evals = {}
    for n in args.steps:
        for method in methods:
            evals[method, n] = count_evaluations(method, n)
        console.log(f"N={n}: counted body evaluations")
    for size, shape in CARRIES.items():
        for n in args.steps:
            compiled = {m: compile_gradient(m, n, shape) for m in methods}
            seconds = time_round_robin(compiled, args.repeats)
            for method in methods:
                results[size, n, method] = (compiled[method][2], evals[method, n], seconds[method])
                console.log(
                    f"{size} N={n} {method}: {compiled[method][2]} B, {evals[method, n]} evals, "
                    f"{seconds[method] * 1e3:.2f} ms"
                )

    lines = []
    for size, shape in CARRIES.items():
        carry_bytes = shape[0] * shape[1] * 4
        table = Table(title=f"carry {shape[0]}x{shape[1]} f32 ({carry_bytes} B)")
        for col in ("N", "method", "temp KiB", "temp / carry", "body evals", "ms / grad"):
            table.add_column(col, justify="right" if col != "method" else "left")
        lines += [
            f"\n**Carry {shape[0]}×{shape[1]} float32 ({carry_bytes} bytes)**\n",
            "| N | method | temp KiB | temp / carry | body evals / grad | ms / grad |",
            "|---:|:---|---:|---:|---:|---:|",
        ]
        for n in args.steps:
            for method in methods:
                temp, evals, seconds = results[size, n, method]
                row = (
                    str(n), labels[method], f"{temp / 1024:.1f}", f"{temp / carry_bytes:.1f}",
                    str(evals), f"{seconds * 1e3:.2f}",
                )  # fmt: skip
                table.add_row(*row)
                lines.append("| " + " | ".join(row) + " |")
        console.print(table)

    verdict = []
    for size in CARRIES:
        for n in args.steps:
            for s in SNAPSHOTS:
                eq, bi = results[size, n, f"equinox:{s}"], results[size, n, f"binomial:{s}"]
                verdict.append((size, n, s, bi[0] <= eq[0], bi[1] < eq[1], bi[2] < eq[2]))
    met = {k: sum(v[k] for v in verdict) for k in (3, 4, 5)}
    summary = (
        f"Binomial(s) against Equinox with the same s, over {len(verdict)} (carry, N, s) cases: "
        f"no more memory in {met[3]}, fewer body evaluations in {met[4]}, less time in "
        f"{met[5]}."
    )
    misses = [v for v in verdict if not all(v[3:])]
    if misses:
        summary += " Not met: " + "; ".join(
            f"{size} carry N={n} s={s} ("
            + ", ".join(
                k for k, ok in zip(("memory", "evaluations", "time"), v[3:], strict=True) if not ok
            )
            + ")"
            for v in misses
            for size, n, s in [v[:3]]
        )
        summary += "."
    console.print(summary)

    section = "\n".join(
        [
            "<!-- scan:start -->",
            "## Scan schedules (`benchmarks/scan_bench.py`)",
            "",
            f"Machine: {machine()}. Run {datetime.date.today().isoformat()} with "
            "`PYTHONPATH=src python benchmarks/scan_bench.py`.",
            "",
            "Gradient of `sum(scan(c -> tanh(c @ W + 0.1))(c0)**2)` with respect to `W` and "
            "`c0`. *temp* is XLA's compiled temp memory; *body evals* are counted with a "
            "`jax.pure_callback` in the body (recomputations included); time is the median of "
            f"{args.repeats} gradients after a warm-up, timed round-robin across methods. "
            "Equinox's `checkpoints=s` and `Binomial(s)` are given the same `s`.",
            *lines,
            "",
            summary,
            "<!-- scan:end -->",
        ]
    )
    if not args.no_write:
        replace_section(BENCH_MD, ("<!-- scan:start -->", "<!-- scan:end -->"), section)
        console.print(f"wrote {BENCH_MD}")


if __name__ == "__main__":
    main()
