"""What a plan is doing, on stderr: tracing, calibrating, solving, verifying round k.

Shown with a `rich` status line (the stage and the seconds since the plan began) once the plan
has taken longer than `DELAY` seconds, so quick plans print nothing; silent when stderr is not a
terminal or with ``verbose=False``. The line is transient: it is erased when the plan ends.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

DELAY = 2.0


class Progress:
    """Reports stages; call it with a stage's description, and `close` it at the end.

    Example:
      >>> import io
      >>> from remat._plan._progress import Progress
      >>> p = Progress(stream=io.StringIO())  # not a terminal: silent
      >>> p("tracing"); p.close()
    """

    def __init__(self, verbose: bool = True, stream: TextIO | None = None, delay: float = DELAY):
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(verbose and isatty is not None and isatty())
        self.delay = delay
        self.start = time.perf_counter()
        self.stage = ""
        self.status: Any = None

    def __call__(self, stage: str) -> None:
        if not self.enabled:
            return
        self.stage = stage
        elapsed = time.perf_counter() - self.start
        if self.status is None:
            if elapsed < self.delay:
                return
            from rich.console import Console

            console = Console(file=self.stream, force_terminal=True)
            self.status = console.status(self._text(elapsed))
            self.status.start()
        self.status.update(self._text(elapsed))

    def _text(self, elapsed: float) -> str:
        return f"remat.plan: {self.stage} ({elapsed:.1f} s)"

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
