"""`parse_budget`: bytes, units, fractions, percentages, and the errors that teach."""

from __future__ import annotations

import re

import pytest

from remat._core._budget import format_bytes, parse_budget, read_budget


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (1000, 1000),
        ("6GiB", 6 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("2 kib", 2048),
        ("100", 100),
        ("1e3", 1000),
        (0.5, 500),
        ("50%", 500),
        ("12.5 %", 125),
        (1.0, 1000),
    ],
)
def test_parses(budget, expected):
    assert parse_budget(budget, baseline_peak=1000) == expected


@pytest.mark.parametrize(
    ("budget", "match"),
    [
        (0, "zero or negative"),
        (-5, "zero or negative"),
        ("-1GiB", "not a memory budget"),
        (0.0, "not above zero"),
        ("0%", "not above zero"),
        ("lots", "not a memory budget"),
        ("5 parsecs", "not a memory budget"),
        (True, "not a memory budget"),
        (None, "not a memory budget"),
        (float("nan"), "not a memory budget"),
        (1.5, "must be in \\(0, 1\\]"),
        ("150%", "more than 100%"),
    ],
)
def test_errors_name_the_function_and_the_fix(budget, match):
    with pytest.raises(ValueError, match=match) as err:
        parse_budget(budget, baseline_peak=1000)
    assert "`remat.plan`" in str(err.value)
    assert "budget=" in str(err.value)


def test_fraction_needs_a_baseline():
    with pytest.raises(ValueError, match="no un-checkpointed peak"):
        parse_budget("50%")


def test_over_device_memory():
    assert parse_budget("1KiB", device_memory=1024) == 1024
    with pytest.raises(ValueError, match="more than the device's memory"):
        parse_budget("2KiB", device_memory=1024)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"


def test_device_memory_is_read_from_the_backend_and_bounds_the_budget(monkeypatch):
    import jax
    import jax.numpy as jnp

    import remat
    from remat._core import _budget
    from remat._plan import _plan

    class Device:  # a backend that reports its memory, as GPUs and TPUs do
        def memory_stats(self):
            return {"bytes_limit": 4096, "bytes_in_use": 0}

    assert _budget.device_memory_bytes(Device()) == 4096
    assert _budget.device_memory_bytes(jax.devices("cpu")[0]) is None  # CPU reports none

    monkeypatch.setattr(_plan, "device_memory_bytes", lambda: 4096)

    def loss(ws, x):
        x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return (x**2).sum()

    with pytest.raises(ValueError, match=r"`remat.plan`.*more than the device's memory \(4096"):
        remat.plan(loss, jnp.ones((2, 4, 4)), jnp.ones((2, 4)), budget="1MiB")


def test_a_float_over_one_is_shown_as_bytes_only_where_it_reads_as_bytes():
    # 1.5 is no byte count: the example is a size that is one; 6e9 reads as one.
    for got, example in [
        (1.5, "budget=6_000_000_000."),
        (6e9, "budget=6_000_000_000."),
        (2.5e8, "budget=250_000_000."),
    ]:
        with pytest.raises(ValueError, match=re.escape(example)):
            read_budget(got)
