"""The CLI's exit codes and `CliError`, shared by `_cli.py` and every command's module."""

from __future__ import annotations

EXIT_OK, EXIT_INFEASIBLE, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """An error that the CLI reports as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code
