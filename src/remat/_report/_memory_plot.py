"""Pictures of `remat.MemoryView` s: live bytes along the schedule, stacked by kind (PNG,
matplotlib's Agg backend), and the top values at the peak as a rich table."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from .._core._budget import MIB
from .._core._io import atomic_path
from .._measure._memory import KINDS, MemoryView

# Okabe-Ito colours, one per kind, in `KINDS` order.
COLORS = {
    "parameter": "#0072B2",
    "optimizer state": "#56B4E9",
    "input": "#999999",
    "gradient": "#009E73",
    "output": "#000000",
    "saved": "#D55E00",
    "recomputation": "#CC79A7",
    "temporary": "#E69F00",
}

_NO_VIEWS = "`remat.plot_memory` got no views; pass one or more `remat.MemoryView` s."


def memory_table(view: MemoryView, top: int = 12):
    """A rich table of the ``top`` largest values live at the peak, then the rest by kind."""
    from rich import box
    from rich.table import Table

    title = (
        f"{view.label}: peak {view.peak_bytes / MIB:.2f} MiB "
        f"({view.where()}, position {view.peak_index} of {len(view.live_bytes)})"
    )
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name, justify in (("MiB", "right"), ("%", "right"), ("kind", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("what", overflow="fold")
    table.add_column("shape dtype", overflow="fold")
    table.add_column("source", overflow="fold")
    for value in view.live_at_peak[:top]:
        table.add_row(
            f"{value.bytes / MIB:.2f}",
            f"{value.bytes / max(view.peak_bytes, 1):.1%}",
            value.kind,
            value.describe(),
            f"{value.dtype}{list(value.shape)}",
            value.source or "",
        )
    rest: dict[str, list[int]] = {}
    for value in view.live_at_peak[top:]:
        rest.setdefault(value.kind, []).append(value.bytes)
    for kind, sizes in sorted(rest.items(), key=lambda kv: -sum(kv[1])):
        table.add_row(
            f"{sum(sizes) / MIB:.2f}", f"{sum(sizes) / max(view.peak_bytes, 1):.1%}", kind,
            f"{len(sizes)} more", "", "",
        )  # fmt: skip
    if view.unused_bytes:
        table.add_row(
            f"{view.unused_bytes / MIB:.2f}",
            f"{view.unused_bytes / max(view.peak_bytes, 1):.1%}",
            "unused",
            "allocated, nothing live there at the peak (temporaries buffer's gaps)",
            "",
            "",
        )
    return table


def render_memory(view: MemoryView, top: int = 12, width: int = 120) -> str:
    """`memory_table` as text."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(memory_table(view, top))
    return console.export_text()


def plot_memory(
    views: Sequence[MemoryView] | MemoryView,
    path: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """Writes a PNG of live bytes along the schedule, stacked by kind, for each view side by
    side on one scale, with the backward pass's start and the peak marked.

    Args:
      views: one `remat.MemoryView` or several (e.g. as written and under a plan).
      path: the PNG to write.
      title: a title above the panels.

    Returns:
      The path written.

    Example:
      >>> import jax, jax.numpy as jnp, remat, tempfile, os
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
      ...     return x.sum()
      >>> args = jnp.ones((4, 16, 16)), jnp.ones((8, 16))
      >>> views = [remat.memory(loss, *args), remat.memory(loss, *args, strategy="full")]
      >>> path = remat.plot_memory(views, os.path.join(tempfile.mkdtemp(), "memory.png"))
      >>> path.stat().st_size > 0
      True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    views = [views] if isinstance(views, MemoryView) else list(views)
    if not views:
        raise ValueError(_NO_VIEWS)
    top = max(v.peak_bytes for v in views) / MIB * 1.12
    fig = Figure(figsize=(6.4 * len(views), 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(views), sharey=True, squeeze=False)[0]
    for ax, view in zip(axes, views, strict=True):
        _panel(ax, view, top)
    axes[0].set_ylabel("live memory (MiB)" + (" per device" if views[0].num_devices > 1 else ""))
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    order = [k for k in KINDS if k in seen] + [k for k in seen if k not in KINDS]
    fig.legend(
        [seen[k] for k in order], order, loc="outside lower center", ncols=min(len(order), 6),
        frameon=False,
    )  # fmt: skip
    if title:
        fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return Path(path)


def _panel(ax, view: MemoryView, top: float) -> None:
    xs = range(len(view.live_bytes))
    kinds = [k for k in KINDS if k in dict(view.by_kind)]
    series = dict(view.by_kind)
    ax.stackplot(
        xs,
        *[[b / MIB for b in series[k]] for k in kinds],
        labels=kinds,
        colors=[COLORS[k] for k in kinds],
        alpha=0.85,
        linewidth=0,
    )
    ax.axhline(view.peak_bytes / MIB, color="#444444", linestyle=":", linewidth=1)
    ax.text(
        0, view.peak_bytes / MIB, f" compiled peak {view.peak_bytes / MIB:.1f} MiB",
        va="bottom", ha="left", fontsize=8, color="#444444",
    )  # fmt: skip
    if view.backward_start is not None:
        ax.axvline(view.backward_start, color="#444444", linestyle="--", linewidth=1)
        ax.text(view.backward_start, top * 0.98, " backward →", va="top", ha="left", fontsize=8)
        ax.text(view.backward_start, top * 0.98, "← forward ", va="top", ha="right", fontsize=8)
    peak = view.live_bytes[view.peak_index] / MIB
    ax.plot([view.peak_index], [peak], marker="v", color="black", markersize=8)
    largest = view.live_at_peak[0] if view.live_at_peak else None
    note = f"peak {peak:.1f} MiB"
    if largest is not None:
        share = sum(v.bytes for v in view.live_at_peak if v.kind == largest.kind)
        note += f"\n{largest.kind}: {share / MIB:.1f} MiB\nlargest: {largest.describe()}"
    right = view.peak_index > 0.6 * len(view.live_bytes)
    ax.annotate(
        note, (view.peak_index, peak), xytext=(-8 if right else 8, -6),
        textcoords="offset points", ha="right" if right else "left", va="top", fontsize=8,
        bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="#888888", alpha=0.9),
    )  # fmt: skip
    ax.set_ylim(0, top)
    ax.set_xlim(0, max(len(view.live_bytes) - 1, 1))
    ax.set_xlabel("position in XLA's schedule (loop bodies once)")
    ax.set_title(f"{view.label}: peak {view.peak_bytes / MIB:.1f} MiB", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
