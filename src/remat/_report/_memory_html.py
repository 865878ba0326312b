"""A self-contained HTML page of `remat.MemoryView` s: inline SVG, no script and nothing
fetched at view time. Live memory along the schedule is stacked by kind, one panel per view
on one scale; hovering a column shows its position, operation and bytes per kind (SVG
``<title>`` tooltips); below each panel, the values live at its peak."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from .._core._budget import MIB
from .._core._io import atomic_write_text
from .._measure._memory import KINDS, MemoryView, short_op_name
from ._memory_plot import COLORS

_W, _H, _LEFT, _BOTTOM, _TOP = 640, 320, 56, 34, 24
_BINS = 320  # columns drawn per panel at most (each the largest of the positions it covers)


def _columns(view: MemoryView) -> list[tuple[int, int]]:
    """``(first, last)`` positions of each drawn column: every position, or bins of them."""
    n = len(view.live_bytes)
    size = max(1, -(-n // _BINS))
    return [(i, min(i + size, n) - 1) for i in range(0, n, size)]


def _panel(view: MemoryView, top: float) -> str:
    columns = _columns(view)
    n = max(len(columns), 1)
    width, height = _W - _LEFT - 10, _H - _BOTTOM - _TOP
    series = dict(view.by_kind)

    def x(i: float) -> float:
        return _LEFT + width * i / n

    def y(b: float) -> float:
        return _TOP + height * (1 - b / top)

    # each column shows the position in it with the most bytes live
    picks = [max(range(a, b + 1), key=view.live_bytes.__getitem__) for a, b in columns]
    parts = [f'<svg width="{_W}" height="{_H}" role="img" aria-label="{html.escape(view.label)}">']
    base = [0.0] * len(picks)
    for kind in KINDS:
        if kind not in series:
            continue
        upper = [base[j] + series[kind][p] for j, p in enumerate(picks)]
        points = [
            f"{x(j):.1f},{y(upper[j]):.1f} {x(j + 1):.1f},{y(upper[j]):.1f}"
            for j in range(len(picks))
        ]
        points += [
            f"{x(j + 1):.1f},{y(base[j]):.1f} {x(j):.1f},{y(base[j]):.1f}"
            for j in reversed(range(len(picks)))
        ]
        parts.append(
            f'<polygon points="{" ".join(points)}" fill="{COLORS[kind]}" opacity="0.85">'
            f"<title>{kind}</title></polygon>"
        )
        base = upper
    for tick in _ticks(top):
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - 10}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'stroke="#ddd"/><text x="{_LEFT - 4}" y="{y(tick) + 4:.1f}" text-anchor="end" '
            f'font-size="11">{tick / MIB:g}</text>'
        )
    peak_y = y(view.peak_bytes)
    parts.append(
        f'<line x1="{_LEFT}" x2="{_W - 10}" y1="{peak_y:.1f}" y2="{peak_y:.1f}" '
        f'stroke="#444" stroke-dasharray="2,3"/><text x="{_LEFT + 4}" y="{peak_y - 4:.1f}" '
        f'font-size="11">compiled peak {view.peak_bytes / MIB:.1f} MiB</text>'
    )
    if view.backward_start is not None:
        j = next((k for k, (a, b) in enumerate(columns) if b >= view.backward_start), n)
        parts.append(
            f'<line x1="{x(j):.1f}" x2="{x(j):.1f}" y1="{_TOP}" y2="{_TOP + height}" '
            f'stroke="#444" stroke-dasharray="6,4"/><text x="{x(j) + 4:.1f}" y="{_TOP + 12}" '
            f'font-size="11">backward →</text><text x="{x(j) - 4:.1f}" y="{_TOP + 12}" '
            f'font-size="11" text-anchor="end">← forward</text>'
        )
    j = next(k for k, (a, b) in enumerate(columns) if a <= view.peak_index <= b)
    px, py = x(j + 0.5), y(view.live_peak_bytes)
    parts.append(
        f'<path d="M{px - 6:.1f},{py - 10:.1f} L{px + 6:.1f},{py - 10:.1f} L{px:.1f},{py:.1f} Z"'
        f' fill="black"><title>peak: {view.live_peak_bytes / MIB:.2f} MiB live at position '
        f"{view.peak_index}</title></path>"
    )
    for j, p in enumerate(picks):  # hover targets
        lines = [f"position {p}: {view.live_bytes[p] / MIB:.2f} MiB"]
        lines.append(short_op_name(view.op_names[p]) or "(no op_name)")
        lines += [
            f"{k}: {series[k][p] / MIB:.2f} MiB" for k in KINDS if k in series and series[k][p]
        ]
        parts.append(
            f'<rect class="hover" x="{x(j):.1f}" y="{_TOP}" width="{width / n:.2f}" '
            f'height="{height}" fill="transparent"><title>{html.escape(chr(10).join(lines))}'
            "</title></rect>"
        )
    parts.append(
        f'<text x="{_LEFT + width / 2}" y="{_H - 6}" text-anchor="middle" font-size="11">'
        "position in XLA's schedule (loop bodies once)</text>"
        f'<text x="14" y="{_TOP + height / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {_TOP + height / 2})">live memory (MiB)</text></svg>'
    )
    return "".join(parts)


def _ticks(top: float) -> list[float]:
    step = MIB
    for factor in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000):
        step = factor * MIB
        if top / step <= 6:
            break
    while step > 1 and top / step < 2:
        step /= 4
    return [i * step for i in range(int(top / step) + 1)]


def _table(view: MemoryView, top: int) -> str:
    rows = []
    for v in view.live_at_peak[:top]:
        rows.append(
            "<tr>"
            f'<td class="n">{v.bytes / MIB:.2f}</td><td class="n">'
            f"{v.bytes / max(view.peak_bytes, 1):.1%}</td>"
            f'<td class="k"><span class="sw" style="background:{COLORS[v.kind]}"></span>{v.kind}</td>'
            f"<td>{html.escape(v.describe())}</td><td>{v.dtype}{list(v.shape)}</td>"
            f"<td>{html.escape(v.source or '')}</td></tr>"
        )
    return (
        "<table><tr><th>MiB</th><th>%</th><th>kind</th><th>what</th><th>shape</th>"
        f"<th>source</th></tr>{''.join(rows)}</table>"
    )


def memory_html(
    views: Sequence[MemoryView] | MemoryView,
    path: str | os.PathLike,
    title: str = "remat.memory",
    top: int = 12,
) -> Path:
    """Writes the self-contained HTML page of one or more views (see the module docstring).

    Example:
      >>> import jax, jax.numpy as jnp, remat, tempfile, os
      >>> from remat._report._memory_html import memory_html
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
      ...     return x.sum()
      >>> view = remat.memory(loss, jnp.ones((4, 16, 16)), jnp.ones((8, 16)))
      >>> page = memory_html(view, os.path.join(tempfile.mkdtemp(), "memory.html"))
      >>> "<svg" in page.read_text() and "http" not in page.read_text()
      True
    """
    views = [views] if isinstance(views, MemoryView) else list(views)
    top_bytes = max(v.peak_bytes for v in views) * 1.12
    legend = "".join(
        f'<span class="key"><span class="sw" style="background:{COLORS[k]}"></span>{k}</span>'
        for k in KINDS
        if any(k in dict(v.by_kind) for v in views)
    )
    panels = "".join(
        f"<section><h2>{html.escape(v.label)}: peak {v.peak_bytes / MIB:.1f} MiB</h2>"
        f"<p>{html.escape(v.where())}; {v.unused_bytes} bytes allocated but not live at the "
        f"peak</p>{_panel(v, top_bytes)}{_table(v, top)}</section>"
        for v in views
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
main {{ display: flex; flex-wrap: wrap; gap: 24px; }}
section {{ width: {_W}px; }}
h2 {{ font-size: 16px; margin: 4px 0; }} p {{ font-size: 13px; margin: 2px 0 6px; }}
table {{ border-collapse: collapse; font-size: 12px; width: 100%; }}
td, th {{ border-bottom: 1px solid #eee; padding: 2px 4px; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.k {{ white-space: nowrap; }}
.sw {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
.key {{ margin-right: 12px; font-size: 13px; }}
rect.hover:hover {{ fill: rgba(0, 0, 0, 0.12); }}
</style></head>
<body><h1 style="font-size:18px">{html.escape(title)}</h1><div>{legend}</div>
<main>{panels}</main></body></html>
"""
    return atomic_write_text(path, page)
