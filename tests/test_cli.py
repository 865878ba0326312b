"""The command line: target loading, bad targets (one line, exit 2), measure/compare/demo."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remat._cli import EXIT_USAGE, CliError, main
from remat._cli_compare import parse_argnums, parse_strategy, split_strategies
from remat._cli_demo import pick_sentence
from remat._target import load_target

GOOD = """
import jax, jax.numpy as jnp

def make():
    def loss(w, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w)
        return jnp.sum(h ** 2)
    return loss, (jnp.full((3, 8, 8), 0.1), jnp.ones((2, 8)))

def raises():
    raise RuntimeError("boom\\nsecond line")

def not_a_pair():
    return 42

def args_not_a_tuple():
    return (lambda w: w, [1, 2])

NOT_CALLABLE = 3
"""


@pytest.fixture
def target_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(GOOD))
    return path


def test_load_target_from_file_and_module(target_file):
    fn, args = load_target(f"{target_file}:make")
    assert callable(fn) and isinstance(args, tuple) and len(args) == 2
    assert float(fn(*args)) > 0
    fn, args = load_target("remat._gpt:make_gpt")
    assert args[1].ndim == 2


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        ("{file}", "has no factory"),
        ("{file}:", "has no factory"),
        ("{dir}/missing.py:make", "no such file"),
        ("no_such_module_xyz:make", "no such module"),
        ("{file}:nope", "has no function 'nope'"),
        ("{file}:NOT_CALLABLE", "is not callable"),
        ("{file}:raises", "raised RuntimeError: boom"),
        ("{file}:not_a_pair", "returned a int; expected (fn, args)"),
        ("{file}:args_not_a_tuple", "returned a tuple (function, list)"),
    ],
)
def test_bad_targets_are_one_line_usage_errors(target_file, capsys, suffix, message):
    target = suffix.format(file=target_file, dir=target_file.parent)
    with pytest.raises(CliError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        load_target(target)
    assert info.value.code == EXIT_USAGE
    for command in (["measure", target], ["compare", target, "--strategies", "full"]):
        assert main(command) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"remat {command[0]}: error: ")
        assert "Traceback" not in err


def test_bad_target_from_a_real_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "remat", "measure", str(tmp_path / "nothing.py:make")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).parents[1] / "src"), "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no such file" in result.stderr


def test_unknown_strategy_and_bad_argnums_are_usage_errors(target_file, capsys):
    assert main(["compare", f"{target_file}:make", "--strategies", "full,bogus"]) == EXIT_USAGE
    assert "not a known strategy" in capsys.readouterr().err
    assert main(["measure", f"{target_file}:make", "--argnums", "x"]) == EXIT_USAGE
    assert "--argnums" in capsys.readouterr().err


def test_strategy_spellings():
    assert split_strategies("none,full,names:qkv,attn_out,dots") == [
        "none",
        "full",
        "names:qkv,attn_out",
        "dots",
    ]
    assert split_strategies("names:full;dots") == ["names:full", "dots"]
    assert split_strategies("full+nested(2),dots") == ["full+nested(2)", "dots"]
    strategy = parse_strategy("full+nested(2)")
    assert strategy.name == "full+nested(2)" and strategy.schedule.levels == 2
    assert parse_argnums("0") == 0 and parse_argnums("0,1") == (0, 1)


def _report(peaks_flops):
    from remat._measurement import Measurement
    from remat._report import Machine, Report

    def m(peak, flops):
        return Measurement(peak, "x", peak, 0, 0, 0, (), 0, flops, flops, False, False, 0.0, None)

    rows = tuple((label, m(p, f)) for label, (p, f) in peaks_flops.items())
    return Report(rows=rows, baseline="none", machine=Machine("cpu", "cpu", 1, "0"))


def test_pick_sentence_names_the_cheapest_strategy_in_half_the_memory():
    report = _report({"none": (100 << 20, 10.0), "dots": (60 << 20, 11.0), "full": (40 << 20, 13.0)})
    sentence = pick_sentence(report)
    assert sentence.endswith(".") and ". " not in sentence and "\n" not in sentence  # one sentence
    assert "pick full" in sentence and "40% of the baseline" in sentence and "1.30×" in sentence
    report = _report({"none": (100 << 20, 10.0), "dots": (60 << 20, 11.0)})
    assert pick_sentence(report).startswith("No strategy fits in half")
    assert "dots at 60.0 MiB" in pick_sentence(report)


def test_demo_rejects_bad_sizes(capsys, tmp_path):
    assert main(["demo", "--d-model", "10", "--heads", "3", "--out", str(tmp_path)]) == EXIT_USAGE
    assert "multiple of heads" in capsys.readouterr().err
    assert main(["demo", "--layers", "0", "--out", str(tmp_path)]) == EXIT_USAGE
    assert not any(tmp_path.iterdir())


TINY_DEMO = ["--layers", "2", "--d-model", "16", "--seq", "8", "--batch", "2", "--heads", "2"]


def test_measure_command_matches_measure(target_file, tmp_path, capsys):
    import remat

    out = tmp_path / "m.json"
    target = f"{target_file}:make"
    assert main(["measure", target, "--strategy", "full", "--repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    fn, args = load_target(target)
    direct = remat.measure(fn, *args, strategy="full", repeats=1)
    assert data["peak_bytes"] == direct.peak_bytes
    assert data["residual_bytes"] == direct.residual_bytes
    assert data["flops"] == direct.flops
    assert f"{direct.peak_bytes / 2**20:10.2f} MiB" in printed


def test_compare_and_demo_write_their_files(target_file, tmp_path, capsys):
    from remat import Report

    out = tmp_path / "cmp"
    code = main(
        ["compare", f"{target_file}:make", "--strategies", "full,dots", "--repeats", "1"]
        + ["--out", str(out)]
    )
    assert code == 0
    report = Report.from_json(out / "report.json")
    assert report.labels == ("none", "full", "dots")
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()

    demo = tmp_path / "demo"
    assert main(["demo", *TINY_DEMO, "--repeats", "1", "--out", str(demo)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    report = Report.from_json(demo / "report.json")
    assert len(report.rows) >= 6 and report.baseline == "none"
    for label in report.labels:
        assert any(label in line for line in printed)
    assert (demo / "pareto.png").exists()
    assert printed[-1].startswith(("For half the memory", "No strategy fits"))
    assert printed[-1] == pick_sentence(report)
