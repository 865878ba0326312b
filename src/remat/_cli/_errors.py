"""The CLI's exit codes and `CliError`, shared by `_cli.py` and every command's module."""

from __future__ import annotations

EXIT_OK, EXIT_INFEASIBLE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of standard output went away (`| head -1`)


class CliError(Exception):
    """An error that the CLI reports as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code
