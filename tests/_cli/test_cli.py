"""The command line: target loading, bad targets (one line, exit 2), measure/compare/demo."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remat._cli._cli import main
from remat._cli._cli_compare import parse_argnums, parse_strategy, split_strategies
from remat._cli._cli_demo import pick_sentence
from remat._cli._errors import EXIT_USAGE, CliError
from remat._cli._target import load_target

GOOD = """
import jax, jax.numpy as jnp

def make():
    def loss(w, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w)
        return jnp.sum(h ** 2)
    return loss, (jnp.full((3, 8, 8), 0.1), jnp.ones((2, 8)))

def make_shapes():
    loss, (w, x) = make()
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
    return loss, (spec(w), spec(x))

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


def test_load_target_from_file_and_module(target_file, monkeypatch):
    fn, args = load_target(f"{target_file}:make")
    assert fn.__name__ == "loss" and isinstance(args, tuple) and args[0].shape == (3, 8, 8)
    monkeypatch.syspath_prepend(str(target_file.parent))
    fn, args = load_target("model:make")  # the same file, imported as a module
    assert fn.__name__ == "loss" and args[1].shape == (2, 8)


def test_a_target_file_may_define_dataclasses_and_flax_modules(tmp_path):
    # with string annotations, a dataclass (so a Flax module) looks its module up in
    # sys.modules while it is defined
    path = tmp_path / "model_with_classes.py"
    path.write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            import dataclasses
            import flax.linen as nn
            import jax.numpy as jnp

            @dataclasses.dataclass(frozen=True)
            class Sizes:
                width: int = 4

            class Layer(nn.Module):
                @nn.compact
                def __call__(self, x):
                    return nn.Dense(Sizes().width)(x)

            def make():
                import jax
                x = jnp.ones((2, 4))
                params = Layer().init(jax.random.key(0), x)
                return (lambda p, x: jnp.sum(Layer().apply(p, x))), (params, x)
            """
        )
    )
    fn, (params, x) = load_target(f"{path}:make")
    assert float(fn(params, x)) == float(fn(params, x))


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        ("{file}", "has no factory"),
        ("{file}:", "has no factory"),
        ("{dir}/missing.py:make", "no such file"),
        ("no_such_module_xyz:make", "no such module"),
        (
            "{file}:nope",
            "has no function 'nope'; its functions that take no arguments: "
            "make, make_shapes, raises, not_a_pair, args_not_a_tuple. Write {file}:FACTORY",
        ),
        ("{file}:NOT_CALLABLE", "is not callable"),
        ("{file}:raises", "raised RuntimeError: boom"),
        ("{file}:not_a_pair", "returned a int; expected (fn, args)"),
        ("{file}:args_not_a_tuple", "returned a tuple (function, list)"),
    ],
)
def test_bad_targets_are_one_line_usage_errors(target_file, capsys, suffix, message):
    target = suffix.format(file=target_file, dir=target_file.parent)
    message = message.format(file=target_file)
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
        env={"PYTHONPATH": str(Path(__file__).parents[2] / "src"), "JAX_PLATFORMS": "cpu"},
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no such file" in result.stderr


def test_unknown_strategy_and_bad_argnums_are_usage_errors(target_file, capsys):
    assert main(["compare", f"{target_file}:make", "--strategies", "full,bogus"]) == EXIT_USAGE
    assert "not a known strategy" in capsys.readouterr().err
    # in the shell's terms: what to type, never a Python object the shell cannot pass
    assert main(["measure", f"{target_file}:make", "--strategy", "fulll"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--strategy got 'fulll'" in err and "did you mean 'full'?" in err
    assert "+nested(LEVELS)" in err and "callable" not in err and "jax." not in err
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
    from remat._measure._measurement import Measurement
    from remat._report._report import Machine, Report

    def m(peak, flops):
        return Measurement(peak, "x", peak, 0, 0, 0, (), 0, flops, flops, False, False, 0.0, None)

    rows = tuple((label, m(p, f)) for label, (p, f) in peaks_flops.items())
    return Report(rows=rows, baseline="none", machine=Machine("cpu", "cpu", 1, "0"))


def test_pick_sentence_names_the_cheapest_strategy_in_half_the_memory():
    report = _report(
        {"none": (100 << 20, 10.0), "dots": (60 << 20, 11.0), "full": (40 << 20, 13.0)}
    )
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


def test_compare_and_measure_commands_agree(target_file, tmp_path, capsys):
    from remat import Report

    target = f"{target_file}:make"
    out = tmp_path / "cmp"
    assert (
        main(["compare", target, "--strategies", "full", "--repeats", "1", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    report = Report.from_json(out / "report.json")
    assert report.labels == ("none", "full") and report.title == target
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(label in printed for label in report.labels)

    path = tmp_path / "m.json"
    assert (
        main(["measure", target, "--strategy", "full", "--repeats", "0", "--json", str(path)]) == 0
    )
    printed = capsys.readouterr().out
    data = json.loads(path.read_text())
    full = report["full"]  # compiled memory and FLOPs are deterministic: exactly equal
    assert (data["peak_bytes"], data["residual_bytes"]) == (full.peak_bytes, full.residual_bytes)
    assert data["flops"] == full.flops and data["seconds"] is None
    assert f"{full.peak_bytes / 2**20:10.2f} MiB" in printed
    assert "largest residuals" in printed


def test_demo_prints_the_table_writes_files_and_picks(tmp_path, capsys, monkeypatch):
    from conftest import ROWS
    from remat import Report
    from remat._report._report import Machine

    seen = {}

    def fake_compare(fn, *args, strategies, baseline, repeats, title):
        seen.update(strategies=strategies, args=args, repeats=repeats)
        rows = tuple((label, m) for label, m in ROWS if label != "worse_than_full")
        return Report(
            rows=rows, baseline=baseline, machine=Machine("cpu", "cpu", 1, "0"), title=title
        )

    def fake_plan(fn, *args, budget):  # the planner has tests of its own (test_plan.py)
        from remat import InfeasibleBudget

        raise InfeasibleBudget(budget, 100, 200, 400)

    def fake_plan_budgets(fn, *args, budgets, schedules):
        return [fake_plan_error(b) for b in budgets]

    def fake_plan_error(budget):
        from remat import InfeasibleBudget

        return InfeasibleBudget(budget, 100, 200, 400)

    # the table at the width of a terminal (shutil.get_terminal_size reads $COLUMNS first):
    # whatever the test runner's stdout is, labels are not wrapped across lines
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr("remat._report._compare.compare", fake_compare)
    monkeypatch.setattr("remat._plan._plan.plan", fake_plan)
    monkeypatch.setattr("remat._plan._plan.plan_budgets", fake_plan_budgets)
    # the training-step section has a test of its own (test_demo_training_step_section)
    monkeypatch.setattr("remat._cli._cli_demo_train.train_section", lambda: "TRAIN SECTION")
    out = tmp_path / "demo"
    assert main(["demo", *TINY_DEMO, "--repeats", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    # The training-step section comes last.
    assert printed[-2].startswith("A training step (dropout, Adam) planned to a budget")
    assert printed[-1] == "TRAIN SECTION"
    printed = printed[:-3]
    # The unrolled twin's table comes last: the scanned GPT and its twin, side by side.
    twin = printed.index(
        "The same GPT with its blocks in a Python loop, which remat rolls into a scan:"
    )
    table, printed = printed[twin + 1 :], printed[:twin]
    assert table[0].startswith("| model | peak MiB | GFLOPs | plan 50% | plan 35% |")
    assert table[2].startswith("| scanned (nn.scan) |") and "no fit (>= 0.0)" in table[2]
    assert table[3].startswith("| unrolled (Python loop) |")
    assert table[-1].startswith("unrolled twin: rolled 2 layers of ")
    printed = [line for line in printed if line]
    assert len(seen["strategies"]) >= 6 and seen["repeats"] == 2
    assert seen["args"][1].shape == (2, 9)  # batch 2, seq 8 (+1 for the targets)
    report = Report.from_json(out / "report.json")
    assert report.title.startswith("GPT: 2 layers, d_model 16")
    for label in report.labels:
        assert any(label in line for line in printed)
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert printed[-4] == pick_sentence(report)
    assert "pick full:" in printed[-4]  # hand-made rows: full is the cheapest under 20 MiB
    assert printed[-3].startswith("remat.plan: remat.plan cannot fit budget 0.5")
    # the memory picture: the step as written (the fake planner fits no plan beside it)
    assert printed[-2].startswith("as written: peak ") and "saved" in printed[-2]
    assert printed[-1] == f"wrote {out / 'memory.png'}"
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG"
    assert report.pictures == (("none", "memory.png"),)  # the baseline's row links to it


def test_demo_training_step_section(monkeypatch):
    from remat._cli import _cli_demo_train

    sizes = dict(layers=3, width=16, hidden=64, batch=128, steps=2)
    monkeypatch.setattr(_cli_demo_train, "SIZES", sizes)
    lines = _cli_demo_train.train_section(budget=0.8).splitlines()
    assert lines[0].startswith("remat.plan(loss, params, x, y, key, budget=80%, optimizer=")
    assert lines[1].startswith("  train_step (plain  ): losses ")
    assert lines[2].startswith("  train_step (planned) with remat.apply(loss_fn, plan) inside")
    plain, planned = (line.split("losses ")[1].split(";")[0] for line in lines[1:3])
    assert plain == planned
    assert lines[3] == "  the same losses step by step (dropout masks recomputed, not redrawn)"


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, capsys):
    from remat import Report

    assert main(["demo", *TINY_DEMO, "--repeats", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    twin = [i for i, line in enumerate(printed) if line.startswith("The same GPT")]
    assert "| unrolled (Python loop) |" in "\n".join(printed[twin[0] :])
    printed = [line for line in printed[: twin[0]] if line]
    report = Report.from_json(tmp_path / "report.json")
    assert len(report.rows) >= 6 and report.baseline == "none"
    assert printed[-2] == pick_sentence(report)
    assert printed[-1].startswith("remat.plan")  # the planner's choice for half the memory


def test_every_command_takes_a_target_of_shapes(target_file, tmp_path, capsys):
    """A factory may return `jax.ShapeDtypeStruct`s: measured and planned from shapes (the
    default --repeats is then 0), the same numbers as from arrays; timing them is refused."""
    shapes, arrays = f"{target_file}:make_shapes", f"{target_file}:make"
    peaks = []
    for target in (shapes, arrays):
        path = tmp_path / "m.json"
        extra = [] if target == shapes else ["--repeats", "0"]
        assert main(["measure", target, "--json", str(path), *extra]) == 0
        data = json.loads(path.read_text())
        peaks.append(data["peak_bytes"])
        assert data["seconds"] is None
    assert peaks[0] == peaks[1]
    assert main(["compare", shapes, "--strategies", "full"]) == 0
    assert main(["plan", shapes, "--budget", "90%", "--out", str(tmp_path / "p")]) == 0
    assert main(["lint", shapes]) == 0
    capsys.readouterr()
    assert main(["measure", shapes, "--repeats", "2"]) == EXIT_USAGE
    assert "Pass repeats=0" in capsys.readouterr().err


CHECKPOINTED = """
import jax, jax.numpy as jnp

def make():
    body = jax.checkpoint(lambda h, w: (jnp.tanh(jnp.tanh(h @ w) @ w), None),
                          policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def loss(w, x):
        return jnp.sum(jax.lax.scan(body, x, w)[0] ** 2)
    return loss, (jnp.full((3, 8, 8), 0.1), jnp.ones((2, 8)))
"""


def test_compare_and_measure_say_what_kept_as_written_and_override_applies(
    tmp_path, capsys, monkeypatch
):
    import remat

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "160")  # the table as wide on every machine (xdist: 80)
    path = "ckpt.py"
    (tmp_path / path).write_text(textwrap.dedent(CHECKPOINTED))
    command = ["compare", f"{path}:make", "--strategies", "full", "--repeats", "0"]
    with pytest.warns(remat.RematWarning, match="kept the program's own checkpoints"):
        assert main(command) == 0
    printed = capsys.readouterr().out
    assert "full (as written: 1 of 1 scans)" in printed and "--override" in printed
    assert main([*command, "--override"]) == 0
    assert "as written" not in capsys.readouterr().out
    command = ["measure", f"{path}:make", "--strategy", "full", "--repeats", "0"]
    with pytest.warns(remat.RematWarning, match="kept the program's own checkpoints"):
        assert main(command) == 0
    assert "1 of the 1 scans" in capsys.readouterr().out
    assert main([*command, "--override"]) == 0
    assert "as written" not in capsys.readouterr().out
