"""`remat.memory`: XLA's buffer assignment read into live bytes along the schedule, and the
values live at the peak, with their kinds; checked against the compiled peak that
`remat.measure` reports and against hand-counted bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat
from remat._measure._xla_dump import parse_buffer_assignment, parse_live_range

L, D, B = 4, 32, 64  # layers, width, batch: activations (B x D per layer) outweigh weights


def named_stack(ws, x):
    def body(h, w):
        a = checkpoint_name(h @ w, "proj")
        return jnp.tanh(a), None

    h, _ = jax.lax.scan(body, x, ws)
    return jnp.sum(h**2)


def args(shapes_only=False):
    ws = jnp.full((L, D, D), 0.01, jnp.float32)
    x = jnp.ones((B, D), jnp.float32)
    if shapes_only:
        return jax.ShapeDtypeStruct(ws.shape, ws.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype)
    return ws, x


@pytest.fixture(scope="module")
def written():
    return remat.memory(named_stack, *args())


def test_the_peak_is_the_measured_peak_and_the_values_add_up_to_it(written):
    measured = remat.measure(named_stack, *args(), repeats=0)
    assert written.peak_bytes == measured.peak_bytes
    at_peak = sum(v.bytes for v in written.live_at_peak)
    assert at_peak == written.live_bytes[written.peak_index] == written.live_peak_bytes
    assert at_peak + written.unused_bytes == written.peak_bytes
    # Nothing is live beyond what XLA allocates; what is allocated but not live at the peak
    # is the temporaries buffer's gaps (the values here are 2-8 KiB, so the gaps are small).
    assert max(written.live_bytes) <= written.peak_bytes
    assert written.unused_bytes < 0.05 * written.peak_bytes
    # The kinds add up to the total at every position.
    total = np.sum([series for _, series in written.by_kind], axis=0)
    assert total.tolist() == list(written.live_bytes)


def test_the_kinds_are_counted_by_hand(written):
    kinds = written.kind_bytes_at_peak()
    assert kinds["parameter"] == L * D * D * 4
    assert kinds["input"] == B * D * 4
    assert kinds["gradient"] == L * D * D * 4  # the gradient of ws, accumulated
    saved = [v for v in written.live_at_peak if v.kind == "saved"]
    # What the backward pass needs per layer: the layer's input h and tanh(h @ w), stacked
    # over the L steps of the scan (XLA keeps both; every buffer is L x B x D floats).
    assert {v.shape for v in saved} == {(L, B, D)}
    assert all(v.steps == L and v.bytes == L * B * D * 4 for v in saved)
    assert written.backward_start is not None
    assert written.peak_index >= written.backward_start


def test_a_checkpoint_name_names_what_is_saved():
    policy = jax.checkpoint_policies.save_only_these_names("proj")

    def loss(ws, x):
        def body(h, w):
            return jnp.tanh(checkpoint_name(h @ w, "proj")), None

        h, _ = jax.lax.scan(jax.checkpoint(body, policy=policy), x, ws)
        return jnp.sum(h**2)

    view = remat.memory(loss, *args())
    saved = [v for v in view.live_at_peak if v.kind == "saved" and v.steps == L]
    assert [v.label for v in saved].count("proj (dot_general)") == 1
    assert all(v.scan is not None for v in saved)


def test_full_recomputes_and_lowers_the_peak(written):
    full = remat.memory(named_stack, *args(), strategy="full")
    assert full.label == "full"
    assert full.peak_bytes < written.peak_bytes
    assert (
        full.peak_bytes
        == remat.measure(named_stack, *args(), strategy="full", repeats=0).peak_bytes
    )
    assert "recomputation" in dict(full.by_kind)
    stacked = [v for v in full.live_at_peak if v.kind == "saved" and v.steps > 1]
    assert [v.shape for v in stacked] == [(L, B, D)]  # only the carry at every step


def test_shapes_alone_give_the_same_view(written):
    abstract = remat.memory(named_stack, *args(shapes_only=True))
    assert abstract.live_bytes == written.live_bytes
    assert abstract.live_at_peak == written.live_at_peak


def test_the_training_step_shows_the_optimizer_state():
    optax = pytest.importorskip("optax")
    view = remat.memory(named_stack, *args(), optimizer=optax.adam(1e-3))
    kinds = view.kind_bytes_at_peak()
    assert kinds["optimizer state"] >= 2 * L * D * D * 4  # Adam's two moments of ws
    assert (
        view.peak_bytes
        == remat.measure(named_stack, *args(), optimizer=optax.adam(1e-3), repeats=0).peak_bytes
    )
    labels = {v.label for v in view.live_at_peak if v.kind == "optimizer state"}
    assert any(".mu" in label for label in labels) and any(".nu" in label for label in labels)


def test_nested_schedule_shows_its_checkpoint_slots():
    view = remat.memory(
        named_stack, *args(), strategy=remat.Strategy("full", schedule=remat.Nested(2))
    )
    assert view.peak_bytes == remat.measure(
        named_stack, *args(), strategy=remat.Strategy("full", schedule=remat.Nested(2)),
        repeats=0,
    ).peak_bytes  # fmt: skip
    stacked = [v for v in view.live_at_peak if v.kind == "saved" and v.steps > 1]
    # two levels of two steps: the checkpointed carries are stacked 2 at a time
    assert stacked and all(v.steps == 2 and v.shape == (2, B, D) for v in stacked)


@pytest.mark.slow  # the planner compiles the step and its scan several times (15 s)
def test_a_plan_is_compiled_as_planned():
    from conftest import mlp_stack

    loss, fn_args = mlp_stack(layers=4, d=16, batch=64)
    plan = remat.plan(loss, *fn_args, budget=0.6)
    view = remat.memory(loss, *fn_args, plan=plan)
    assert view.label == "plan"
    assert view.peak_bytes == plan.measured_peak_bytes
    assert plan.explain(memory=view).rstrip().endswith(
        view.summary().split(" Largest")[0][-20:]
        + " Largest: "
        + view.summary().split(" Largest: ")[1]
    ) or view.summary()[:30] in plan.explain(memory=view, width=400)


def test_a_persistent_compilation_cache_still_gives_the_dump(tmp_path):
    """JAX's persistent compilation cache leaves ``xla_dump_to`` out of its key: a program
    viewed twice came from the cache the second time and XLA wrote no dump (an error). The
    view compiles past the cache, and what it reads is the same."""
    from jax._src import compilation_cache

    names = {
        "jax_compilation_cache_dir": str(tmp_path),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    before = {name: getattr(jax.config, name) for name in names}
    try:
        for name, value in names.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()  # JAX decides once per process whether to use it
        ws, x = args()
        jax.jit(jax.value_and_grad(named_stack)).lower(ws, x).compile()  # a cache entry
        assert compilation_cache.is_cache_used(jax.devices()[0].client)
        first = remat.memory(named_stack, ws, x)
        second = remat.memory(named_stack, ws, x)
        assert compilation_cache.is_cache_used(jax.devices()[0].client)  # restored
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
    assert first.peak_bytes == second.peak_bytes == remat.memory(named_stack, ws, x).peak_bytes
    assert first.live_bytes == second.live_bytes and len(second.live_at_peak) > 0


def test_bad_input_names_remat_memory():
    with pytest.raises(ValueError, match=r"`remat.memory`.*strategy='full'"):
        remat.memory(named_stack, *args(), strategy="full", plan="p.json")
    with pytest.raises(ValueError, match=r"`remat.memory` got argnums=5"):
        remat.memory(named_stack, *args(), argnums=5)
    with pytest.raises(TypeError, match=r"`remat.memory` got fn=3"):
        remat.memory(3, *args())


def test_the_parsers_read_xla_text():
    assignment = textwrap.dedent(
        """\
        BufferAssignment:
        allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:
         value: <3 x.1 @0> (size=64,offset=0): f32[16]{0}
        allocation 1: size 4, constant:
         value: <4 constant.2 @0> (size=4,offset=0): f32[]
        allocation 2: size 96, preallocated-temp:
         value: <5 while.1{2} (phi) @0> (size=32,offset=64): f32[8]{0}
        """
    )
    allocations, values = parse_buffer_assignment(assignment)
    assert allocations[0].parameter == 0 and allocations[0].counted
    assert not allocations[1].counted
    assert allocations[2].temp and allocations[2].size == 96
    assert values[2].key == "while.1{2}" and values[2].offset == 64
    sequence, ranges = parse_live_range(
        "HloLiveRange (max 2):\n  InstructionSequence:\n    0:x.1\n    1:add\n"
        "  BufferLiveRange:\n    x.1{}:0-2\n    while.1{2}:1-1\n"
    )
    assert sequence == ("x.1", "add") and ranges == {"x.1{}": (0, 2), "while.1{2}": (1, 1)}


_SHARDED = """
import jax, jax.numpy as jnp, remat
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("data",))
def loss(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return jnp.sum(h ** 2)
ws = jax.device_put(jnp.ones((4, 32, 32)) * 0.01, NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("data")))
view = remat.memory(loss, ws, x)
m = remat.measure(loss, ws, x, repeats=0)
saved = [v for v in view.live_at_peak if v.kind == "saved"]
print(view.num_devices, view.peak_bytes == m.peak_bytes, sorted({v.shape for v in saved}))
"""


def test_a_sharded_step_is_read_per_device():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the batch of 64 over 8 devices: 8 rows per device in every saved activation
    assert done.stdout.split("\n")[-2] == "8 True [(4, 8, 32)]"


def test_binomial_schedule_shows_its_snapshot_slots():
    strategy = remat.Strategy("full", schedule=remat.Binomial(2))
    view = remat.memory(named_stack, *args(), strategy=strategy)
    stacked = [v for v in view.live_at_peak if v.kind == "saved" and v.steps > 1]
    # Revolve with 2 snapshots keeps the carries it checkpoints in 3 slots (the initial
    # carry and 2 snapshots), B x D each
    assert [(v.steps, v.shape) for v in stacked] == [(3, (3, B, D))]
    assert (
        view.peak_bytes
        == remat.measure(named_stack, *args(), strategy=strategy, repeats=0).peak_bytes
    )


@pytest.mark.slow  # the demo GPT at its demo sizes: two compiles of 6 s
def test_demo_gpt_peak_is_led_by_the_layer_scans_named_residuals():
    from remat._models._gpt import make_demo_gpt

    loss, fn_args = make_demo_gpt()
    view = remat.memory(loss, *fn_args)
    assert view.peak_bytes == remat.measure(loss, *fn_args, repeats=0).peak_bytes
    assert view.unused_bytes <= 0.01 * view.peak_bytes
    top = view.live_at_peak[:8]
    assert all(v.kind == "saved" and v.scan == "GPT.stack" and v.steps == 8 for v in top)
    labels = {v.label for v in view.live_at_peak if v.kind == "saved"}
    assert {"attn_probs (div)", "mlp_hidden (dot_general)"} <= labels
