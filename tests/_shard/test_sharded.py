"""Sharded programs on 8 CPU devices, run in a child process (tests/_shard/sharded_cases.py).

This process keeps its one device; the child sets XLA_FLAGS before importing JAX and prints
one JSON object with every case's result, which the tests below read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MiB = 2**20


def run_cases(*names):
    """Runs tests/_shard/sharded_cases.py (the given cases, or all but the slow ones) on 8 devices."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE.parents[1] / "src"), env.get("PYTHONPATH", "")) if p
    )
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    done = subprocess.run(
        [sys.executable, str(HERE / "sharded_cases.py"), *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cases():
    return run_cases()


def result(cases, name):
    out = cases[name]
    assert "error" not in out, out.get("traceback", out)
    return out


@pytest.mark.slow  # per-layer plans are opt-in; their unsharded tests run by default
def test_a_per_layer_choice_on_a_sharded_program():
    out = result(run_cases("per_layer_sharded"), "per_layer_sharded")
    assert out["grads_equal_8"] and out["grads_equal_16"]
    assert out["extra_8"] == out["extra_16"]  # no copy of the stacked weights


@pytest.mark.slow
def test_per_layer_segments_inside_shard_map():
    out = result(run_cases("per_layer_segments_in_shard_map"), "per_layer_segments_in_shard_map")
    assert out["grads_equal_one_loop_False"] and out["grads_equal_one_loop_True"]


def test_shardings_are_read_from_arguments_and_jitted_functions(cases):
    out = result(cases, "read_shardings")
    assert out["devices"] == 8
    assert out["in_specs"] == ["P('data',)", "P(None, 'fsdp')"]
    assert out["out_specs"] == ["P('data',)"]
    assert out["num_devices"] == 8
    assert out["per_device_x"] == 8 * 16 * 4 // 4  # (8, 16) f32 split 4 ways over data
    assert out["per_device_w"] == 16 * 32 * 4 // 2  # (16, 32) f32 split 2 ways over fsdp
    assert out["mesh"] == {"data": 4, "fsdp": 2}


def test_apply_keeps_the_shardings_of_a_jitted_function(cases):
    out = result(cases, "apply_keeps_jit_shardings")
    assert out["same_input_shardings"]
    assert out["num_devices"] == [8, 8]
    jit_temp, apply_temp = out["temp"]
    assert apply_temp < jit_temp  # and the rewrite still checkpoints
    assert out["grads_equal"]


def test_apply_keeps_sharding_constraints_inside_scans(cases):
    plain, rewritten = result(cases, "apply_keeps_sharding_constraints")["constraints"]
    assert plain > 0
    assert rewritten >= plain


@pytest.mark.slow
def test_sharded_gpt_gradients_equal_the_unsharded_reference():
    """remat.apply(gpt, "full") on (data=4, fsdp=2); the planned GPT is checked in the
    distributed example below, the apply-rewritten MLP in the jit-shardings test above."""
    out = result(
        run_cases("gpt_sharded_grads_equal_unsharded"), "gpt_sharded_grads_equal_unsharded"
    )
    assert out["equal"]
    assert out["devices"] == 8 and out["plain_devices"] == 1


@pytest.mark.slow  # about 35 s of compiles: 5 presets measured, then the plan
def test_plan_where_the_compiler_refuses_is_no_dearer_than_a_preset_that_fits():
    """MaxText's decoder on 8 devices, every step over 70% of the un-checkpointed peak
    refused (as the TPU compiler refuses a step over HBM): the planner calibrates on the step
    that recomputes everything and the refusal's stated size, and its plan at 60% costs no
    more FLOPs than the cheapest of MaxText's presets that fits the same budget."""
    out = result(run_cases("plan_refused_decoder"), "plan_refused_decoder")
    peak, flops, budget, baseline = out["plan"]
    assert abs(baseline - out["presets"]["none"][0]) <= 6  # the size the refusal states (0.01 KiB)
    assert peak <= budget
    fitting = [f for p, f in out["presets"].values() if p <= budget]
    assert fitting and flops <= min(fitting)


def test_data_parallel_step_holds_an_eighth_of_the_activations_per_device(cases):
    """8 layers of tanh(h @ w), batch 256, width 32, float32, everything saved.

    One device: arguments = ws (8*32*32*4 = 32 KiB) + x (256*32*4 = 32 KiB) = 65536 bytes;
    the activations (two (256, 32) values per layer = 64 KiB * 8 = 512 KiB of residuals, plus
    the backward pass's buffers) are the temp bytes. Eight-way data parallel: x is split 8
    ways (4 KiB per device), ws is replicated (32 KiB), and every activation has a batch of
    32 instead of 256, so the temp bytes are an eighth, plus the replicated weight
    gradients each device sums before the all-reduce (up to 4 KiB per layer): within 10%.
    """
    out = result(cases, "data_parallel_memory")
    one, eight = out["one"], out["eight"]
    assert (one["devices"], eight["devices"]) == (1, 8)
    assert one["arg"] == 8 * 32 * 32 * 4 + 256 * 32 * 4
    assert eight["arg"] == 8 * 32 * 32 * 4 + 256 * 32 * 4 // 8
    assert one["temp"] > 8 * 2 * 256 * 32 * 4  # the residuals alone are 512 KiB
    assert one["temp"] / 8 <= eight["temp"] <= 1.10 * one["temp"] / 8


def test_report_of_a_sharded_program_says_per_device(cases):
    out = result(cases, "report_says_per_device")
    assert out["num_devices"] == 8 and out["per_device"]
    assert "(per device, 8 devices)" in out["title_line"]


def test_distributed_example_plans_saves_and_loads_within_the_per_device_budget(cases):
    """examples/distributed_plan.py, as docs/distributed.md runs it (8 fake devices)."""
    out = result(cases, "distributed_example")
    assert out["devices"] == out["json_devices"] == 8
    assert out["budget"] == int(0.7 * out["baseline"])  # 70% of the per-device baseline
    assert out["measured"] <= out["budget"]
    assert out["grads_equal"] and out["leaf_devices"] == 8


def test_planner_models_data_parallel_values_per_device(cases):
    """Batch 256 over 8 devices: each (batch, 32) float32 value is 32 * 32 * 4 bytes per
    device, not the 256 * 32 * 4 = 32 KiB of the global array; and the per-device budget (80%
    of the unplanned 8-way peak) is far below what the one-device program needs."""
    out = result(cases, "plan_data_parallel_budget")
    assert out["model_value_bytes"] == [256 // 8 * 32 * 4]
    assert out["devices"] == 8
    assert out["eight_peak"] <= out["budget"] < out["one_peak"] / 4
    assert out["grads_equal"]


def test_planner_reads_shardings_declared_by_jit(cases):
    out = result(cases, "plan_jit_in_shardings")
    assert out["model_value_bytes"] == [256 // 8 * 32 * 4]  # as with placed arguments
    assert out["devices"] == 8 and out["fits"] and out["grads_equal"]
    assert out["measured_devices"] == 8
    assert out["residual_bytes"] == [256 // 8 * 32 * 4]  # measure's residuals, per device


def test_per_device_plans_fit_an_output_dominated_stack(cases):
    out = result(cases, "plan_fits_per_device_output_dominated")
    for fraction in ("0.9", "0.7"):
        r = out[fraction]
        if r["infeasible"]:
            assert r["smallest"] > r["budget"]
            continue
        assert r["devices"] == 8
        assert r["compiled"] == r["measured"] <= r["budget"], r


def test_fsdp_gradients_come_out_sharded_as_the_weights(cases):
    """Left to XLA, the gradients of weights sharded 8 ways come out whole on each device (a
    Llama-3-8B step on a v5e-16 then asks 5.4 GiB per chip for 2 layers' gradients); the
    measured step keeps each gradient sharded as its weight: an eighth per device."""
    out = result(cases, "fsdp_gradients_sharded")
    loss = out["plain_output"] - out["weights"]  # the loss and its tuple's bytes
    assert out["plain_specs"] == ["P()", "P()"]  # the loss and the gradients: whole
    assert out["output"] == loss + out["weights"] // 8


def test_plan_from_sharded_shapes_is_the_plan_of_the_placed_arrays(cases):
    out = result(cases, "plan_from_sharded_shapes")
    assert out["devices"] == 8
    assert out["same_scans"]
    assert out["peaks"][0] == out["peaks"][1] <= out["budgets"][0] == out["budgets"][1]
    assert out["grads_equal"]


def test_plan_where_the_compiler_refuses_the_sharded_step(cases):
    """Calibrated on its scan compiled alone (8 devices), the un-checkpointed step refused: its peak is
    the one the refusal states (to 0.01 KiB), its FLOPs the recomputing step's less the
    model's recomputation per device (exact for data parallelism)."""
    out = result(cases, "plan_refused_sharded")
    (plain_peak, plain_flops), (peak, flops) = out["plain"], out["baseline"]
    assert out["devices"] == 8 and out["first_refused"] == plain_peak
    assert abs(peak - plain_peak) <= 6  # 0.01 KiB
    assert flops == plain_flops
    assert out["budget"] == int(0.6 * peak)
    assert out["measured"] <= out["budget"]
    # at the recomputing step's own peak, every other candidate refused: that step is the plan
    only_peak, limit, only_flops, flops = out["only_full"]
    assert only_peak == limit and only_flops > flops
    assert out["grads_equal"]


def test_plan_of_an_fsdp_tensor_decoder_predicts_its_compiled_peak(cases):
    """MaxText's decoder over (fsdp 4, tensor 2) with Adam, planned at 50%: XLA enters its
    layers with the activations' model dimension split (read from the step's forward loop,
    where the arguments alone say the batch), the scan-alone programs are placed so, and the
    plan's predicted peak is its compiled one's within 1% (calibrated on two compiled steps,
    the prediction was 4.2% under)."""
    out = result(cases, "plan_fsdp_tensor_decoder")
    assert out["carry"] == "P(None, None, 'fsdp')" and out["devices"] == 8
    assert out["compiled"] <= out["budget"]
    assert abs(out["predicted"] - out["compiled"]) <= 0.01 * out["compiled"]
    steps, scans = out["compiles"]
    assert steps == 2 and scans >= 4  # the baseline and the plan; the scan alone, calibrated
