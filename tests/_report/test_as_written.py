"""Rows that kept the program's own checkpoints say so: `remat.compare` on a scan whose body
checkpoints already measures the program as written under the strategy's label (the default,
``override=False``), and the report marks the row, leaves it off the Pareto front and
`Report.cheapest`, and keeps the counts through JSON."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._report._report import Machine
from remat._trace._apply import scans_as_written

L, B, D = 4, 8, 16
DOTS = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
KEPT = "kept the program's own checkpoints"


def layer(h, w):
    return jnp.tanh(jnp.tanh(h @ w) @ w), None


def checkpointed(ws, x):
    """One scan whose body checkpoints (saving the matmuls), as the user wrote it."""
    h, _ = jax.lax.scan(jax.checkpoint(layer, policy=DOTS), x, ws)
    return jnp.sum(h**2)


def two_scans(ws, x):
    """The checkpointed scan, then a plain one."""
    h, _ = jax.lax.scan(jax.checkpoint(layer, policy=DOTS), x, ws)
    h, _ = jax.lax.scan(layer, h, ws)
    return jnp.sum(h**2)


ARGS = (jnp.full((L, D, D), 0.1), jnp.ones((B, D)))


@pytest.fixture(scope="module")
def kept():
    with pytest.warns(remat.RematWarning, match=KEPT):
        return remat.compare(checkpointed, *ARGS, strategies=["full"], repeats=0, progress=False)


@pytest.fixture(scope="module")
def overridden():
    return remat.compare(
        checkpointed, *ARGS, strategies=["full"], repeats=0, progress=False, override=True
    )


def test_kept_row_is_the_program_as_written_and_is_marked(kept):
    full, none = kept["full"], kept["none"]
    assert (full.scans_applied, full.scans_as_written) == (0, 1) and full.as_written
    assert (none.scans_applied, none.scans_as_written) == (0, 0) and not none.as_written
    # the program as written, compiled twice: the same peak and FLOPs exactly
    assert (full.peak_bytes, full.flops) == (none.peak_bytes, none.flops)
    text = kept.render(200)
    assert "full (as written: 1 of 1 scans)" in text
    assert "override=True" in text and "--override" in text
    assert "full (as written: 1 of 1 scans)" in kept.markdown()
    assert kept.as_written() == ("full",)
    # equal points are both on a front; this one stands for no strategy
    assert kept.pareto() == ("none",)
    assert kept.cheapest(max_peak_fraction=1.0) == "none"


def test_override_row_is_the_strategy_and_unmarked(kept, overridden):
    full = overridden["full"]
    assert (full.scans_applied, full.scans_as_written) == (1, 0) and not full.as_written
    assert full.peak_bytes < kept["full"].peak_bytes  # `full` replaces the saved matmuls
    assert full.flops > kept["full"].flops  # ... by recomputing them
    assert "as written" not in overridden.render(200)
    assert overridden.as_written() == ()
    assert overridden.pareto() == ("none", "full")


def test_counts_round_trip_through_json_and_old_files_load(tmp_path, kept):
    path = kept.to_json(tmp_path / "report.json")
    assert remat.Report.from_json(path) == kept
    data = json.loads(path.read_text())
    row = next(r for r in data["rows"] if r["label"] == "full")
    assert (row["scans_applied"], row["scans_as_written"]) == (0, 1)
    for row in data["rows"]:  # a report written before the counts existed
        del row["scans_applied"], row["scans_as_written"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = remat.Report.from_json(tmp_path / "old.json")
    assert old["full"].scans_as_written == 0 and old.as_written() == ()
    assert "as written" not in old.render(200)


def test_counts_of_selected_scans():
    assert scans_as_written(two_scans, "full", ARGS) == (1, 1)
    assert scans_as_written(two_scans, "full", ARGS, override=True) == (2, 0)
    assert scans_as_written(two_scans, remat.Strategy("full", scans=(1,)), ARGS) == (1, 0)
    assert scans_as_written(two_scans, remat.Strategy("full", scans=(0,)), ARGS) == (0, 1)
    assert scans_as_written(two_scans, "none", ARGS) == (0, 0)
    rewritten = remat.apply(two_scans, "full", override=True)  # already a rewrite: "none"
    assert scans_as_written(rewritten, "none", ARGS) == (0, 0)  # rewrites nothing more

    def no_scan(w, x):  # a program without scans counts as one: the whole function
        return jnp.sum(jax.checkpoint(lambda x: jnp.tanh(x @ w))(x))

    assert scans_as_written(no_scan, "full", (ARGS[0][0], ARGS[1]), roll=False) == (0, 1)

    def loop(ws, x):  # layers in a Python loop, each checkpointed: rolled into one scan
        for w in ws:
            x = jax.checkpoint(lambda x, w: jnp.tanh(x @ w))(x, w)
        return jnp.sum(x)

    assert scans_as_written(loop, "full", (list(ARGS[0]), ARGS[1])) == (0, 1)
    assert scans_as_written(loop, "full", (list(ARGS[0]), ARGS[1]), override=True) == (1, 0)


def _row(peak, flops, applied=0, as_written=0):
    return remat.Measurement(
        peak, "x", peak, 0, 0, 0, (), 0, flops, flops / 3, False, False, 0.0, None,
        scans_applied=applied, scans_as_written=as_written,
    )  # fmt: skip


def test_cheapest_skips_rows_as_written_and_warns_for_rows_partly_so():
    machine = Machine("cpu", "cpu", 1, "0")
    rows = (("none", _row(8, 3.0)), ("full", _row(2, 4.0, as_written=1)))
    report = remat.Report(rows=rows, baseline="none", machine=machine)
    assert report.cheapest(0.5) is None  # "full" is the program as written: not a strategy
    assert report.pareto() == ("none",)
    rows = (("none", _row(8, 3.0)), ("full", _row(2, 4.0, applied=1, as_written=1)))
    report = remat.Report(rows=rows, baseline="none", machine=machine)
    with pytest.warns(remat.RematWarning, match="1 of its 2 scans"):
        assert report.cheapest(0.5) == "full"
    assert report.pareto() == ("none", "full")
    assert "full (as written: 1 of 2 scans)" in report.render(200)


def test_plot_draws_rows_as_written(tmp_path, kept):
    assert kept.plot(tmp_path / "pareto.png").stat().st_size > 0
