"""``remat demo``: the README's main command.

Builds the embedded GPT (`remat._models._gpt.make_gpt`), compares checkpointing strategies on its
training step with `remat.compare`, prints the table, writes ``report.json`` and
``pareto.png`` into ``--out``, and says in one sentence which strategy it would pick for half
the memory; then compares the GPT with its unrolled twin (`_cli_demo_unrolled`), and plans a
small model's training step with Adam and runs it in a Flax-style ``train_step``
(`_cli_demo_train`).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import time
import warnings
from pathlib import Path

from .._core._budget import MIB
from .._report._report import Report

# Sized so the whole demo (seven strategies and timings) runs in well under three minutes
# on two CPU cores, while the activations, not the parameters, dominate the memory.
DEFAULTS = dict(layers=8, d_model=128, seq=128, batch=8, heads=4)

# "Selective recomputation" (Korthikanti et al. 2022, "Reducing Activation Recomputation in
# Large Transformer Models"): keep the outputs of the linear layers, recompute the attention
# scores and probabilities, which are quadratic in the sequence length but cheap to redo.
SELECTIVE = "names:qkv,attn_out,mlp_hidden"


def demo_strategies(layers: int) -> dict[str, object]:
    """The strategies the demo compares, by label (schedules only where `remat.scan` exists)."""
    from .._core._strategy import Strategy

    strategies: dict[str, object] = {
        name: name for name in ("none", "full", "dots", "dots_no_batch", "everything")
    }
    strategies[SELECTIVE] = SELECTIVE
    if _has_scan_schedules() and layers >= 4:
        # A sublinear schedule: about sqrt(layers) carries stored instead of one per layer.
        from .._core._schedule import Nested

        nested = Strategy("full", schedule=Nested(2))
        strategies[nested.name] = nested
    return strategies


def _has_scan_schedules() -> bool:
    try:
        from .._scan import _scan  # noqa: F401
    except ImportError:
        return False
    return True


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="compare checkpointing strategies on a small GPT (the main demonstration)",
        description=(
            "Build a small GPT-style decoder (layers stacked with a scan), measure its "
            "training step under several checkpointing strategies, print the table, write "
            "report.json and pareto.png, and pick a strategy for half the memory."
        ),
    )
    for name, value in DEFAULTS.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=value, help=f"(default {value})")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per strategy")
    parser.add_argument(
        "--sharded",
        action="store_true",
        help=(
            "the same GPT with its batch over a 'data' axis and its parameters over an "
            "'fsdp' axis of a (4, 2) mesh of 8 devices (8 CPU devices in a subprocess if "
            "this process has fewer); memory is then per device"
        ),
    )
    parser.add_argument(
        "--no-unrolled",
        action="store_true",
        help="skip the GPT's unrolled twin (its blocks in a Python loop, rolled by remat)",
    )
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="skip the training-step section (a plan with Adam, applied inside a train_step)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("remat-demo"),
        help="directory for report.json and pareto.png (default ./remat-demo/)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .._core._warnings import RematWarning
    from .._models._gpt import make_gpt
    from .._report._compare import compare
    from ._errors import EXIT_USAGE, CliError

    sizes = {name: getattr(args, name) for name in DEFAULTS}
    if any(v < 1 for v in sizes.values()) or args.repeats < 0:
        raise CliError(f"sizes must be positive and --repeats >= 0; got {sizes}", EXIT_USAGE)
    from .._core._io import check_folder

    check_folder(
        args.out, ("report.json", "pareto.png", "memory.png"), "--out"
    )  # fails now, not later
    title = "GPT: {layers} layers, d_model {d_model}, {heads} heads, seq {seq}, batch {batch}"
    title = title.format(**sizes)
    build = make_gpt
    if getattr(args, "sharded", False):
        from .._models._gpt_sharded import (
            demo_argv,
            make_mesh,
            make_sharded_gpt,
            rerun_with_devices,
        )

        code = rerun_with_devices(8, demo_argv(args, DEFAULTS))
        if code is not None:  # ran in a subprocess with 8 CPU devices
            return code
        mesh = make_mesh((4, 2), ("data", "fsdp"))
        title += ", sharded over (data=4, fsdp=2)"
        build = functools.partial(make_sharded_gpt, mesh)

    try:
        loss_fn, fn_args = build(**sizes)
    except ValueError as err:
        raise CliError(str(err).replace("`", ""), EXIT_USAGE) from err
    print(f"remat demo: {title}; measuring the training step (value and gradient) ...")
    start = time.perf_counter()
    with warnings.catch_warnings():
        # The table marks a strategy whose recomputation XLA removed with "!".
        warnings.simplefilter("ignore", RematWarning)
        report = compare(
            loss_fn,
            *fn_args,
            strategies=demo_strategies(args.layers),
            baseline="none",
            repeats=args.repeats,
            title=title,
        )
    # As wide as the terminal (or $COLUMNS); at 60 columns the numbers still print whole.
    print(report.render(shutil.get_terminal_size((120, 24)).columns))
    half = 0.5 * report.baseline_measurement.peak_bytes
    planned, plan_line = _plan_half(loss_fn, fn_args)
    try:
        memory_lines = memory_picture(loss_fn, fn_args, args.out / "memory.png")
        report = report.with_pictures({report.baseline: "memory.png"})  # beside report.json
        json_path = report.to_json(args.out / "report.json")
        png_path = report.plot(
            args.out / "pareto.png",
            budget=half,
            budget_label="half the baseline's peak",
            extra=planned,
            highlight=report.cheapest(0.5),
        )
    except OSError as err:
        raise CliError(f"cannot write into {args.out}: {err}", EXIT_USAGE) from err
    print(f"wrote {json_path} and {png_path} ({time.perf_counter() - start:.0f} s)")
    print(pick_sentence(report))
    print(plan_line)
    print(memory_lines)
    if not getattr(args, "sharded", False) and not getattr(args, "no_unrolled", False):
        from ._cli_demo_unrolled import unrolled_table

        print("\nThe same GPT with its blocks in a Python loop, which remat rolls into a scan:")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RematWarning)
            print(unrolled_table(sizes))
    if not getattr(args, "sharded", False) and not getattr(args, "no_train", False):
        from ._cli_demo_train import train_section

        print("\nA training step (dropout, Adam) planned to a budget and run in your own step:")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RematWarning)
            print(train_section())
    return 0


def _plan_half(loss_fn, fn_args) -> tuple[list, str]:
    """`remat.plan` at half the baseline's peak: the plot point and one sentence."""
    from .._plan import _plan

    try:
        p = _plan.plan(loss_fn, *fn_args, budget=0.5)
    except _plan.InfeasibleBudget as err:
        return [], f"remat.plan: {str(err).replace('`', '')}"
    m, peak, base_peak = p.measured, p.measured_peak_bytes, p.baseline_peak_bytes
    schedules = ", ".join(sorted({str(s.schedule) for s in p.scans}))
    saved = sum(len(s.names) for s in p.scans)
    line = (
        f"remat.plan for half the memory: saves {saved} chosen values per step "
        f"(schedule {schedules}), peak {peak / MIB:.1f} MiB ({peak / base_peak:.0%} of "
        f"the baseline; predicted {p.predicted_peak_bytes / MIB:.1f}) for "
        f"{m.flops / p.baseline_flops:.2f}× the baseline's FLOPs, solved in "
        f"{p.solve_seconds:.1f} s."
    )
    return [("plan 50%", peak, m.flops)], line


def memory_picture(loss_fn, fn_args, path: Path, fraction: float = 0.35) -> str:
    """Draws the step as written next to its plan for ``fraction`` of the peak (`remat.memory`,
    one compile each) and says where each peak is and what fills it."""
    from .._plan import _plan
    from .._report._memory import memory
    from .._report._memory_plot import plot_memory

    views = [memory(loss_fn, *fn_args)]
    try:
        planned = _plan.plan(loss_fn, *fn_args, budget=fraction)
    except _plan.InfeasibleBudget:
        pass
    else:
        views.append(memory(loss_fn, *fn_args, plan=planned, label=f"plan {fraction:.0%}"))
    plot_memory(views, path, title="where the memory goes (remat.memory)")
    lines = [f"{view.label}: {view.summary()}" for view in views]
    return "\n".join(lines) + f"\nwrote {path}"


def pick_sentence(report: Report, fraction: float = 0.5) -> str:
    """One sentence: the cheapest-FLOPs strategy within ``fraction`` of the baseline's peak."""
    base = report.baseline_measurement
    label = report.cheapest(max_peak_fraction=fraction)
    budget = fraction * base.peak_bytes / MIB
    if label is None:
        smallest_label, smallest = min(report.rows, key=lambda row: row[1].peak_bytes)
        return (
            f"No strategy fits in half the baseline's peak memory ({budget:.1f} of "
            f"{base.peak_bytes / MIB:.1f} MiB); the smallest peak is {smallest_label} at "
            f"{smallest.peak_bytes / MIB:.1f} MiB."
        )
    m = report[label]
    return (
        f"For half the memory (at most {budget:.1f} of the baseline's "
        f"{base.peak_bytes / MIB:.1f} MiB) remat would pick {label}: peak "
        f"{m.peak_bytes / MIB:.1f} MiB ({m.peak_bytes / base.peak_bytes:.0%} of the baseline) "
        f"for {m.flops / base.flops:.2f}× the baseline's FLOPs."
    )
