"""Every ``remat`` command that takes a target: usage errors exit 2 with one line on stderr
(no traceback), a clean run exits 0, and JSON output is never left half-written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from remat._cli import _cli

TARGET = textwrap.dedent(
    """
    import jax, jax.numpy as jnp

    def make():
        def loss(ws, x):
            return jnp.sum(jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0])
        return loss, (jnp.ones((3, 4, 4)) * 0.1, jnp.ones((2, 4)))

    def broken():
        raise RuntimeError("the factory failed")

    def not_a_pair():
        return 42

    def printing_layers():  # layers in a Python loop, each with a jax.debug.print: none rolls
        def loss(ws, x):
            for w in ws:
                x = jnp.tanh(x @ w)
                jax.debug.print("{}", x[0, 0])
            return jnp.sum(x)
        return loss, ([jnp.ones((4, 4)) * 0.1] * 3, jnp.ones((2, 4)))
    """
)
# command -> extra arguments it needs to run
COMMANDS = {
    "measure": ["--repeats", "0"],
    "compare": ["--strategies", "full"],
    "lint": [],
    "plan": ["--budget", "50%"],
    "memory": [],
}


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(TARGET)
    return path


def _run(capsys, argv):
    code = _cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_target_command_is_covered():
    parser_commands = {c for c in _cli.COMMANDS if c not in ("demo",)}
    assert parser_commands <= set(COMMANDS), parser_commands


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("{dir}/missing.py:make", "no such file"),
        ("{target}:broken", "the factory failed"),
        ("{target}:nothere", "nothere"),
        ("{target}:not_a_pair", "expected (fn, args)"),
        ("no_such_module_xyz:make", "no_such_module_xyz"),
    ],
)
def test_bad_targets_exit_2_with_one_line(capsys, target, command, spec, match):
    argv = [command, spec.format(dir=target.parent, target=target), *COMMANDS[command]]
    code, _, err = _run(capsys, argv)
    assert code == 2
    assert err.count("\n") == 1 and match in err and "Traceback" not in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unknown_option_exits_2(capsys, target, command):
    with pytest.raises(SystemExit) as info:  # argparse's own usage error
        _cli.main([command, f"{target}:make", "--no-such-option"])
    assert info.value.code == 2


def test_lint_json_is_written_atomically(capsys, target, tmp_path, monkeypatch):
    out = tmp_path / "findings.json"
    assert _cli.main(["lint", f"{target}:make", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["findings"] == []
    before = out.read_text()

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", fail)
    code, _, err = _run(capsys, ["lint", f"{target}:make", "--json", str(out)])
    assert code == 2 and err.count("\n") == 1 and "disk full" in err
    assert out.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["measure", "{target}:make", "--repeats", "-1"],
        ["measure", "{target}:make", "--repeats", "0", "--json", "{target}/out.json"],
        [
            "compare",
            "{target}:make",
            "--strategies",
            "full",
            "--repeats",
            "0",
            "--out",
            "{target}/d",
        ],
        ["lint", "{target}:make", "--json", "{target}/out.json"],
    ],
)
def test_api_errors_and_unwritable_outputs_exit_2_with_one_line(capsys, target, argv):
    # "{target}/..." is a path below a regular file: it cannot be created.
    code, _, err = _run(capsys, [a.format(target=target) for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err


def test_plan_infeasible_budget_exits_1_with_one_line(capsys, target):
    code, _, err = _run(capsys, ["plan", f"{target}:make", "--budget", "1%"])
    assert code == 1
    assert err.count("\n") == 1 and "cannot fit" in err and "Traceback" not in err


def test_plan_of_a_program_with_nothing_to_plan_exits_1_with_one_line(capsys, target):
    # the arguments are right; the program cannot be planned (as an infeasible budget)
    code, _, err = _run(capsys, ["plan", f"{target}:printing_layers", "--budget", "50%"])
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no repeated layers to roll" in err and "side effect" in err


def test_plan_bad_budget_exits_2_with_one_line(capsys, target):
    code, _, err = _run(capsys, ["plan", f"{target}:make", "--budget", "lots"])
    assert code == 2
    assert err.count("\n") == 1 and "'lots'" in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["measure", "--strategy", "bogus", "--repeats", "0"], "remat measure --strategy"),
        (["compare", "--strategies", "full,bogus"], "remat compare --strategies"),
        (["compare", "--strategies", "full", "--baseline", "bogus"], "remat compare --baseline"),
        (["lint", "--strategy", "bogus"], "remat lint --strategy"),
    ],
)
def test_unknown_strategy_names_the_command_and_the_strategy(capsys, target, argv, names):
    code, _, err = _run(capsys, [argv[0], f"{target}:make", *argv[1:]])
    assert code == 2 and err.count("\n") == 1
    assert names in err and "'bogus'" in err


# `remat memory` compiles for the host only (its reader of XLA's dumps is checked on CPU)
@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"memory"}))
@pytest.mark.parametrize(
    ("slice_", "libtpu", "match"),
    [
        ("tpu:v9:2x2", True, "is not a compile target"),
        ("tpu:v5e:2x2", False, "pip install 'remat[tpu]'"),
    ],
)
def test_bad_compile_targets_exit_2_with_one_line(
    capsys, target, command, slice_, libtpu, match, monkeypatch
):
    from remat._shard import _target

    monkeypatch.setattr(_target, "libtpu_available", lambda: libtpu)
    argv = [command, f"{target}:make", *COMMANDS[command], "--target", slice_]
    code, _, err = _run(capsys, argv)
    assert code == 2
    assert err.count("\n") == 1 and match in err and "Traceback" not in err
