"""Every fenced block of README.md and docs/*.md runs as written, and shows what it prints.

The blocks are found by parsing the Markdown (markdown-it-py, which rich already brings), so a
new block is tested as soon as it is written; the fence's info string says how
(docs/architecture.md, "Documentation that runs", is the reference for writers):

- ```` ```python ````: runs on its own, in a fresh namespace, in an empty folder, as a file
  named ``example.py`` (so the source lines remat prints read ``example.py:LINE``).
- ```` ```python continuation ````: runs in the namespace of the Python block before it.
- ```` ```python process ````: runs on its own in a new Python process (a block that sets
  up JAX before importing it, e.g. ``XLA_FLAGS`` for several CPU devices).
- ```` ```output ```` right after a Python block: what that block prints, checked line by
  line; a figure that depends on the machine (a time) is written ``≈3.1`` and matches any
  number.
- ```` ```bash ```` / ```` ```console ````: every command (``$ `` lines in a console block)
  runs with bash from a folder that holds the repository's ``examples/`` and ``src/``, with
  this Python's environment first on ``PATH`` (``remat``, ``python``); a console block's
  other lines are the output, checked as above. A block whose every command is a plain
  ``remat ...`` runs them through the CLI's ``main`` in this process (`_run_remat`).
- ``notest`` after the language (```` ```bash notest ````): shown, never run (a command that
  needs a GPU, the test suite itself); the text around it says why.
- ``slow`` after the language (```` ```bash slow ````, ```` ```python slow ````): run only by
  ``./dev test -m slow``, for a block that plans or compiles a model as large as the demo's
  and whose commands tests/_cli runs on small targets by default.
- Any other language (``text``, none) is shown, never run.

``REMAT_UPDATE_DOCS=1 ./dev test tests/test_docs.py`` rewrites every Python block's output
block that no longer matches with what the block printed now (``≈`` kept on the figures that
had it), for a change that moves the figures on purpose; without it, a figure that moved fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTIONS = {
    "python": {"continuation", "process", "notest", "slow"},
    "bash": {"notest", "slow"},
    "console": {"notest", "slow"},
}
VARIES = re.compile(r"≈(-?[0-9][0-9.,]*)")


@dataclasses.dataclass
class Block:
    path: Path
    line: int
    lang: str
    options: tuple[str, ...]
    code: str
    output: str | None = None  # the ```output block after it
    output_lines: tuple[int, int] | None = None  # its content's lines in the file, 0-based

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, each Python block with the output block after it."""
    out: list[Block] = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type != "fence":
            continue
        lang, *options = token.info.split() or [""]
        if lang == "output" and out and out[-1].lang == "python":
            out[-1].output = token.content
            out[-1].output_lines = (token.map[0] + 1, token.map[1] - 1)
            continue
        out.append(Block(path, token.map[0] + 1, lang, tuple(options), token.content))
    return out


def chains() -> list[list[Block]]:
    """Python blocks grouped into runs: a block and the continuations that follow it."""
    out: list[list[Block]] = []
    for path in DOCS:
        for block in blocks(path):
            if block.lang != "python" or "notest" in block.options:
                continue
            if "continuation" in block.options:
                assert out and out[-1][0].path == path, f"{block.where}: nothing to continue"
                out[-1].append(block)
            else:
                out.append([block])
    return out


def shells() -> list[Block]:
    return [
        b
        for path in DOCS
        for b in blocks(path)
        if b.lang in ("bash", "console") and "notest" not in b.options
    ]


def _params(runs: list, first) -> list:
    """``runs`` as pytest parameters, a run whose first block says ``slow`` marked slow."""
    marks = lambda run: [pytest.mark.slow] if "slow" in first(run).options else []  # noqa: E731
    return [pytest.param(run, marks=marks(run), id=first(run).where) for run in runs]


def matches(expected: str, got: str) -> bool:
    """Whether ``got`` is ``expected``, line by line (trailing spaces aside), where a ``≈N``
    figure of ``expected`` matches any number and a line ``...`` any lines."""
    lines = []
    for line in expected.strip("\n").splitlines():
        if line.strip() == "...":
            lines.append(r"(?:[^\n]*\n)*?")
            continue
        parts = VARIES.split(line.rstrip())
        lines.append(
            "".join(
                re.escape(part) if i % 2 == 0 else r"-?[0-9][0-9.,e+-]*"
                for i, part in enumerate(parts)
            )
            + r"[ \t]*\n"
        )
    have = "".join(line.rstrip() + "\n" for line in got.strip("\n").splitlines())
    return re.fullmatch("".join(lines), have) is not None


NUMBER = re.compile(r"-?[0-9][0-9.,]*")


def _marked(expected: str, got: str) -> str:
    """``got`` with ``≈`` before each number where ``expected`` had one at the same place."""
    want = expected.strip("\n").splitlines()
    out = []
    for i, line in enumerate(got.strip("\n").splitlines()):
        old = want[i] if i < len(want) else ""
        varies = iter([m[0].startswith("≈") for m in re.finditer("≈?" + NUMBER.pattern, old)])

        def mark(m: re.Match, varies=varies) -> str:
            return ("≈" if next(varies, False) else "") + m[0]

        out.append(NUMBER.sub(mark, line).rstrip())
    return "\n".join(out) + "\n"


def _check_output(block: Block, got: str) -> None:
    """Fails when ``got`` is not the block's output; rewrites it instead when asked to."""
    if matches(block.output, got):
        return
    if os.environ.get("REMAT_UPDATE_DOCS") == "1" and "..." not in block.output.split():
        lines = block.path.read_text().splitlines(keepends=True)
        start, end = block.output_lines
        lines[start:end] = [_marked(block.output, got)]
        block.path.write_text("".join(lines))
        return
    raise AssertionError(
        f"{block.where} printed:\n{got}\nthe document shows:\n{block.output}"
        "(REMAT_UPDATE_DOCS=1 rewrites it, if the change is meant)"
    )


def _folder(tmp_path: Path) -> Path:
    """An empty folder with the repository's examples/ and src/ in it, made the working one."""
    for name in ("examples", "src"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.mark.parametrize("chain", _params(chains(), lambda c: c[0]))
def test_python_block_runs_as_written(chain, tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    if "process" in chain[0].options:
        assert len(chain) == 1, f"{chain[1].where}: a block in its own process has no sequel"
        (folder / "example.py").write_text(chain[0].code)
        done = subprocess.run(
            [sys.executable, "example.py"],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "JAX_PLATFORMS": "cpu"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{chain[0].where} failed:\n{done.stderr}"
        if chain[0].output is not None:
            _check_output(chain[0], done.stdout)
        return
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__main__"}
    for block in chain:
        source = tmp_path / "example.py"
        source.write_text(block.code)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block.code, "example.py", "exec"), namespace)
        if block.output is not None:
            _check_output(block, printed.getvalue())


def _commands(block: Block) -> list[tuple[str, str | None]]:
    """(command, expected output or None) of a shell block."""
    if block.lang == "bash":
        return [(block.code, None)]
    out: list[tuple[str, str | None]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], ""))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]}{line}\n")
    return out


QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?~{}\[\]\\]")


def _remat_argv(command: str) -> list[str] | None:
    """The arguments of a command that is the ``remat`` CLI alone (words, quotes and a
    trailing comment: no pipe, redirection, expansion or second command), else None."""
    if SHELL_SYNTAX.search(QUOTED.sub("''", command).split(" #")[0]):
        return None
    words = shlex.split(command, comments=True)
    return words[1:] if words and words[0] == "remat" else None


def _run_remat(argv: list[str], folder: Path) -> tuple[int, str]:
    """``remat ARGV`` run by the CLI's `main` in this process from ``folder``: its exit code
    and what it printed (stdout and stderr, as a terminal shows them). The same code as the
    console script without a new interpreter's start (importing JAX, compiling the factory's
    small programs again); tests/_cli runs the script itself in a process of its own."""
    from remat._cli._cli import main

    printed = io.StringIO()

    def show(message, category, filename, lineno, file=None, line=None):
        printed.write(warnings.formatwarning(message, category, filename, lineno, line))

    with (
        contextlib.chdir(folder),
        contextlib.redirect_stdout(printed),
        contextlib.redirect_stderr(printed),
        warnings.catch_warnings(),
    ):
        # a new interpreter's filters (not the suite's "error"): warnings are printed
        warnings.resetwarnings()
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):  # fmt: skip
            warnings.simplefilter("ignore", category)
        warnings.showwarning = show
        code = main(argv)
    return code, printed.getvalue()


@pytest.mark.parametrize("block", _params(shells(), lambda b: b))
def test_shell_block_runs_as_written(block, tmp_path):
    """A block whose every command is a ``remat`` command runs them with the CLI's `main` in
    this process (`_run_remat`); any other block runs with bash in a new process."""
    folder = _folder(tmp_path)
    commands = _commands(block)
    if block.lang == "bash":  # one command a line (a comment line is none)
        lines = [line for line in block.code.splitlines() if line.strip()]
        if all(_remat_argv(line) is not None for line in lines):
            commands = [(line, None) for line in lines]
    if all(_remat_argv(command) is not None for command, _ in commands):
        for command, expected in commands:
            code, printed = _run_remat(_remat_argv(command), folder)
            assert code == 0, f"{block.where}: {command!r} exited {code}:\n{printed}"
            if expected:
                assert matches(expected, printed), (
                    f"{block.where}: {command!r} printed:\n{printed}\nthe document shows:\n"
                    f"{expected}"
                )
        return
    bindir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT / "src"),
        "JAX_PLATFORMS": "cpu",
    }
    if shutil.which("remat", path=env["PATH"]) is None:  # an environment without the script
        (folder / "bin").mkdir()
        script = folder / "bin" / "remat"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m remat "$@"\n')
        script.chmod(0o755)
        env["PATH"] = f"{folder / 'bin'}{os.pathsep}{env['PATH']}"
    for command, expected in commands:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # as a terminal shows them
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{block.where}: {command!r} failed:\n{done.stdout}"
        if expected:
            assert matches(expected, done.stdout), (
                f"{block.where}: {command!r} printed:\n{done.stdout}\nthe document shows:\n"
                f"{expected}"
            )


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_fence_option_is_one_the_runner_knows(path):
    # a misspelt option ("continuaton") would silently run a block on its own
    for block in blocks(path):
        known = OPTIONS.get(block.lang, set())
        assert set(block.options) <= known, f"{block.where}: {block.options} not in {known}"
        assert block.lang != "output", f"{block.where}: an output block after no Python block"


def test_the_output_checker_reads_varying_figures():
    assert matches("full  peak 2.72 MiB, ≈3.9 ms\n", "full  peak 2.72 MiB, 12.5 ms  \n")
    assert not matches("full  peak 2.72 MiB, ≈3.9 ms", "full  peak 2.73 MiB, 3.9 ms")
    assert not matches("a\nb", "a")
    assert matches("a\n...\nd\n", "a\nb\nc\nd")
    assert matches("a\n...\nd\n", "a\nd")
    assert (
        _marked("dots 3.72 MiB, ≈3.4 ms\n", "dots 3.80 MiB, 5.0 ms") == "dots 3.80 MiB, ≈5.0 ms\n"
    )


def _demo_rows(text: str, start: str, end: str, sep: str) -> dict[str, tuple[str, ...]]:
    """strategy -> (peak MiB, peak ×base, residual MiB, GFLOPs, FLOPs ×base) of a demo table
    between ``start`` and ``end``: the columns that repeat exactly (not ms/step)."""
    section = text[text.index(start) : text.index(end)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip(sep).split(sep)]
        if len(cells) == 8 and re.fullmatch(r"[0-9.]+", cells[1]):
            rows[cells[0]] = tuple(cells[1:6])
    return rows


def test_the_readme_demo_sample_and_benchmarks_agree_on_the_exact_columns():
    # Both are written by commands (`./dev bench readme_demo`, `./dev bench demo_bench`) from
    # runs of the same demo: memory and FLOPs repeat exactly, so one rewritten without the
    # other (a change to the demo, the model or the planner) shows here.
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "BENCHMARKS.md").read_text()
    sample = _demo_rows(readme, "<!-- demo-sample:start -->", "<!-- demo-sample:end -->", "│")
    table = _demo_rows(bench, "<!-- demo:start -->", "<!-- demo:end -->", "|")
    assert len(sample) == 7 and sample == table
