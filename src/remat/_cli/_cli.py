"""The `remat` command line: ``remat demo``, ``remat measure``, ``remat compare`` and more.

Each command lives in a module of its own (``_cli_<command>.py``) that defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function taking the
parsed arguments and returning an exit code. Exit codes: 0 success, 1 infeasible plan, a
program with nothing to plan (or lint findings), 2 usage error, 130 interrupted (Ctrl-C), 141
standard output closed early (as ``remat measure ... | head -1``: the command finishes its
work and files quietly, and exits as a tool killed by SIGPIPE would); errors are one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys

from ._errors import (
    EXIT_INFEASIBLE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    CliError,
)

# command name -> module that registers it (imported lazily so `remat --help` is fast).
COMMANDS = {
    "demo": "remat._cli._cli_demo",
    "measure": "remat._cli._cli_measure",
    "memory": "remat._cli._cli_memory",
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
    stdout = sys.stdout
    guard = sys.stdout = _PipeGuard(stdout)
    try:
        code = _run(args)
        guard.flush()
    finally:
        sys.stdout = stdout
    return EXIT_PIPE if guard.broken and code == EXIT_OK else code


def _run(args: argparse.Namespace) -> int:
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
        return EXIT_INTERRUPTED


class _PipeGuard(io.TextIOBase):
    """Standard output that a closed pipe (``remat measure ... | head -1``) silences.

    Once the reader has gone, further output is dropped (and the real standard output points
    at the null device, so that nothing fails when Python flushes it at exit); the command
    still finishes its work, its files included, and exits `EXIT_PIPE`.
    """

    def __init__(self, stream):
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._close()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._close()

    def _close(self) -> None:
        self.broken = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass  # not a real file descriptor (e.g. captured by a test)

    def isatty(self) -> bool:
        return not self.broken and self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")


if __name__ == "__main__":
    sys.exit(main())
