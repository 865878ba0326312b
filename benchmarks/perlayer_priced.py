"""Per-layer first plans with and without pricing mixes from their siblings, side by side.

`remat._plan._search` skips the scan-alone compile of a per-layer candidate that its sibling
mixes (the same two save sets, other counts of layers, compiled alone) price more than
`_search.SURE` over the budget (`remat._plan._alone.priced_mix`). On the models of
`benchmarks/vs_torch.py`, in one process, at each budget: the uniform plan, then the
per-layer plan with the pricing off (``SURE`` infinite: every candidate compiled alone) and
on, each from scratch (`_memo.forget`): its wall time over one compile of the
un-checkpointed step, the scan-alone and whole-step compiles, and whether the two per-layer
plans are the same (saved sets and pattern, FLOPs, compiled peak).

Usage:
  PYTHONPATH=src python benchmarks/perlayer_priced.py [--arch gpt,mlp] [--budgets 40%,25%]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp

import remat
import vs_torch
from remat._plan import _memo, _search


def one_compile(loss, args) -> float:
    start = time.perf_counter()
    jax.jit(jax.value_and_grad(lambda *a: loss(*a))).lower(*args).compile()
    return time.perf_counter() - start


def planned(loss, args, spec, per_layer, sure):
    _memo.forget()
    _search.SURE = sure
    start = time.perf_counter()
    plan = remat.plan(loss, *args, budget=spec, per_layer=per_layer, verbose=False)
    return plan, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--budgets", default="40%,30%,25%,20%")
    opts = parser.parse_args(argv)
    sure = _search.SURE
    print(f"load {os.getloadavg()}")
    for kind in opts.arch.split(","):
        sizes = vs_torch.FULL
        loss = vs_torch.make_jax_loss(kind, sizes["heads"])
        args = (jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
                jnp.asarray(vs_torch.init_inputs(kind, **sizes)))  # fmt: skip
        one = statistics.median(one_compile(loss, args) for _ in range(3))
        print(f"== {kind}: one compile {one:.2f} s")
        for spec in opts.budgets.split(","):
            cells = []
            got = {}
            for label, per_layer, s in (("uniform", False, math.inf), ("per-layer off", True, math.inf),
                                        ("per-layer on", True, sure)):  # fmt: skip
                plan, wall = planned(loss, args, spec, per_layer, s)
                got[label] = plan
                st = plan.stats
                cells.append(f"{label} {wall / one:.1f}x ({st.scan_compiles} alone, "
                             f"{st.step_compiles} steps)")  # fmt: skip
            a, b = got["per-layer off"], got["per-layer on"]
            same = (
                [(s.names, s.pattern) for s in a.scans] == [(s.names, s.pattern) for s in b.scans]
                and a.flops_ratio == b.flops_ratio
                and a.measured_peak_bytes == b.measured_peak_bytes
            )
            print(f"  {spec}: " + " | ".join(cells)
                  + f" | uniform +{got['uniform'].flops_ratio - 1:.2%} "
                  f"{got['uniform'].measured_peak_bytes}, per-layer +{b.flops_ratio - 1:.2%} "
                  f"{b.measured_peak_bytes} ({'segments' if b.scans[0].pattern else 'plain'})"
                  f" | same plan: {same}",
                  flush=True)  # fmt: skip
    _search.SURE = sure
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
