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
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import remat

LAYERS, WIDTH, HIDDEN, BATCH = 6, 32, 128, 512


def loss(params, x):
    """Mean square of the output of ``LAYERS`` residual MLP blocks stacked with a scan."""

    def block(h, p):
        return h + jnp.tanh(h @ p["w1"]) @ p["w2"], None

    h, _ = jax.lax.scan(block, x, params)
    return jnp.mean(h**2)


def make_sharded(mesh):
    """``loss`` and its GLOBAL arguments laid out on ``mesh``: the batch split over ``data``,
    each weight's hidden dimension over ``fsdp``."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (LAYERS, WIDTH, HIDDEN)) / WIDTH**0.5,
        "w2": jax.random.normal(k2, (LAYERS, HIDDEN, WIDTH)) / HIDDEN**0.5,
    }
    specs = {"w1": P(None, None, "fsdp"), "w2": P(None, "fsdp", None)}
    params = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
    x = jax.device_put(jax.random.normal(k3, (BATCH, WIDTH)), NamedSharding(mesh, P("data")))
    return loss, (params, x)


def plan_and_load(out_dir: str = "remat-distributed"):
    """Steps 1-3 below; returns the loaded plan, the loss function and the arguments."""
    # 1. Every process: the mesh over all devices and the GLOBAL arguments, laid out on it.
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    loss_fn, args = make_sharded(mesh)

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
