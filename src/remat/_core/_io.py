"""Atomic file output: a file is either absent, the old one, or complete; never half-written."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; renames it onto ``path`` if the block succeeds.

    Example:
      >>> import tempfile, pathlib
      >>> from remat._core._io import atomic_path
      >>> d = pathlib.Path(tempfile.mkdtemp())
      >>> with atomic_path(d / "x.txt") as tmp:
      ...     _ = tmp.write_text("hello")
      >>> (d / "x.txt").read_text()
      'hello'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        # mkstemp makes the file private (0600); give it the mode an ordinary write would.
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _mode_for(path: Path) -> int:
    """The replaced file's permissions, or those ``open(path, "w")`` would give a new file."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes ``text`` to ``path`` atomically (temporary file, then rename)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def replace_section(path: str | os.PathLike, markers: tuple[str, str], text: str) -> Path:
    """Replaces the part of the file at ``path`` from ``markers[0]`` to ``markers[1]`` (both
    included) with ``text``, atomically; appends ``text`` when the markers are not there (or
    the file does not exist). The benchmarks keep their sections of BENCHMARKS.md this way.

    Example:
      >>> import tempfile, pathlib
      >>> from remat._core._io import replace_section
      >>> f = pathlib.Path(tempfile.mkdtemp()) / "B.md"
      >>> marks = ("<!-- a:start -->", "<!-- a:end -->")
      >>> _ = replace_section(f, marks, "<!-- a:start -->\\none\\n<!-- a:end -->")
      >>> _ = replace_section(f, marks, "<!-- a:start -->\\ntwo\\n<!-- a:end -->")
      >>> f.read_text()
      '# Benchmarks\\n\\n<!-- a:start -->\\ntwo\\n<!-- a:end -->\\n'
    """
    path = Path(path)
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(markers[0]) + ".*?" + re.escape(markers[1]), re.S)
    new = pattern.sub(lambda _: text, old) if pattern.search(old) else old.rstrip() + "\n\n" + text
    return atomic_write_text(path, new.rstrip() + "\n")
