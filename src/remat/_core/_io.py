"""Atomic file output: a file is either absent, the old one, or complete; never half-written."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; renames it onto ``path`` if the block succeeds.

    A symbolic link is written through: its target is replaced, the link stays. A directory
    is never replaced (`IsADirectoryError`).

    Example:
      >>> import tempfile, pathlib
      >>> from remat._core._io import atomic_path
      >>> d = pathlib.Path(tempfile.mkdtemp())
      >>> with atomic_path(d / "x.txt") as tmp:
      ...     _ = tmp.write_text("hello")
      >>> (d / "x.txt").read_text()
      'hello'
    """
    path = _through_links(Path(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not replaced by a file", str(path))
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


def _through_links(path: Path) -> Path:
    """The file a write to ``path`` should replace: the target of a symbolic link (followed
    to its end, even if that does not exist yet), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Checks, before any work, that a file can be written at ``path`` as `atomic_path` writes
    it: not a directory, in a folder that exists or can be created and that takes new files.
    Creates the folder. ``what`` names the path in the error (e.g. ``"--json"``).

    Raises:
      ValueError: one line naming ``what`` and ``path``, and why not.

    Example:
      >>> import tempfile, pathlib
      >>> from remat._core._io import check_writable
      >>> d = pathlib.Path(tempfile.mkdtemp())
      >>> check_writable(d / "new" / "out.json", "--json") == d / "new" / "out.json"
      True
      >>> check_writable(d, "--json")
      Traceback (most recent call last):
      ...
      ValueError: --json ... is a directory; give a file path, e.g. .../out.json
    """
    target = _through_links(Path(path))
    if target.is_dir():
        raise ValueError(
            f"{what} {path} is a directory; give a file path, e.g. {Path(path) / 'out.json'}"
        )
    _check_folder(target.parent, what, path)
    return Path(path)


def check_folder(path: str | os.PathLike, names: tuple[str, ...], what: str) -> Path:
    """Checks, before any work, that the files ``names`` can be written into the folder
    ``path`` (created if missing), none of them a directory. ``what`` names it in errors.

    Raises:
      ValueError: one line naming ``what`` and ``path``, and why not.
    """
    folder = _through_links(Path(path))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what} {path} is a file; give a folder for {', '.join(names)}")
    _check_folder(folder, what, path)
    for name in names:
        if _through_links(folder / name).is_dir():
            raise ValueError(f"{what} {path}: {folder / name} is a directory, not replaced")
    return Path(path)


def _check_folder(folder: Path, what: str, path: str | os.PathLike) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".remat-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        why = err.strerror or str(err)
        raise ValueError(
            f"{what} {path} cannot be written: {why} ({err.filename or folder})"
        ) from None


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
