"""Rewrites the README's demo sample: runs `remat demo` and puts what it prints between the
README's ``demo-sample`` markers, so the sample is always the demo's own output.

    ./dev bench readme_demo            # runs the demo (about a minute), rewrites README.md
    ./dev bench readme_demo --no-write # prints the section instead

Memory and FLOPs repeat exactly on a given jax and planner; the times (ms/step, seconds) are
those of this run, and the README says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

from remat._cli import main as remat_main
from remat._core._io import replace_section

README = Path(__file__).resolve().parent.parent / "README.md"
MARKERS = ("<!-- demo-sample:start -->", "<!-- demo-sample:end -->")


def section(printed: str, load: float | None) -> str:
    """The README's demo sample: the demo's output in a text block, with the machine's load."""
    busy = (
        f"the machine's load average was {load:.1f} at the end of the run, so the times are rough"
        if load is not None
        else "the times are those of one run"
    )
    return "\n".join(
        [
            MARKERS[0],
            f"Written by `./dev bench readme_demo` ({busy}; the memory and FLOPs columns repeat "
            "exactly):",
            "",
            "```text",
            "\n".join(line.rstrip() for line in printed.rstrip().splitlines()),
            "```",
            MARKERS[1],
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print, do not touch README")
    args = parser.parse_args(argv)
    printed = io.StringIO()
    with (
        tempfile.TemporaryDirectory() as folder,
        contextlib.chdir(folder),  # the sample shows the demo's own paths, remat-demo/...
        contextlib.redirect_stdout(printed),
    ):
        code = remat_main(["demo"])
    if code:
        print(printed.getvalue())
        return code
    text = section(printed.getvalue(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    if args.no_write:
        print(text)
    else:
        replace_section(README, MARKERS, text)
        print(f"wrote the demo sample of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
