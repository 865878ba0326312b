"""The CLI's output files and streams: a wrong output path fails before the program is built,
files are written atomically and through symbolic links, a directory is never replaced,
Ctrl-C and a closed pipe end quietly, and tables keep their numbers whole at 60 columns."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import remat
from conftest import ROWS, row
from remat._cli import _cli

# The factory leaves a mark when it runs: a wrong output path must fail before it does.
TARGET = textwrap.dedent(
    """
    import pathlib
    import jax, jax.numpy as jnp

    def make():
        pathlib.Path(__file__).with_name("factory-ran").touch()
        def loss(ws, x):
            return jnp.sum(jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0])
        return loss, (jnp.ones((3, 4, 4)) * 0.1, jnp.ones((2, 4)))
    """
)
SRC = str(Path(remat.__file__).parent.parent)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(TARGET)
    return path


def _run(capsys, argv):
    code = _cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# command -> (arguments before the output flag, the flag, "file" or "folder")
OUTPUTS = {
    "measure": (["--repeats", "0"], "--json", "file"),
    "lint": (["--no-measure"], "--json", "file"),
    "compare": (["--strategies", "full", "--repeats", "0"], "--out", "folder"),
    "plan": (["--budget", "50%"], "--out", "folder"),
}


@pytest.mark.parametrize("command", sorted(OUTPUTS))
@pytest.mark.parametrize("wrong", ["directory-for-a-file", "below-a-file", "file-for-a-folder"])
def test_a_wrong_output_path_fails_before_the_factory_runs(capsys, target, command, wrong):
    extra, flag, kind = OUTPUTS[command]
    if wrong == "directory-for-a-file" and kind == "folder":
        (target.parent / "out" / ("report.json" if command == "compare" else "plan.json")).mkdir(
            parents=True
        )
        out = target.parent / "out"
    elif wrong == "directory-for-a-file":
        out = target.parent
    elif wrong == "below-a-file":
        out = target / "sub" / "out.json"  # its parent cannot be created: model.py is a file
    else:
        if kind == "file":
            pytest.skip("a file is what --json wants")
        out = target
    code, _, err = _run(capsys, [command, f"{target}:make", *extra, flag, str(out)])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert flag in err and str(out) in err
    assert not (target.parent / "factory-ran").exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_fails_before_the_factory_runs(capsys, target, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, _, err = _run(
        capsys, ["measure", f"{target}:make", "--repeats", "0", "--json", str(locked / "m.json")]
    )
    assert code == 2 and "--json" in err and not (tmp_path / "factory-ran").exists()


@pytest.mark.skipif(os.name != "posix", reason="symbolic links")
def test_json_is_written_through_a_symbolic_link(capsys, target, tmp_path):
    real = tmp_path / "results" / "measure.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    code, _, _ = _run(capsys, ["measure", f"{target}:make", "--repeats", "0", "--json", str(link)])
    assert code == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["peak_bytes"] > 0
    assert [p.name for p in real.parent.iterdir()] == ["measure.json"]  # no temporary left


def test_a_directory_is_never_replaced(tmp_path):
    from remat._core._io import atomic_write_text

    folder = tmp_path / "out.json"
    folder.mkdir()
    (folder / "keep").write_text("x")
    with pytest.raises(IsADirectoryError):
        atomic_write_text(folder, "{}")
    assert (folder / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_ctrl_c_exits_130_with_one_line(capsys, target, monkeypatch):
    from remat._cli import _cli_measure

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_cli_measure, "_print", interrupted)
    code, _, err = _run(capsys, ["measure", f"{target}:make", "--repeats", "0"])
    assert code == 130 and err == "remat measure: interrupted\n"


def test_a_closed_pipe_ends_quietly_with_141_and_still_writes_files(target, tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before remat writes a line (`| head -0`)
    out = tmp_path / "m.json"
    env = {**os.environ, "PYTHONPATH": SRC, "JAX_PLATFORMS": "cpu"}
    argv = ["measure", f"{target}:make", "--repeats", "0", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "remat", *argv],
        stdout=write,
        stderr=subprocess.PIPE,
        env=env,
        timeout=300,
        check=False,
    )
    os.close(write)
    assert proc.returncode == 141, proc.stderr.decode()
    assert proc.stderr.decode() == ""
    assert json.loads(out.read_text())["peak_bytes"] > 0


def _whole(text: str, numbers: list[str]) -> None:
    assert "…" not in text, text
    for number in numbers:
        assert number in text, (number, text)
    assert max(len(line) for line in text.splitlines()) <= 60, text


def test_the_compare_table_keeps_its_numbers_whole_at_60_columns():
    from remat._report._report import Machine, Report

    rows = (*ROWS, ("names:qkv,attn_out,mlp_hidden+nested(2)", row(1234.5, 123.4, 1234.5)))
    report = Report(rows, "none", Machine("cpu", "cpu", 1, "0.4"), title="a long title " * 3)
    wide = report._cells()
    numbers = [cell for cells in wide for cell in cells[1:-1] if cell != "-"]
    _whole(report.render(60), numbers)


def test_the_residual_table_keeps_its_numbers_whole_at_60_columns():
    from rich.console import Console

    from remat._cli._cli_measure import residual_table

    residual = remat.Residual(
        (4096, 1024), "bfloat16", 2**23, 123, "dot_general", "attn_out", "/a/long/path/model.py:1"
    )
    m = remat.Measurement(1, "x", 0, 0, 0, 0, (residual,), 0, 1.0, 1.0, False, False, 0.0, None)
    console = Console(file=io.StringIO(), width=60, color_system=None)
    console.print(residual_table(m))
    _whole(console.file.getvalue(), ["123", f"{123 * 2**23 / 2**20:.3f}"])


def test_the_plan_explanation_keeps_its_numbers_whole_at_60_columns():
    data = Path(__file__).parent.parent / "data" / "plan_v1_nested.json"
    import jax
    import jax.numpy as jnp

    def loss(ws, x):
        x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return (x**2).sum()

    p = remat.load_plan(data, loss, jnp.ones((64, 8, 8)) * 0.1, jnp.ones((64, 8)))
    from remat._core._budget import format_bytes

    sizes = [f"{format_bytes(v.bytes)} × {v.multiplicity}" for v in p.scans[0].saved]
    _whole(p.explain(width=60), sizes)
