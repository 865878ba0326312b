"""Host offloading: when it is offered (memory spaces), what it costs, and the CPU answer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from remat._core._offload import (
    HOST_BANDWIDTH,
    compile_device_now,
    compiling_for,
    offload_available,
    offload_unavailable_reason,
    transfer_seconds,
)
from remat._core._strategy import as_strategy, resolve_policy


@dataclasses.dataclass
class FakeMemory:
    kind: str
    platform: str


class FakeDevice:
    """A device whose memory spaces we choose, to exercise the rule without an accelerator."""

    def __init__(self, platform, kinds, default="device", broken=False):
        self.platform, self.id = platform, 0
        self._memories = [FakeMemory(k, platform) for k in kinds]
        self._default = FakeMemory(default, platform)
        self._broken = broken

    def addressable_memories(self):
        if self._broken:
            raise NotImplementedError("no memory spaces")
        return self._memories

    def default_memory(self):
        return self._default


def test_cpu_has_host_kinds_but_offload_is_not_available():
    device = jax.devices("cpu")[0]
    kinds = {m.kind for m in device.addressable_memories()}
    assert {"device", "pinned_host"} <= kinds  # the kinds alone would say yes...
    assert not offload_available(device)  # ...but the device memory is host RAM
    assert "host RAM" in offload_unavailable_reason(device)


@pytest.mark.parametrize(
    ("device", "available", "says"),
    [
        (FakeDevice("gpu", ["device", "pinned_host", "unpinned_host"]), True, None),
        (FakeDevice("tpu", ["device", "pinned_host"]), True, None),
        (FakeDevice("gpu", ["device"]), False, "none of them pinned_host"),
        (FakeDevice("gpu", ["pinned_host"], default="pinned_host"), False, "already host"),
        (FakeDevice("cpu", ["device", "pinned_host"]), False, "host RAM"),
        (FakeDevice("gpu", [], broken=True), False, "no memory spaces"),
    ],
)
def test_offload_rule_reads_memory_spaces(device, available, says):
    assert offload_available(device) is available
    reason = offload_unavailable_reason(device)
    if says is None:
        assert reason is None
    else:
        assert says in reason


def test_cpu_offload_saves_no_device_memory():
    """The measurement behind 'not available on CPU': offloading keeps the same temp bytes."""
    offload = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["h"],
        offload_src="device",
        offload_dst="pinned_host",
    )
    save = jax.checkpoint_policies.save_only_these_names("h")

    def loss(policy):
        def body(h, w):
            h = checkpoint_name(jnp.tanh(h @ w), "h")
            return jnp.sin(h), None

        def f(ws, x):
            h, _ = jax.lax.scan(jax.checkpoint(body, policy=policy), x, ws)
            return h.sum()

        return f

    ws, x = jnp.ones((6, 32, 32)) * 0.01, jnp.ones((32, 32))
    stats = {
        name: jax.jit(jax.grad(loss(p))).lower(ws, x).compile().memory_analysis()
        for name, p in [("offload", offload), ("save", save)]
    }
    assert stats["offload"].host_temp_size_in_bytes == 0
    assert stats["offload"].temp_size_in_bytes == stats["save"].temp_size_in_bytes
    assert jax.grad(loss(offload))(ws, x).shape == ws.shape


def test_transfer_cost_is_two_copies_over_the_bandwidth():
    assert HOST_BANDWIDTH == 25e9
    assert transfer_seconds(1e9) == pytest.approx(2 * 1e9 / 25e9)  # 80 ms
    assert transfer_seconds(1e9, host_bandwidth=100e9) == pytest.approx(0.02)
    with pytest.raises(ValueError, match=r"`remat.plan`.*host_bandwidth"):
        transfer_seconds(1.0, host_bandwidth=0)


def test_offload_strategy_string_on_cpu_says_why_and_what_instead():
    with pytest.raises(ValueError, match=r"host RAM.*'names:a,b'.*target='tpu:v5e:2x2'"):
        resolve_policy("offload:a,b", "remat.apply")


def test_offload_strategy_string_is_checked_against_the_device_compiled_for():
    """A TPU target's chip (here a stand-in with a separate host memory space) accepts
    "offload:..." where this CPU host refuses it: given as ``device``, or held by
    `compiling_for` (what `remat.measure`, `compare`, `lint` and `plan` do for a target),
    so that `remat.apply` and the scans it rewrites, traced inside, see the chip too."""
    chip = FakeDevice("tpu", ["device", "pinned_host"])
    host = jax.devices("cpu")[0]
    with pytest.raises(ValueError, match=r"`remat.measure`.*'offload:a'.*host RAM"):
        as_strategy("offload:a", "remat.measure", host)
    assert as_strategy("offload:a", "remat.measure", chip).policy == "offload:a"
    assert resolve_policy("offload:a", "remat.apply", chip) is not None
    with compiling_for(chip):
        assert compile_device_now() is chip
        assert resolve_policy("offload:a", "remat.apply") is not None
        with compiling_for(None):  # no device of its own: the outer one stays
            assert compile_device_now() is chip
    assert compile_device_now() is jax.devices()[0]
    with pytest.raises(ValueError, match="no host memory to offload to"):
        resolve_policy("offload:a", "remat.apply")


# The planner's integer program with the third choice. A chain a -> b in a scan of 10 steps,
# 4 bytes a copy, both needed by the backward pass; recomputing b costs 10 * 10 = 100 FLOPs.
# Budget 50 bytes: saving both (80) does not fit, so without offloading b is recomputed.


def chain(offload_b=None, offload_a=None):
    from remat._plan._milp import Node

    a = Node(bytes=4, flops=20, multiplicity=10, needed=True, offload_flops=offload_a)
    b = Node(bytes=4, flops=10, inputs=(0,), multiplicity=10, needed=True, offload_flops=offload_b)
    return [a, b]


def test_milp_offloads_when_the_transfer_is_cheaper_than_recomputing():
    from remat._plan._milp import solve

    plain = solve(chain(), budget_bytes=50)
    assert sorted(plain.recomputed) == [1] and plain.recompute_flops == 100.0
    assert plain.offloaded == frozenset()
    cheap = solve(chain(offload_b=30.0), budget_bytes=50)
    assert sorted(cheap.saved) == [0] and sorted(cheap.offloaded) == [1]
    assert cheap.recompute_flops == 0.0 and cheap.offload_flops == 30.0
    assert cheap.memory_bytes == 40  # b costs no device memory
    dear = solve(chain(offload_b=500.0), budget_bytes=50)
    assert sorted(dear.recomputed) == [1] and dear.offloaded == frozenset()


def test_milp_offloaded_values_feed_recomputation_and_free_the_budget():
    from remat._plan._milp import solve

    # No device memory at all for residuals: a goes to the host, b is recomputed from it.
    s = solve(chain(offload_a=5.0, offload_b=1e6), budget_bytes=4)
    assert sorted(s.offloaded) == [0] and sorted(s.recomputed) == [1]
    assert s.saved_bytes == 0
    # Without offloading, 4 bytes cannot hold anything the backward pass needs.
    assert solve(chain(), budget_bytes=4) is None


# The planner's `offload=` option.


def scanned_loss(ws, x):
    h, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
    return (h**2).sum()


ARGS = (jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8)))


def test_plan_with_offload_on_cpu_says_why_in_one_warning_and_plans_without():
    import remat

    with pytest.warns(remat.RematWarning, match=r"offload=True, but .*host RAM") as record:
        planned = remat.plan(scanned_loss, *ARGS, budget=0.9, offload=True)
    ours = [w for w in record if "offload=True" in str(w.message)]
    assert len(ours) == 1 and "\n" not in str(ours[0].message)
    plain = remat.plan(scanned_loss, *ARGS, budget=0.9)
    assert [s.names for s in planned.scans] == [s.names for s in plain.scans]
    assert all(s.offloaded == () for s in planned.scans)


def test_plan_rejects_a_bandwidth_that_is_not_positive():
    import remat

    with pytest.raises(ValueError, match=r"`remat.plan`.*host_bandwidth"):
        remat.plan(scanned_loss, *ARGS, budget=0.9, host_bandwidth=-1.0)


def test_offload_costs_are_transfer_seconds_at_the_matmul_rate():
    from remat._plan._costmodel import model_scans
    from remat._plan._options import assemble, candidates, offload_costs
    from remat._trace._tag import planned_scans

    models = model_scans(planned_scans(scanned_loss, *ARGS))
    cands = candidates(models, False)
    nodes, _, offsets = assemble(cands)
    priced = offload_costs(nodes, cands, offsets, models, 1e9, flops_per_second=1e12)
    for node, value in zip(priced, models[0].values, strict=True):
        if value.primitive == "carry":
            assert node.offload_flops is None
        else:  # (2, 8) float32 = 64 bytes, 4 copies, out and back at 1 GB/s, 1 TFLOP/s
            assert node.bytes * node.multiplicity == 64 * 4
            assert node.offload_flops == pytest.approx(2 * 256 / 1e9 * 1e12)


def test_an_offloading_plan_moves_values_to_host_memory_and_survives_json(tmp_path):
    """The rewrite of an offloading choice (what a GPU plan would run), loaded back from JSON."""
    import remat
    from remat._plan._json import load_plan

    planned = remat.plan(scanned_loss, *ARGS, budget=1.0, schedules=False)
    (scan,) = planned.scans
    names = tuple(v.name for v in scan.saved if v.primitive != "carry") or ("remat_s0_e0",)
    offloading = dataclasses.replace(
        planned, scans=(dataclasses.replace(scan, names=(), offloaded=names),)
    )
    path = offloading.to_json(tmp_path / "plan.json")
    loaded = load_plan(path, scanned_loss, *ARGS)
    assert loaded.scans[0].offloaded == names
    jaxpr = str(jax.make_jaxpr(jax.grad(loaded.fn))(*ARGS))
    assert "device_put" in jaxpr and "Host" in jaxpr  # to host and back
    from conftest import assert_tree_allclose

    assert_tree_allclose(jax.grad(loaded.fn)(*ARGS), jax.grad(scanned_loss)(*ARGS))
