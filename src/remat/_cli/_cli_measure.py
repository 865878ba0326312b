"""``remat measure TARGET``: what one compiled gradient step keeps and costs."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

MIB = 2.0**20


def register(subparsers) -> None:
    from ._target import add_compile_target, add_step_arguments

    parser = subparsers.add_parser(
        "measure",
        help="measure the compiled gradient step of a program",
        description=(
            "Compile jax.value_and_grad(fn) for FACTORY()'s (fn, args) and report its peak "
            "memory, residuals, FLOPs (with loop trip counts) and step time."
        ),
    )
    parser.add_argument("target", metavar="FILE_OR_MODULE:FACTORY")
    add_step_arguments(parser)
    parser.add_argument("--strategy", default=None, help="apply this strategy first (e.g. full)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs after a warm-up (default 5; 0 when FACTORY returns jax.ShapeDtypeStructs: "
        "shapes are compiled and measured, not run)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the measurement")
    parser.add_argument(
        "--no-roll",
        action="store_true",
        help="with --strategy: apply it to the program as written; by default repeated layers outside the program's scans are rolled into scans first",
    )
    parser.add_argument(
        "--override",
        action="store_true",
        help="with --strategy: replace the program's own checkpoints (jax.checkpoint, nn.remat) by it; by default a scan that checkpoints already is left as written",
    )
    add_compile_target(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .._core._io import atomic_write_text, check_writable
    from ._cli_compare import parse_argnums, parse_strategy
    from ._target import compile_target_of, load_target, repeats_for

    target = compile_target_of(args, "remat measure")

    if args.strategy is not None:
        strategy = parse_strategy(args.strategy, "remat measure --strategy")
    else:
        strategy = None
    argnums = parse_argnums(args.argnums)
    if args.json is not None:  # a wrong path fails now, not after compiling
        check_writable(args.json, "--json")
    fn, fn_args = load_target(args.target)
    from .._measure._measure import measure  # after the cheap checks: a bad target fails fast

    m = measure(
        fn,
        *fn_args,
        argnums=argnums,
        strategy=strategy,
        repeats=repeats_for(args.repeats, fn_args, target),
        target=target,
        has_aux=args.has_aux,
        roll=not args.no_roll,
        override=args.override,
    )
    _print(m, args.target)
    if args.json is not None:
        text = json.dumps(dataclasses.asdict(m), indent=1) + "\n"
        print(f"wrote {atomic_write_text(args.json, text)}")
    return 0


def _print(m, target: str) -> None:
    from rich.console import Console

    console = Console(highlight=False)
    console.print(f"[bold]{target}[/bold]  strategy: {m.strategy}  backend: {m.backend}")
    console.print(
        f"peak memory  {m.peak_bytes / MIB:10.2f} MiB  ({m.peak_source}; temp "
        f"{m.temp_bytes / MIB:.2f}, arguments {m.argument_bytes / MIB:.2f}, outputs "
        f"{m.output_bytes / MIB:.2f}, aliased {m.alias_bytes / MIB:.2f})"
    )
    console.print(
        f"residuals    {m.residual_bytes / MIB:10.2f} MiB  ({len(m.residuals)} values kept "
        "for the backward pass)"
    )
    console.print(
        f"FLOPs        {m.flops / 1e9:10.3f} G    (forward {m.forward_flops / 1e9:.3f} G; "
        "loop trip counts included)"
    )
    if m.seconds is not None:
        s = m.seconds
        console.print(
            f"step time    {s.median * 1e3:10.2f} ms   (median of {s.repeats}; min "
            f"{s.min * 1e3:.2f}, max {s.max * 1e3:.2f}; compile {m.compile_seconds:.2f} s)"
        )
    if m.recompute_eliminated:
        console.print(
            "[bold]note:[/bold] XLA removed the recomputation this strategy asked for; "
            "move the layers into a scan for checkpointing to take effect."
        )
    elif m.saves_nothing:
        console.print(
            f"[bold]note:[/bold] the checkpoints recompute, but the peak "
            f"({m.peak_bytes / MIB:.2f} MiB) is not 2% below the "
            f"{m.plain_peak_bytes / MIB:.2f} MiB of the program without them: no memory saved; "
            "move the layers into a scan for checkpointing to take effect."
        )
    if m.scans_as_written:
        of = m.scans_as_written + m.scans_applied
        console.print(
            f"[bold]note:[/bold] {m.scans_as_written} of the {of} scans the strategy selects "
            "kept the program's own checkpoints, so the numbers are the program as written "
            "there; --override applies the strategy there."
        )
    if m.residuals:
        console.print(residual_table(m))


def residual_table(m, rows: int = 12):
    """The ``rows`` largest residuals as a `rich` table; at any console width the numbers
    print whole (the text columns wrap instead)."""
    from rich.table import Table

    cells = [
        [
            str(tuple(r.shape)),
            r.dtype,
            str(r.multiplicity),
            f"{r.total_bytes / MIB:.3f}",
            r.primitive,
            r.name or "",
            r.source or "",
        ]
        for r in sorted(m.residuals, key=lambda r: -r.total_bytes)[:rows]
    ]
    table = Table(title="largest residuals", title_justify="left")
    for i, col in enumerate(
        ("shape", "dtype", "× copies", "MiB total", "primitive", "name", "source")
    ):
        number = col in ("× copies", "MiB total")
        widest = max(len(c[i]) for c in cells) if number else None
        table.add_column(
            col, justify="right" if number else "left", min_width=widest, overflow="fold"
        )
    for c in cells:
        table.add_row(*c)
    return table
