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
            user = getattr(v, "user_name", None)
            table.add_row(
                v.name if user is None else f"{user} ({v.name})",
                v.primitive,
                f"{v.dtype}{list(v.shape)}",
                f"{format_bytes(v.bytes)} × {v.multiplicity}",
                v.source or "",
            )
        pattern = getattr(scan, "pattern", ())
        if pattern:  # which layers save what
            from ._perlayer import describe
            from ._policy import saved_label

            for line in describe(pattern, scan.length, saved_label(scan)):
                table.add_row(f"per layer: {line}", "", "", "", "")
        for name in getattr(scan, "offloaded", ()):
            table.add_row(name, "(offloaded to host memory)", "", "", "")
        if not scan.saved:
            table.add_row("(nothing: every value is recomputed)", "", "", "", "")
        parts.append(table)
    measured = plan.measured_peak_bytes
    ratio = plan.flops_ratio
    written = getattr(plan, "written", ())
    baseline = "the peak as written" if written else "the un-checkpointed peak"
    lines = [
        f"budget          {format_bytes(plan.budget_bytes)} "
        f"({plan.budget_bytes / plan.baseline_peak_bytes:.0%} of {baseline} "
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
        + (
            "(not measured)"
            if ratio is None
            else f"{ratio:.3f}× {'as written' if written else 'no checkpointing'} (matmuls)"
        ),
        f"solved in       {plan.solve_seconds:.2f} s, {plan.rounds} round(s)",
    ]
    stats = getattr(plan, "stats", None)
    if stats is not None:
        lines.append(
            f"compiled        the whole step {stats.step_compiles}×, one scan alone "
            f"{stats.scan_compiles}×: {stats.compile_seconds:.1f} s of compiling (summed over "
            f"compiles that run side by side), {stats.seconds:.1f} s wall time in all"
        )
    devices = getattr(plan.measured, "num_devices", 1) if plan.measured is not None else 1
    if plan.measured is not None:  # a peak is the backend's: re-measure on another one
        lines.append(
            f"checked on      {plan.measured.backend}, {devices} device(s): memory and FLOPs "
            "of the compiled step (compiled, never run)"
        )
    if devices > 1:  # an SPMD program: shapes are global, bytes and peaks are one device's
        lines.append(f"per device      memory of one of {devices} devices; shapes are global")
    if getattr(plan, "rolled", False):
        lines.append(
            "rolled          the program's repeated layers (a Python loop) were rolled into "
            "scans to plan them; remat.apply(loss_fn, plan) rolls them the same way"
        )
    if written:
        lines.append(
            "as written      the program checkpoints already: " + "; ".join(written)
            + ". The plan replaces these checkpoints in the planned scans."
        )  # fmt: skip
    parts.append(Text("\n".join(lines)))
    if any(getattr(s, "pattern", ()) for s in plan.scans):
        parts.append(Text(per_layer_code(plan)))
    elif any(s.schedule == "per_step" and s.saved for s in plan.scans):
        parts.append(Text(paste_code(plan)))
    return Group(*parts)


def per_layer_code(plan: Any) -> str:
    """What to paste for a per-layer plan: `remat.apply`, or a policy per layer."""
    from ._policy import how_to_run

    return (
        "\nDifferent layers of one scan save different sets: no one jax.checkpoint policy says "
        "that (plan.policy raises). In your own step: remat.apply(loss_fn, plan); or "
        + how_to_run(plan.scans).replace("`", "")
        + "."
    )


def _naming_lines(values: list[Any]) -> tuple[list[str], list[str]]:
    """One ``checkpoint_name`` line per source line of the saved values without a name.

    A line that makes several of them by one operation (a Python loop inside the scan's
    step: the values share their `site`) is named once: one ``checkpoint_name`` there names
    every value it makes, so the advice says how many of them the plan saves and that a
    name there saves them all. Values of one line made by different operations (several
    on the line, or inside a layer it calls) are listed with a name each, to be given where
    each is computed: a name on the line's result would name one value, not all. Returns
    the lines and the names they give.

    Example:
      >>> from types import SimpleNamespace as V
      >>> v = dict(source="m.py:7", dtype="float32", shape=(4,), primitive="dot_general")
      >>> lines, names = _naming_lines([V(name="a", **v), V(name="b", **v)])
      >>> names
      ['a']
      >>> print(lines[0])
          at m.py:7: y = checkpoint_name(y, 'a')  # dot_general float32[4]; this line makes 2 of the saved values (a loop in the step): one name here names them all
    """
    groups: dict[str, list[Any]] = {}
    for i, v in enumerate(values):
        groups.setdefault(v.source or f"?{i}", []).append(v)
    lines, names = [], []
    for group in groups.values():
        v = group[0]
        where = f"at {v.source}: " if v.source else ""
        if len({getattr(x, "site", ()) for x in group}) > 1:  # different operations
            lines.append(
                f"    {where}makes {len(group)} of the saved values by different operations "
                "(several on this line, or inside a function it calls): a name on the "
                "line's result names one of them; name each where it is computed:"
            )
            for x in group:
                lines.append(f"        checkpoint_name(y, {x.name!r})  # {_what(x)}")
                names.append(x.name)
            continue
        note = f"  # {_what(v)}"
        if len(group) > 1:
            note += (
                f"; this line makes {len(group)} of the saved values (a loop in the step): "
                "one name here names them all"
            )
        lines.append(f"    {where}y = checkpoint_name(y, {v.name!r}){note}")
        names.append(v.name)
    return lines, names


def _what(v: Any) -> str:
    """A saved value's operation and type: ``dot_general float32[4]``."""
    return f"{v.primitive} {v.dtype}{list(v.shape)}"


def paste_code(plan: Any) -> str:
    """The code that reproduces the plan in the user's own scan, with `plan.policy`."""
    from ._policy import unnamed

    if getattr(plan, "rolled", False):
        lines = [
            "",
            "Your layers run in a Python loop; remat rolled them into a scan to plan them. To",
            "train with the plan, remat.apply(loss_fn, plan) rolls them the same way. Or keep",
            "the loop and checkpoint each layer with the plan's policy,",
            "    jax.checkpoint(layer, policy=plan.policy, prevent_cse=False)",
            "    # flax: nn.remat(Block, policy=plan.policy, prevent_cse=False);",
            "    #       nnx.remat(layer, policy=plan.policy, prevent_cse=False)",
            "which keeps the same values per layer on GPU and TPU (on the CPU backend XLA undoes",
            "checkpoints outside loops, so there the loop keeps every value).",
        ]
    else:
        lines = [
            "",
            "In your own scan: checkpoint the step with the plan's policy,",
            "    jax.checkpoint(step, policy=plan.policy, prevent_cse=False)",
            "    # flax: nn.remat(Block, policy=plan.policy, prevent_cse=False) inside nn.scan;",
            "    #       nnx.remat(step, policy=plan.policy, prevent_cse=False) inside nnx.scan",
        ]
    named = sorted({v.user_name for s in plan.scans for v in s.saved if v.user_name})
    if named:
        lines.append(f"It saves your names {', '.join(map(repr, named))} by name.")
    missing = unnamed(plan.scans)
    if missing:
        lines.append(
            "These saved values have no name of yours; the policy matches them by primitive "
            "and operand types. To match them exactly, name them where they are computed:"
        )
        naming, given = _naming_lines([v for _, v in missing])
        lines.extend(naming)
        every = sorted({v.user_name for s in plan.scans for v in s.saved
                        if s.schedule == "per_step" and v.primitive != "carry" and v.user_name}
                       | set(given))  # fmt: skip
        lines.append(
            "  (from jax.ad_checkpoint import checkpoint_name), and then the policy is "
            "jax.checkpoint_policies.save_only_these_names("
            + ", ".join(map(repr, every)) + ")."
        )  # fmt: skip
    others = [s.position for s in plan.scans if s.schedule not in ("per_step", "none")]
    if others:
        lines.append(
            f"Scan(s) {others} run a schedule a policy cannot express: run them with "
            "remat.scan(step, init, xs, schedule=..., policy=plan.policy)."
        )
    return "\n".join(lines)
