"""`remat.Report`: Pareto front, budget pick, table, exact JSON round trip, and the plot."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
from hypothesis import given
from hypothesis import strategies as st

import remat
from conftest import ROWS, row
from remat._core._budget import MIB
from remat._measure._measurement import Residual
from remat._report._pareto import pareto_front
from remat._report._report import Machine, Report

MACHINE = Machine("cpu", "cpu", 1, "0.10.2", "Linux x86_64, test CPU, 2 cores")


@pytest.fixture
def report():
    return Report(rows=ROWS, baseline="none", machine=MACHINE, title="hand-made")


def test_pareto_front_hand_worked():
    assert pareto_front([(1, 9), (2, 5), (3, 6), (4, 1), (2, 5)]) == [0, 1, 3, 4]
    assert pareto_front([(5, 5)]) == [0]
    assert pareto_front([(1, 2), (1, 3), (2, 2)]) == [0]  # equal in one, worse in the other


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=12))
def test_pareto_front_is_exactly_the_undominated_points(points):
    front = set(pareto_front(points))

    def dominates(a, b):
        return a[0] <= b[0] and a[1] <= b[1] and a != b

    for i, p in enumerate(points):
        dominated = any(dominates(q, p) for q in points)
        assert (i in front) == (not dominated)
    assert front  # a finite set always has a front


def test_report_pareto_and_cheapest(report):
    assert report.pareto() == ("none", "everything", "full", "dots", "full+binomial(2)")
    # half of 40 MiB = 20 MiB: full (4.0) and binomial (5.0) fit; worse_than_full ties full's
    # peak with more FLOPs.
    assert report.cheapest(0.5) == "full"
    assert report.cheapest(0.6) == "dots"  # 22 <= 24
    assert report.cheapest(0.25) == "full+binomial(2)"
    assert report.cheapest(0.1) is None
    assert report.cheapest(1.0) == "none"  # ties on FLOPs and peak: row order


@pytest.mark.parametrize("bad", ["0.5", 0, -0.5, float("nan"), True, None])
def test_report_cheapest_refuses_a_fraction_that_is_not_a_positive_number(report, bad):
    with pytest.raises(ValueError, match=r"`remat.Report.cheapest` got max_peak_fraction="):
        report.cheapest(bad)


def test_report_validates_rows():
    with pytest.raises(ValueError, match="twice"):
        Report(rows=(ROWS[0], ROWS[0]), baseline="none", machine=MACHINE)
    with pytest.raises(ValueError, match="not one of the row labels"):
        Report(rows=ROWS[:2], baseline="full", machine=MACHINE)
    with pytest.raises(ValueError, match="no rows"):
        Report(rows=(), baseline="none", machine=MACHINE)
    with pytest.raises(KeyError, match="no strategy 'nope'"):
        Report(rows=ROWS, baseline="none", machine=MACHINE)["nope"]


def test_table_numbers_and_marks(report):
    text = str(report)
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    cells = {label: [c.strip() for c in line.split("│")[2:-1]] for label, line in lines.items()}
    # peak MiB, peak ×base, residual MiB, GFLOPs, FLOPs ×base, ms/step, pareto
    assert cells["none (baseline)"] == ["40.00", "1.00×", "0.00", "3.000", "1.00×", "20.0", "*"]
    assert cells["full"] == ["12.00", "0.30×", "0.00", "4.000", "1.33×", "27.0", "*"]
    assert cells["dots_no_batch"][-1] == ""
    assert cells["names:qkv,attn_out !"][-1] == ""  # "!": XLA removed the recomputation
    assert "XLA removed the recomputation" in text
    assert "machine: cpu (cpu x1), jax 0.10.2, Linux x86_64, test CPU" in text


def test_json_round_trip_is_exact(tmp_path, report):
    residuals = (
        Residual((4, 8), "float32", 128, 6, "dot_general", "mlp_hidden", "model.py:12"),
        Residual((), "int32", 4),
    )
    rows = (*report.rows, ("with_residuals", row(30, 3.2, residuals=residuals, timed=False)))
    original = Report(rows=rows, baseline="none", machine=MACHINE, title="round trip")
    path = original.to_json(tmp_path / "sub" / "report.json")
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp file left
    loaded = Report.from_json(path)
    assert loaded == original
    assert loaded["with_residuals"].residuals[0].shape == (4, 8)
    assert loaded["with_residuals"].seconds is None
    assert isinstance(loaded["full"].flops, float)


def test_from_json_rejects_other_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a remat report"):
        Report.from_json(tmp_path / "a.json")
    (tmp_path / "c.json").write_text(json.dumps({"format": "remat.Report", "version": 1}))
    with pytest.raises(ValueError, match="malformed: KeyError"):
        Report.from_json(tmp_path / "c.json")
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        Report.from_json(tmp_path / "b.json")


@pytest.mark.parametrize("y", ["flops", "time"])
def test_plot_writes_a_png(tmp_path, report, y):
    path = report.plot(
        tmp_path / f"{y}.png", y=y, extra=[("plan", 15 * MIB, 3.4e9 if y == "flops" else 0.025)]
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert image.std() > 0.05  # not blank
    assert [p.name for p in tmp_path.iterdir()] == [f"{y}.png"]


def test_plot_rejects_bad_y_and_untimed_reports(tmp_path, report):
    with pytest.raises(ValueError, match="expected 'flops'"):
        report.plot(tmp_path / "x.png", y="memory")
    untimed = Report(rows=(("none", row(1, 1, timed=False)),), baseline="none", machine=MACHINE)
    with pytest.raises(ValueError, match="no strategy in the report was timed"):
        untimed.plot(tmp_path / "x.png", y="time")
    assert not (tmp_path / "x.png").exists()


def test_report_is_public():
    assert remat.Report is Report and remat.Machine is Machine


def test_labels_do_not_overlap_each_other_or_leave_the_axes():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from remat._report._plot import _overlap, _place_labels

    fig = Figure(figsize=(7.0, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # a crowded cluster, two coincident points, and points at the edges
    points = [
        (f"strategy_{i}", 10 + (i % 3) * 0.3, 5 + (i // 3) * 0.2, "strategy") for i in range(9)
    ]
    points += [("twin_a", 20.0, 8.0, "strategy"), ("twin_b", 20.0, 8.0, "strategy")]
    points += [("left_edge", 0.0, 0.0, "baseline"), ("right_edge", 30.0, 10.0, "strategy")]
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    ax.set_xlim(-1, 31)
    ax.set_ylim(-1, 11)
    _place_labels(fig, ax, points, "left_edge", [(0, 11), (0, 0), (31, 0)])
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_text()]
    assert sorted(t.get_text() for t in texts) == sorted(
        [f"strategy_{i}" for i in range(9)]
        + ["twin_a, twin_b", "left_edge (baseline)", "right_edge"]
    )
    boxes = [t.get_window_extent(renderer) for t in texts]
    axes_box = ax.get_window_extent(renderer)
    for i, a in enumerate(boxes):
        assert (
            axes_box.x0 <= a.x0
            and a.x1 <= axes_box.x1
            and axes_box.y0 <= a.y0
            and a.y1 <= axes_box.y1
        )
        for b in boxes[i + 1 :]:
            assert _overlap(a, b) == 0.0


def test_rows_link_to_their_memory_pictures(tmp_path, report):
    linked = report.with_pictures({"none": "memory.png"})
    assert linked.pictures == (("none", "memory.png"),)
    assert "where the memory of none goes: memory.png" in linked.render()
    assert Report.from_json(linked.to_json(tmp_path / "report.json")) == linked
    with pytest.raises(ValueError, match=r"`remat.Report` got a picture for 'nope'"):
        report.with_pictures({"nope": "x.png"})
