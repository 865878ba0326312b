"""What a per-layer plan gives up when its two runs of layers must have equal length.

XLA:CPU shares fused kernels only between loops of the same length (`perlayer_copies.py`:
the per-layer plans' two sets in two runs of 4 layers compile in 1.37-1.50x the uniform
plan's time, the plans themselves, a lone layer and a loop of 7, in 1.58-1.67x). So a
planner that preferred equal-length runs would compile faster; this measures the FLOPs
that preference costs. On the models of `benchmarks/vs_torch.py` (8 layers in one
``lax.scan``), at each budget, three first plans (each from scratch, `_memo.forget`):

- ``uniform``: ``remat.plan(..., per_layer=False)``;
- ``per-layer``: ``per_layer=True``, every count of layers saving the first set offered;
- ``equal runs``: ``per_layer=True`` with only half the layers saving each set offered
  (`remat._plan._perlayer.counts` replaced for the run; one set in every layer stays).

Per plan: FLOPs over the un-checkpointed step, compiled peak, and the pattern (the number of
names each layer saves); then the share of the per-layer plan's FLOPs gain over the uniform
plan that equal runs keep. Nothing is written to BENCHMARKS.md: README's per-layer passage
quotes it.

Usage:
  PYTHONPATH=src python benchmarks/perlayer_equal.py [--arch gpt,mlp] [--budgets 40%,25%]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

import remat
import vs_torch
from remat._plan import _memo, _perlayer

MIB = 2**20


def first_plan(loss, args, budget: str, per_layer: bool, equal: bool) -> remat.Plan:
    real = _perlayer.counts
    if equal:
        _perlayer.counts = lambda length, most=_perlayer.MOST_COUNTS: [length // 2]
    _memo.forget()
    try:
        return remat.plan(loss, *args, budget=budget, per_layer=per_layer, verbose=False)
    finally:
        _perlayer.counts = real


def pattern(plan: remat.Plan) -> str:
    scan = plan.scans[0]
    if not scan.pattern:
        return f"{len(scan.names)} names in every layer"
    return ",".join(str(len(names)) for names in scan.pattern)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--budgets", default="40%,25%")
    args_ = parser.parse_args(argv)
    sizes = vs_torch.FULL
    for arch in args_.arch.split(","):
        loss = vs_torch.make_jax_loss(arch, sizes["heads"])
        args = (
            jax.tree.map(jnp.asarray, vs_torch.init_params(arch, **sizes)),
            jnp.asarray(vs_torch.init_inputs(arch, **sizes)),
        )
        for budget in args_.budgets.split(","):
            extra = {}
            for label, per_layer, equal in (("uniform", False, False),
                                            ("per-layer", True, False),
                                            ("equal runs", True, True)):  # fmt: skip
                plan = first_plan(loss, args, budget, per_layer, equal)
                extra[label] = plan.flops_ratio - 1
                print(f"{arch} {budget:>4s} {label:10s} +{extra[label]:.2%} FLOPs, "
                      f"{plan.measured_peak_bytes / MIB:.2f} MiB of {plan.budget_bytes / MIB:.2f}, "
                      f"{pattern(plan)}", flush=True)  # fmt: skip
            gain = extra["uniform"] - extra["per-layer"]
            if gain > 0:
                kept = (extra["uniform"] - extra["equal runs"]) / gain
                print(f"{arch} {budget:>4s} equal runs keep {kept:.0%} of the per-layer gain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
