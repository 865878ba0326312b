"""The `remat` command line: ``remat demo``, ``remat measure``, ``remat compare`` and more.

Each command lives in a module of its own (``_cli_<command>.py``) that defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function taking the
parsed arguments and returning an exit code. Exit codes: 0 success, 1 infeasible plan, 2 usage
error; errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ._errors import EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, CliError

# command name -> module that registers it (imported lazily so `remat --help` is fast).
COMMANDS = {
    "demo": "remat._cli._cli_demo",
    "measure": "remat._cli._cli_measure",
    "compare": "remat._cli._cli_compare",
    "plan": "remat._cli._cli_plan",
    "lint": "remat._cli._cli_lint",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remat", description="Activation checkpointing for JAX, measured."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``remat`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or EXIT_OK)
    except CliError as err:
        print(f"remat {args.command}: error: {err}", file=sys.stderr)
        return err.code
    except (ValueError, TypeError, OSError) as err:
        # remat's API errors (bad options reaching `remat.measure`, `remat.plan`, ...) and
        # unwritable output paths: one line, not a traceback. Output files are atomic, so
        # nothing half-written is left behind.
        infeasible = type(err).__name__ == "InfeasibleBudget"
        first = (str(err).splitlines() or [type(err).__name__])[0]
        print(f"remat {args.command}: error: {first}", file=sys.stderr)
        return EXIT_INFEASIBLE if infeasible else EXIT_USAGE
    except KeyboardInterrupt:
        print(f"remat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
