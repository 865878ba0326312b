"""``remat memory TARGET``: where the compiled step's memory goes, and what fills its peak."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def register(subparsers) -> None:
    from ._target import add_step_arguments

    parser = subparsers.add_parser(
        "memory",
        help="show what is live at the compiled step's peak, and its memory over time",
        description=(
            "Compile jax.value_and_grad(fn) for FACTORY()'s (fn, args), as written and, with "
            "--strategy or --plan, checkpointed; print the largest values live at the peak "
            "(read from XLA's buffer assignment) and, with --png, draw live memory along the "
            "schedule, stacked by kind (both steps side by side on one scale)."
        ),
    )
    parser.add_argument("target", metavar="FILE_OR_MODULE:FACTORY")
    add_step_arguments(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--strategy", default=None, help="also show this strategy (e.g. full)")
    group.add_argument("--plan", type=Path, default=None, help="also show this plan file")
    parser.add_argument("--top", type=int, default=12, help="values listed per step")
    parser.add_argument("--png", type=Path, metavar="PATH", help="write the picture")
    parser.add_argument(
        "--html", type=Path, metavar="PATH", help="write a self-contained page (hover for values)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .._core._io import check_writable
    from ._cli_compare import parse_argnums, parse_strategy
    from ._errors import EXIT_USAGE, CliError
    from ._target import load_target

    strategy = None
    if args.strategy is not None:
        strategy = parse_strategy(args.strategy, "remat memory --strategy")
    if args.plan is not None and not args.plan.is_file():
        raise CliError(f"--plan {args.plan}: no such file", EXIT_USAGE)
    if args.top < 1:
        raise CliError(f"--top must be >= 1; got {args.top}", EXIT_USAGE)
    argnums = parse_argnums(args.argnums)
    for flag, path in (("--png", args.png), ("--html", args.html)):
        if path is not None:
            check_writable(path, flag)
    fn, fn_args = load_target(args.target)
    from .._report._memory import memory
    from .._report._memory_plot import plot_memory, render_memory

    common = dict(argnums=argnums, has_aux=args.has_aux)
    views = [memory(fn, *fn_args, **common)]
    if strategy is not None:
        views.append(memory(fn, *fn_args, strategy=strategy, **common))
    elif args.plan is not None:
        views.append(memory(fn, *fn_args, plan=str(args.plan), **common))
    width = shutil.get_terminal_size((120, 24)).columns
    for view in views:
        print(render_memory(view, args.top, width))
        print(view.summary() + "\n")
    if args.png is not None:
        print(f"wrote {plot_memory(views, args.png, title=args.target)}")
    if args.html is not None:
        from .._report._memory_html import memory_html

        print(f"wrote {memory_html(views, args.html, title=args.target, top=args.top)}")
    return 0
