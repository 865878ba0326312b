"""The picture of a `remat.Report`: peak memory against step FLOPs (or time).

Drawn with matplotlib's Agg backend (no display needed). Labels are placed greedily: each
label tries positions around its point, nearest first, and takes the first that overlaps no
other label, no marker and stays inside the axes; points that coincide share one label.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._core._budget import MIB
from .._core._io import atomic_path
from ._pareto import pareto_front

_BAD_Y = "`remat.Report.plot` got y={y!r}; expected 'flops' (step FLOPs) or 'time' (ms per step)."
_NO_TIMES = (
    "`remat.Report.plot` got y='time', but no strategy in the report was timed; measure with "
    "repeats >= 1 or plot y='flops'."
)

_FRONT_COLOR = "#0072B2"  # Okabe-Ito blue
_OTHER_COLOR = "#7f7f7f"
_EXTRA_COLOR = "#D55E00"  # Okabe-Ito vermillion
_BUDGET_COLOR = "#009E73"
# Label positions tried around a point: offsets in points, nearest and most readable first.
_RADII = (9, 15, 24, 36, 50, 66)
_ANGLES = (0, 35, -35, 180, 145, -145, 90, -90, 65, -65, 115, -115)


def plot_report(
    report: Any,
    path: str | os.PathLike,
    y: str = "flops",
    extra: Sequence[tuple[str, float, float]] = (),
    budget: float | None = None,
    budget_label: str = "memory budget",
    highlight: str | None = None,
) -> Path:
    """Implements `remat.Report.plot`."""
    if y not in ("flops", "time"):
        raise ValueError(_BAD_Y.format(y=y))
    # A bare Figure on an Agg canvas: no display, and nothing global (pyplot) is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    base = report.baseline_measurement
    if y == "flops":
        yof, ylabel, yscale = (lambda m: m.flops), "step FLOPs, matmuls (GFLOP)", 1e-9
    else:
        if base.seconds is None or any(m.seconds is None for _, m in report.rows):
            raise ValueError(_NO_TIMES)
        yof, ylabel = (lambda m: m.seconds.median), "step time (ms, median)"
        yscale = 1e3

    # (label, x in MiB, y in plot units, kind) with kind in {"baseline", "strategy", "extra"}
    points = [
        (
            label,
            m.peak_bytes / MIB,
            yof(m) * yscale,
            "baseline" if label == report.baseline else "strategy",
        )
        for label, m in report.rows
    ]
    points += [(str(lab), peak / MIB, val * yscale, "extra") for lab, peak, val in extra]
    # A row that is the program as written under another label stands for no strategy.
    stands = [
        i
        for i, p in enumerate(points)
        if p[3] != "strategy" or not report[p[0]].as_written
    ]  # fmt: skip
    front = {stands[i] for i in pareto_front([points[i][1:3] for i in stands])}

    fig = Figure(figsize=(7.0, 4.8), dpi=200, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [p[1] for p in points]
    ys = [p[2] for p in points]
    _set_limits(ax, xs + ([budget / MIB] if budget else []), ys)

    # The front as a step line, and the region it dominates, lightly shaded.
    fx, fy = zip(*sorted({(points[i][1], points[i][2]) for i in front}), strict=True)
    xmax, ymax = ax.get_xlim()[1], ax.get_ylim()[1]
    sx, sy = [*fx, xmax], [*fy, fy[-1]]
    ax.fill_between(sx, sy, ymax, step="post", color=_FRONT_COLOR, alpha=0.07, lw=0)
    ax.step(sx, sy, where="post", color=_FRONT_COLOR, lw=1.4, alpha=0.8, label="Pareto front")
    ax.plot([fx[0], fx[0]], [fy[0], ymax], color=_FRONT_COLOR, lw=1.4, alpha=0.8)

    if budget:
        ax.axvline(budget / MIB, color=_BUDGET_COLOR, ls="--", lw=1.1, label=budget_label)

    for i, (_, px, py, kind) in enumerate(points):
        on_front = i in front
        color = _EXTRA_COLOR if kind == "extra" else (_FRONT_COLOR if on_front else _OTHER_COLOR)
        marker = {"baseline": "*", "strategy": "o", "extra": "D"}[kind]
        size = {"baseline": 190, "strategy": 55, "extra": 50}[kind]
        ax.scatter(
            [px],
            [py],
            s=size,
            marker=marker,
            facecolor=color if on_front or kind == "baseline" else "white",
            edgecolor=color,
            linewidth=1.3,
            zorder=4 if kind == "baseline" else (3.5 if on_front else 3),
        )
    for label, px, py, _ in points:
        if label == highlight:
            ring = dict(marker="o", facecolor="none", edgecolor=_BUDGET_COLOR, linewidth=1.6)
            ax.scatter([px], [py], s=230, zorder=5, **ring)
            ax.scatter([], [], s=90, label=f"picked: {label}", **ring)
    # legend entries for the marker kinds
    ax.scatter([], [], s=190, marker="*", color=_OTHER_COLOR, label="baseline")
    ax.scatter([], [], s=55, marker="o", color=_FRONT_COLOR, label="on the front")
    ax.scatter(
        [], [], s=55, marker="o", facecolor="white", edgecolor=_OTHER_COLOR, label="dominated"
    )
    if extra:
        ax.scatter([], [], s=50, marker="D", color=_EXTRA_COLOR, label="extra")

    ax.set_xlabel("peak memory (MiB)")
    ax.set_ylabel(ylabel)
    base_x, base_y = base.peak_bytes / MIB, yof(base) * yscale
    if base_x > 0:
        top = ax.secondary_xaxis("top", functions=(lambda v: v / base_x, lambda r: r * base_x))
        top.set_xlabel("peak memory relative to the baseline", fontsize=8, color="0.35")
        top.tick_params(labelsize=7, colors="0.35")
    if base_y > 0:
        right = ax.secondary_yaxis("right", functions=(lambda v: v / base_y, lambda r: r * base_y))
        right.set_ylabel(f"{y if y == 'time' else 'FLOPs'} relative to the baseline", fontsize=8)
        right.tick_params(labelsize=7, colors="0.35")
    ax.grid(True, color="0.92", lw=0.6)
    ax.set_axisbelow(True)
    title = report.title or "activation checkpointing strategies"
    ax.set_title(f"{title}\n{report.machine.describe()}", fontsize=9, loc="left")
    ax.legend(loc="upper right", fontsize=7, frameon=True, framealpha=0.9)

    # The front's segments are obstacles for the labels too.
    path_xy = [(sx[0], ymax)]
    for (x0, y0), x1 in zip(zip(sx, sy, strict=True), sx[1:], strict=False):
        path_xy += [(x0, y0), (x1, y0)]
    written = {label for label, m in report.rows if m.as_written and label != report.baseline}
    _place_labels(fig, ax, points, report.baseline, path_xy, written)

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def _set_limits(ax, xs: list[float], ys: list[float]) -> None:
    def span(values, lo_pad, hi_pad):
        lo, hi = min(values), max(values)
        width = (hi - lo) or max(abs(hi), 1.0) * 0.2
        return max(
            lo - lo_pad * width, 0.0
        ) if lo >= 0 else lo - lo_pad * width, hi + hi_pad * width

    ax.set_xlim(*span(xs, 0.12, 0.35))
    ax.set_ylim(*span(ys, 0.15, 0.45))


def _place_labels(fig, ax, points, baseline: str, line_xy, written=frozenset()) -> None:
    """Labels every point (coincident points share one label) where nothing overlaps; the
    labels in ``written`` (rows that are the program as written) say so."""
    fig.canvas.draw()  # fix the layout so display coordinates are final
    renderer = fig.canvas.get_renderer()
    to_display = ax.transData.transform
    axes_box = ax.get_window_extent(renderer)
    legend = ax.get_legend()
    obstacles = [legend.get_window_extent(renderer)] if legend else []
    scale = fig.dpi / 72.0  # points -> pixels

    # Group points that coincide on screen (within 3 points).
    groups: list[tuple[tuple[float, float], list[str]]] = []
    for label, px, py, _ in points:
        dx, dy = to_display((px, py))
        name = f"{label} (baseline)" if label == baseline else label
        if label in written:
            name += " (as written)"
        for (gx, gy), names in groups:
            if math.hypot(gx - dx, gy - dy) < 3 * scale:
                names.append(name)
                break
        else:
            groups.append(((dx, dy), [name]))
    markers = [
        _box(gx - 6 * scale, gy - 6 * scale, gx + 6 * scale, gy + 6 * scale)
        for (gx, gy), _ in groups
    ]
    line = [to_display(xy) for xy in line_xy]
    pad = 1.5 * scale
    segments = [
        _box(
            min(a[0], b[0]) - pad,
            min(a[1], b[1]) - pad,
            max(a[0], b[0]) + pad,
            max(a[1], b[1]) + pad,
        )
        for a, b in itertools.pairwise(line)
    ]

    placed = []
    for (gx, gy), names in groups:
        text = ", ".join(names)
        best = None
        for radius in _RADII:
            for angle in _ANGLES:
                ox = radius * math.cos(math.radians(angle))
                oy = radius * math.sin(math.radians(angle))
                ha = "left" if ox > 1 else ("right" if ox < -1 else "center")
                va = "bottom" if oy > 1 else ("top" if oy < -1 else "center")
                ann = ax.annotate(
                    text,
                    xy=ax.transData.inverted().transform((gx, gy)),
                    xytext=(ox, oy),
                    textcoords="offset points",
                    ha=ha,
                    va=va,
                    fontsize=8,
                    zorder=4,
                )
                box = ann.get_window_extent(renderer).expanded(1.04, 1.1)
                inside = (
                    box.x0 >= axes_box.x0
                    and box.x1 <= axes_box.x1
                    and box.y0 >= axes_box.y0
                    and box.y1 <= axes_box.y1
                )
                overlap = sum(_overlap(box, o) for o in [*placed, *markers, *segments, *obstacles])
                cost = overlap + (0 if inside else 1e9) + radius * 1e-3
                if best is None or cost < best[0]:
                    if best is not None:
                        best[1].remove()
                    best = (cost, ann, box, radius)
                else:
                    ann.remove()
                if cost < 1:  # no overlap at all: take the nearest such position
                    break
            if best is not None and best[0] < 1:
                break
        _, ann, box, radius = best
        if radius > _RADII[1]:  # far from its point: draw a leader line
            ann.arrow_patch = None
            ann.set_annotation_clip(False)
            ax.annotate(
                "",
                xy=ann.xy,
                xytext=ann.xyann,
                textcoords="offset points",
                arrowprops=dict(arrowstyle="-", color="0.55", lw=0.6, shrinkA=0, shrinkB=4),
                zorder=2,
            )
        placed.append(box)


def _box(x0, y0, x1, y1):
    from matplotlib.transforms import Bbox

    return Bbox([[x0, y0], [x1, y1]])


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0
