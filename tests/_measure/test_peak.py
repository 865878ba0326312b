"""The one peak figure: equal to XLA's parts summed, whichever of outputs or temporaries dominate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._measure._peak import SUM, CompiledMemory, compiled_memory


def _stack(layers: int, width: int, batch: int):
    ws = jnp.full((layers, width, width), 0.01)
    x = jnp.ones((batch, width))

    def loss(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return jnp.sum(y**2)

    return loss, ws, x


# Wide layers and a small batch: the gradients (outputs) outweigh the temporaries.
OUTPUT_DOMINATED = (8, 256, 8)
# Narrow layers and a big batch: the saved activations (temporaries) dominate.
TEMP_DOMINATED = (8, 32, 1024)


def _sum_of_parts(fn, *args) -> tuple[int, int, int]:
    """``temp + argument + output - alias`` computed here without remat, and temp and output."""
    stats = jax.jit(jax.value_and_grad(fn)).lower(*args).compile().memory_analysis()
    total = (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
    )
    return total, stats.temp_size_in_bytes, stats.output_size_in_bytes


@pytest.mark.parametrize("shape", [OUTPUT_DOMINATED, TEMP_DOMINATED], ids=["outputs", "temps"])
@pytest.mark.parametrize("strategy", ["none", "dots", "full"])
def test_measure_peak_is_the_sum_of_parts(shape, strategy):
    loss, ws, x = _stack(*shape)
    target = loss if strategy == "none" else remat.apply(loss, strategy)
    expected, temp, output = _sum_of_parts(target, ws, x)
    if shape == OUTPUT_DOMINATED:
        assert output > temp  # the case that hid the temporaries before
    else:
        assert temp > output
    m = remat.measure(loss, ws, x, strategy=strategy, repeats=0)
    assert m.peak_bytes == expected
    assert m.peak_source == SUM


def test_full_checkpointing_of_an_output_dominated_stack_is_reported_below_none():
    loss, ws, x = _stack(*OUTPUT_DOMINATED)
    peaks = {
        s: remat.measure(loss, ws, x, strategy=s, repeats=0).peak_bytes for s in ("none", "full")
    }
    assert peaks["full"] < peaks["none"]


def test_compare_table_is_not_flat_on_an_output_dominated_stack():
    loss, ws, x = _stack(*OUTPUT_DOMINATED)
    report = remat.compare(loss, ws, x, strategies=["full"], repeats=0, progress=False)
    peaks = {label: m.peak_bytes for label, m in report.rows}
    assert len(set(peaks.values())) == 2


def test_the_issue_reproduction_gives_the_compiled_truth():
    ws = jnp.full((16, 512, 512), 0.01)
    x = jnp.ones((32, 512))

    def loss(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return jnp.sum(y**2)

    got = [
        remat.measure(loss, ws, x, strategy=s, repeats=0).peak_bytes
        for s in ("none", "dots", "full")
    ]
    assert got == [38011148, 36962564, 35913980]


def test_cpu_never_takes_the_backend_peak():
    # The CPU backend's own figure leaves the temporaries out even when it is the larger one.
    m = CompiledMemory.from_parts(
        temp=100, argument=40, output=500, alias=0, backend_peak=540, platform="cpu"
    )
    assert (m.peak_bytes, m.peak_source) == (640, SUM)


def test_gpu_takes_a_plausible_backend_peak_and_refuses_an_impossible_one():
    ok = CompiledMemory.from_parts(
        temp=100, argument=40, output=500, alias=0, backend_peak=600, platform="gpu"
    )
    assert (ok.peak_bytes, ok.peak_source) == (600, "peak_memory_in_bytes")
    # Below temp + argument - alias: cannot be a peak, so the sum is used.
    bad = CompiledMemory.from_parts(
        temp=100, argument=40, output=500, alias=0, backend_peak=120, platform="gpu"
    )
    assert (bad.peak_bytes, bad.peak_source) == (640, SUM)


def test_tpu_peak_is_hbm_never_the_backend_peak():
    # The TPU compiler's peak_memory_in_bytes adds on-chip VMEM: the issue's scanned MLP
    # checkpointed with `full` (docs/tpu.md), temp 0, 130 MiB of arguments, 128 MiB of outputs.
    mib = 2**20
    m = CompiledMemory.from_parts(
        temp=0, argument=130 * mib, output=128 * mib + 1024, alias=0,
        backend_peak=423630848, platform="tpu",
    )  # fmt: skip
    assert (m.peak_bytes, m.peak_source) == (258 * mib + 1024, SUM)


def test_compiled_memory_reads_donation_as_alias():
    x = jnp.ones(1024)
    compiled = jax.jit(lambda a: a * 2, donate_argnums=0).lower(x).compile()
    m = compiled_memory(compiled)
    assert m.alias_bytes == 4096
    assert m.peak_bytes == m.temp_bytes + 4096 + 4096 - 4096


def test_tpu_peak_is_the_buffer_assignments_hbm_where_it_was_read():
    """On TPU the figure read from the compiler's buffer assignment (memory space 0) wins over
    the sum of the memory analysis' parts, which counts temporaries kept out of HBM; without
    it (a program compiled elsewhere) the sum stands, an upper bound."""
    from remat._measure._hbm import hbm_of_buffer_assignment
    from remat._measure._peak import BUFFER_ASSIGNMENT

    text = "\n".join([
        "allocation 0: size 4096, parameter 0, shape |f32[1024]| at ShapeIndex {}:",
        "allocation 1: size 4096, maybe-live-out:",
        "allocation 2: size 512, constant:",
        "allocation 3: size 1024, thread-local:",
        "allocation 4: size 1024, color 6, thread-local:",
        "allocation 5: size 65536, preallocated-temp:",
        "allocation 6: size 131072, color 1, preallocated-temp:",
        "allocation 7: size 112, color 2, preallocated-temp:",
    ])  # fmt: skip
    hbm = hbm_of_buffer_assignment(text)
    assert hbm == 4096 + 4096 + 512 + 65536
    parts = dict(temp=65536 + 32768, argument=4096, output=4096, alias=0)
    read = CompiledMemory.from_parts(**parts, platform="tpu", hbm=hbm)
    assert (read.peak_bytes, read.peak_source) == (hbm, BUFFER_ASSIGNMENT)
    assert read.temp_bytes == 65536 + 32768
    unread = CompiledMemory.from_parts(**parts, platform="tpu")
    assert (unread.peak_bytes, unread.peak_source) == (106496, SUM)
    on_cpu = CompiledMemory.from_parts(**parts, platform="cpu", hbm=hbm)
    assert on_cpu.peak_source == SUM
