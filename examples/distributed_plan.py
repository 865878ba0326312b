"""Plan once, load everywhere: a checkpointing plan for a sharded training step.

Runs on one host with 8 fake CPU devices standing in for a (data=4, fsdp=2) mesh:

    python examples/distributed_plan.py [OUT_DIR]

In a real multi-host job the same code runs in every process after
`jax.distributed.initialize()`; only process 0 plans (see docs/distributed.md).
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":  # before JAX starts: 8 CPU devices on this host
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax

import remat
from remat._models import make_mesh, make_sharded_gpt


def plan_and_load(out_dir: str = "remat-distributed"):
    """Steps 1-3 below; returns the loaded plan, the loss function and the arguments."""
    # 1. Every process: the mesh over all devices and the GLOBAL arguments, laid out on it.
    mesh = make_mesh((4, 2), ("data", "fsdp"))
    loss_fn, args = make_sharded_gpt(mesh, layers=2, d_model=16, seq=8, batch=8, heads=2)

    # 2. Process 0 only: plan against a per-device budget and save the plan.
    path = os.path.join(out_dir, "plan.json")
    if jax.process_index() == 0:
        plan = remat.plan(loss_fn, *args, budget=0.7, schedules=False)
        plan.to_json(path)
        print(plan.explain(width=100), file=sys.stderr)
    # (multi-host: wait here until the file is visible to every process, e.g.
    #  jax.experimental.multihost_utils.sync_global_devices("remat plan"))

    # 3. Every process: load the plan for the same function and arguments.
    return remat.load_plan(path, loss_fn, *args), loss_fn, args


def main(out_dir: str = "remat-distributed") -> dict:
    loaded, _, args = plan_and_load(out_dir)
    step = jax.jit(jax.value_and_grad(loaded.fn))  # train with the planned step
    loss, grads = step(*args)
    leaf = jax.tree_util.tree_leaves(grads)[0]
    return {
        "loss": float(loss),
        "devices": len(leaf.sharding.device_set),
        "budget_bytes": loaded.budget_bytes,
        "measured_peak_bytes": loaded.measured_peak_bytes,
        "per_device": loaded.measured.num_devices > 1,
        "saved": [list(s.names) for s in loaded.scans],
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:])
    print(json.dumps(result))
