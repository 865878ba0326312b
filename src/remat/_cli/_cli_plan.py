"""``remat plan TARGET --budget 50%``: the cheapest checkpointing that fits a memory budget."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    from ._target import add_compile_target, add_step_arguments

    parser = subparsers.add_parser(
        "plan",
        help="plan the cheapest checkpointing of a program within a memory budget",
        description=(
            "Choose, for every scan of FACTORY()'s fn, what to save and how to schedule it so "
            "that the compiled gradient step fits BUDGET with the fewest recomputed FLOPs; "
            "print the explanation and write plan.json."
        ),
    )
    parser.add_argument("target", metavar="FILE_OR_MODULE:FACTORY")
    parser.add_argument(
        "--budget",
        required=True,
        help="bytes (6000000), a size ('6GiB', '512MiB') or a fraction of the "
        "un-checkpointed peak ('50%%', 0.5)",
    )
    add_step_arguments(parser)
    parser.add_argument(
        "--out", type=Path, default=Path("remat-plan"), help="directory for plan.json"
    )
    parser.add_argument(
        "--no-roll",
        action="store_true",
        help="plan only the program's own scans; by default repeated layers outside the program's scans are rolled into scans (unless it fits as written)",
    )
    add_compile_target(parser)
    parser.set_defaults(func=run)


def budget_arg(text: str) -> int | float | str:
    """A budget from the command line: an int is bytes, a float a fraction, else a string."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def run(args: argparse.Namespace) -> int:
    from .._core._io import check_folder
    from ._cli_compare import parse_argnums
    from ._errors import EXIT_INFEASIBLE, EXIT_USAGE, CliError
    from ._target import compile_target_of, load_target

    target = compile_target_of(args, "remat plan")

    argnums = parse_argnums(args.argnums)
    budget = budget_arg(args.budget)
    from .._core._budget import read_budget

    read_budget(budget, sensible=True)  # a malformed budget fails now, not after compiling
    check_folder(args.out, ("plan.json",), "--out")
    fn, fn_args = load_target(args.target)
    from .._plan._plan import plan  # after the cheap checks: a bad target fails fast
    from .._plan._result import InfeasibleBudget, NothingToPlan

    try:
        p = plan(
            fn,
            *fn_args,
            budget=budget,
            argnums=argnums,
            has_aux=args.has_aux,
            roll=not args.no_roll,
            target=target,
        )
    except (InfeasibleBudget, NothingToPlan) as err:
        raise CliError(str(err).replace("`", ""), EXIT_INFEASIBLE) from err
    except ValueError as err:
        raise CliError(str(err).replace("`", ""), EXIT_USAGE) from err
    print(p.explain())
    print(f"wrote {p.to_json(args.out / 'plan.json')}")
    return 0
