"""`Plan.explain`: the plan as a table, per scan, with the numbers behind the choice."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .._core._budget import format_bytes
from .._core._schedule import Binomial
from .._core._strategy import _schedule_label


def _flops(x: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}FLOP"
    return f"{x:.0f} FLOP"


def plan_table(plan: Any) -> Group:
    """A `rich` renderable: one table per scan, then the summary."""
    parts: list[Any] = []
    for scan in plan.scans:
        table = Table(
            title=(
                f"scan {scan.position} ({scan.source or 'source unknown'}), {scan.length} steps: "
                f"schedule {_schedule_label(scan.schedule)}, recomputes "
                f"{_flops(scan.recompute_flops)}"
                + (
                    "; the step being reversed saves all its residuals (everything_saveable), "
                    "among them"
                    if isinstance(scan.schedule, Binomial)
                    else ""
                )
            ),
            title_justify="left",
        )
        sizes = [f"{format_bytes(v.bytes)} × {v.multiplicity}" for v in scan.saved]
        for col in ("saved value", "primitive", "shape", "bytes × copies", "source"):
            number = col == "bytes × copies"
            table.add_column(
                col,
                justify="right" if number else "left",
                min_width=max(map(len, sizes), default=None) if number else None,
                overflow="fold",  # at any width: text wraps, numbers print whole
            )
        for v in scan.saved:
            table.add_row(
                v.name,
                v.primitive,
                f"{v.dtype}{list(v.shape)}",
                f"{format_bytes(v.bytes)} × {v.multiplicity}",
                v.source or "",
            )
        for name in getattr(scan, "offloaded", ()):
            table.add_row(name, "(offloaded to host memory)", "", "", "")
        if not scan.saved:
            table.add_row("(nothing: every value is recomputed)", "", "", "", "")
        parts.append(table)
    measured = plan.measured_peak_bytes
    ratio = plan.flops_ratio
    lines = [
        f"budget          {format_bytes(plan.budget_bytes)} "
        f"({plan.budget_bytes / plan.baseline_peak_bytes:.0%} of the un-checkpointed peak "
        f"{format_bytes(plan.baseline_peak_bytes)})",
        f"predicted peak  {format_bytes(plan.predicted_peak_bytes)}"
        + (
            ""
            if not measured
            else f" (error {(plan.predicted_peak_bytes - measured) / measured:+.1%} of the measured)"
        ),
        "measured peak   "
        + ("(not measured)" if measured is None else f"{format_bytes(measured)}"),
        "step FLOPs      "
        + ("(not measured)" if ratio is None else f"{ratio:.3f}× no checkpointing (matmuls)"),
        f"solved in       {plan.solve_seconds:.2f} s, {plan.rounds} round(s)",
    ]
    stats = getattr(plan, "stats", None)
    if stats is not None:
        lines.append(
            f"compiled        the whole step {stats.step_compiles}×, one scan alone "
            f"{stats.scan_compiles}× ({stats.compile_seconds:.1f} s); {stats.seconds:.1f} s in all"
        )
    devices = getattr(plan.measured, "num_devices", 1) if plan.measured is not None else 1
    if devices > 1:  # an SPMD program: shapes are global, bytes and peaks are one device's
        lines.append(f"per device      memory of one of {devices} devices; shapes are global")
    parts.append(Text("\n".join(lines)))
    return Group(*parts)
