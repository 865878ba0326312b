"""The sharded GPT on 8 CPU devices: named strategies and the planner, per-device memory.

The demo GPT with its batch split over a ``data`` axis and its parameters over an ``fsdp`` axis
of a (data=4, fsdp=2) mesh of 8 host devices (``XLA_FLAGS`` is set before JAX starts). For the
one-device program and the sharded one this compiles and measures the un-checkpointed training
step; for the sharded one also every named strategy and the planner's plans at 90/75/50/35% of
its per-device peak, checking each plan's gradients against the one-device reference, all in
this one process. Prints the table and rewrites the section between ``<!-- sharded:start -->``
and ``<!-- sharded:end -->`` in BENCHMARKS.md.

Usage:
  PYTHONPATH=src python benchmarks/sharded_bench.py [--layers 4 --d-model 64 ...] [--no-write]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import datetime
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import remat
from remat._core._budget import MIB
from remat._core._io import replace_section
from remat._models._gpt_sharded import make_mesh, make_sharded_gpt
from remat._plan._plan import plan_budgets
from remat._plan._result import InfeasibleBudget
from remat._report._report import current_machine

BENCH_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MARKERS = ("<!-- sharded:start -->", "<!-- sharded:end -->")
FRACTIONS = (0.9, 0.75, 0.5, 0.35)
STRATEGIES = ("full", "dots", "dots_no_batch", "names:qkv,attn_out,mlp_hidden")
SIZES = dict(layers=4, d_model=64, seq=64, batch=16, heads=4)


def close(a, b) -> bool:
    """Gradients equal within float32 tolerance scaled for reordered reductions."""
    return all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


def run(sizes: dict[str, int]) -> tuple[list[list[str]], dict[str, float]]:
    mesh = make_mesh((4, 2), ("data", "fsdp"))
    loss_fn, sharded = make_sharded_gpt(mesh, **sizes)
    plain = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a)), sharded)
    reference = jax.jit(jax.grad(loss_fn))(*plain)
    rows: list[list[str]] = []
    one = remat.measure(loss_fn, *plain, repeats=0)
    base = remat.measure(loss_fn, *sharded, repeats=0)

    def row(label, devices, m, budget="", predicted="", ok=""):
        rows.append(
            [
                label,
                str(devices),
                budget,
                predicted,
                f"{m.peak_bytes / MIB:.3f}",
                f"{m.peak_bytes / base.peak_bytes:.2f}×",
                f"{m.flops / 1e6:.1f}",
                f"{m.flops / base.flops:.2f}×",
                ok,
            ]
        )

    row("none, one device", 1, one)
    row("none (baseline)", 8, base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        for strategy in STRATEGIES:
            fn = remat.apply(loss_fn, strategy)
            m = remat.measure(fn, *sharded, repeats=0)
            ok = "yes" if close(jax.jit(jax.grad(fn))(*sharded), reference) else "NO"
            row(strategy, 8, m, ok=ok)
        start = time.perf_counter()
        plans = plan_budgets(loss_fn, *sharded, budgets=list(FRACTIONS), schedules=False)
        plan_seconds = time.perf_counter() - start
    for fraction, p in zip(FRACTIONS, plans, strict=True):
        label = f"plan @ {fraction:.0%}"
        if isinstance(p, InfeasibleBudget):
            budget = f"{p.budget_bytes / MIB:.3f}"
            rows.append(
                [
                    label,
                    "8",
                    budget,
                    "",
                    "infeasible",
                    "",
                    "",
                    "",
                    f"min {p.smallest_peak_bytes / MIB:.3f}",
                ]
            )
            continue
        budget = f"{p.budget_bytes / MIB:.3f}"
        ok = "yes" if close(jax.jit(jax.grad(p.fn))(*sharded), reference) else "NO"
        row(
            label,
            p.measured.num_devices,
            p.measured,
            budget,
            f"{p.predicted_peak_bytes / MIB:.3f}",
            ok,
        )
    numbers = {
        "one_peak": one.peak_bytes,
        "sharded_peak": base.peak_bytes,
        "plan_seconds": plan_seconds,
    }
    return rows, numbers


HEADERS = [
    "strategy",
    "devices",
    "budget MiB",
    "predicted MiB",
    "peak MiB / device",
    "peak ×base",
    "MFLOPs / device",
    "FLOPs ×base",
    "grads = 1-device",
]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "--:|" * (len(HEADERS) - 2) + ":-:|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def section(rows, numbers, sizes, wall) -> str:
    title = ", ".join(f"{k} {v}" for k, v in sizes.items())
    return "\n".join(
        [
            MARKERS[0],
            "## Sharded GPT (`benchmarks/sharded_bench.py`)",
            "",
            f"The demo GPT ({title}) with its batch over `data` and its parameters over "
            f"`fsdp` of a (data=4, fsdp=2) mesh of 8 CPU devices. Run "
            f"{datetime.date.today().isoformat()} on {current_machine().describe()}; "
            f"{wall:.0f} s in all, {numbers['plan_seconds']:.0f} s for the four plans.",
            "Reproduce with `PYTHONPATH=src python benchmarks/sharded_bench.py`.",
            "",
            "Every memory and FLOP number is **per device**: XLA's analysis of the SPMD "
            "program that each of the 8 devices runs (the first row is the same step "
            "unsharded, on one device). Budgets are fractions of the sharded baseline's "
            "per-device peak; plans use per-step schedules; every gradient is checked against "
            "the one-device reference.",
            "",
            markdown(rows),
            "",
            f"Sharding alone takes the per-device peak from {numbers['one_peak'] / MIB:.3f} MiB "
            f"to {numbers['sharded_peak'] / MIB:.3f} MiB "
            f"({numbers['sharded_peak'] / numbers['one_peak']:.2f}×); the planner then trades "
            "recomputation for memory within each per-device budget.",
            MARKERS[1],
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in SIZES.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=value)
    parser.add_argument("--no-write", action="store_true", help="print, do not touch the file")
    args = parser.parse_args(argv)
    sizes = {name: getattr(args, name) for name in SIZES}
    start = time.perf_counter()
    rows, numbers = run(sizes)
    text = section(rows, numbers, sizes, time.perf_counter() - start)
    print(text)
    if not args.no_write:
        replace_section(BENCH_MD, MARKERS, text)
        print(f"wrote the sharded section of {BENCH_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
