"""`remat.compare`: the report's numbers are `remat.measure`'s, and checkpointing shows."""

from __future__ import annotations

import pytest

import remat
from remat._models._gpt import make_gpt
from remat._report._compare import strategy_label

# Activation-dominated: the attention scores (batch * heads * seq**2 per layer) outweigh the
# parameters, so recomputing them must lower the peak.
SIZES = dict(layers=2, d_model=16, seq=64, batch=4, heads=2, vocab=32)
MEMORY_FIELDS = ("peak_bytes", "temp_bytes", "argument_bytes", "output_bytes", "alias_bytes")


@pytest.fixture(scope="module")
def gpt():
    return make_gpt(**SIZES)


@pytest.fixture(scope="module")
def report(gpt):
    loss_fn, args = gpt
    return remat.compare(loss_fn, *args, strategies=["full"], repeats=1, title="tiny GPT")


def test_rows_baseline_first_and_machine(report):
    assert report.labels == ("none", "full")
    assert report.baseline == "none"
    assert report.title == "tiny GPT"
    assert report.machine.backend == "cpu"
    assert all(m.seconds is not None and m.seconds.repeats == 1 for _, m in report.rows)


def test_numbers_equal_measure(gpt, report):
    loss_fn, args = gpt
    direct = remat.measure(loss_fn, *args, strategy="full", repeats=0)
    row = report["full"]
    for field in MEMORY_FIELDS:  # compiled memory analysis is deterministic: exactly equal
        assert getattr(row, field) == getattr(direct, field), field
    assert row.residuals == direct.residuals
    assert row.residual_bytes == direct.residual_bytes
    assert row.flops == direct.flops and row.forward_flops == direct.forward_flops
    assert row.strategy == direct.strategy == "full"


def test_full_recomputation_lowers_the_peak_on_the_scanned_gpt(report):
    none, full = report["none"], report["full"]
    assert full.peak_bytes < none.peak_bytes
    assert full.residual_bytes < none.residual_bytes
    assert full.flops > none.flops  # the forward matmuls of every layer run twice
    assert full.forward_flops == none.forward_flops
    assert not full.recompute_eliminated
    assert report.pareto() == ("none", "full")
    # the table shows both, with full's peak relative to the baseline
    ratio = f"{full.peak_bytes / none.peak_bytes:.2f}×"
    assert ratio in str(report)


def test_labels_and_baseline_choice(monkeypatch):
    calls = []

    def fake_measure(fn, *args, argnums=0, strategy=None, repeats=5, **step_options):
        calls.append(strategy)
        return _fake(len(calls))

    monkeypatch.setattr("remat._measure._measure.measure", fake_measure)
    fn = lambda x: x  # noqa: E731  (never called: measure is replaced)
    report = remat.compare(fn, 1.0, strategies={"a": "full", "b": "dots"}, baseline="b")
    assert report.labels == ("b", "a") and report.baseline == "b"
    assert calls == ["dots", "full"]  # the baseline is measured first, and only once
    calls.clear()
    strategy = remat.Strategy("dots_no_batch", scans=(0,))
    report = remat.compare(fn, 1.0, strategies=[strategy, "names:qkv"], baseline="everything")
    assert report.labels == ("everything", "dots_no_batch", "names:qkv")
    assert calls == ["everything", strategy, "names:qkv"]


def test_bad_strategies_fail_before_anything_compiles(monkeypatch):
    monkeypatch.setattr("remat._measure._measure.measure", pytest.fail)
    fn = lambda x: x  # noqa: E731
    with pytest.raises(ValueError, match="labelled 'full'"):
        remat.compare(fn, 1.0, strategies=["full", remat.Strategy("full")])
    with pytest.raises(ValueError, match="not a known strategy"):
        remat.compare(fn, 1.0, strategies=["full", "fulll"])
    with pytest.raises(TypeError, match="expected a list"):
        remat.compare(fn, 1.0, strategies="full")
    for empty in ([], {}):  # a report of the baseline alone compares nothing
        with pytest.raises(ValueError, match=r"`remat.compare` got strategies=.*nothing to"):
            remat.compare(fn, 1.0, strategies=empty)


def test_strategy_labels():
    def my_policy(prim, *args, **params):
        return False

    assert strategy_label("names:a,b") == "names:a,b"
    assert strategy_label(remat.Strategy("full", schedule=remat.Nested(2))) == "full+nested(2)"
    assert strategy_label(my_policy) == "my_policy"


def _fake(i):
    return remat.Measurement(
        peak_bytes=100 * i,
        peak_source="x",
        temp_bytes=0,
        argument_bytes=0,
        output_bytes=0,
        alias_bytes=0,
        residuals=(),
        residual_bytes=0,
        flops=float(i),
        forward_flops=1.0,
        recompute_requested=False,
        recompute_eliminated=False,
        compile_seconds=0.0,
        seconds=None,
    )
