"""``remat lint TARGET``: output, exit codes (0 clean, 1 findings, 2 usage) and JSON output."""

from __future__ import annotations

import json
import textwrap

import pytest

from remat._cli import _cli

pytest.importorskip(
    "remat._cli._target", reason="target loading (`remat._cli._target`) not merged yet"
)

TARGET = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    def layer(x):
        h = checkpoint_name(jnp.sin(x * 2.0), "hidden")
        return jnp.sin(jnp.sin(h))

    def make(name):
        policy = jax.checkpoint_policies.save_only_these_names(name)
        loss = lambda x: jnp.sum(jax.checkpoint(layer, policy=policy)(x))
        return loss, (jnp.ones(3),)

    def typo():
        return make("hiden")

    def clean():
        return make("hidden")

    def broken():
        raise RuntimeError("the factory failed")

    def with_aux():
        def loss(w):
            block = jax.checkpoint(lambda v: jnp.sin(v @ v) @ v,
                                   policy=jax.checkpoint_policies.nothing_saveable)
            return jnp.sum(block(w)), {"norm": jnp.sum(w ** 2)}
        return loss, (jnp.ones((8, 8)),)
    """
)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(TARGET)
    return path


def test_findings_exit_1_and_json(target, tmp_path, capsys):
    out = tmp_path / "out" / "findings.json"
    code = _cli.main(["lint", f"{target}:typo", "--no-measure", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 1
    assert "RM001" in stdout and "1 finding" in stdout
    data = json.loads(out.read_text())
    assert [f["code"] for f in data["findings"]] == ["RM001"]


def test_clean_exit_0_and_exit_zero_flag(target, capsys):
    assert _cli.main(["lint", f"{target}:clean", "--no-measure"]) == 0
    assert "no findings" in capsys.readouterr().out
    assert _cli.main(["lint", f"{target}:typo", "--no-measure", "--exit-zero"]) == 0


@pytest.mark.parametrize(
    ("suffix", "extra", "match"),
    [
        (":broken", [], "RuntimeError: the factory failed"),
        (":typo", ["--strategy", "bogus"], "not a known strategy"),
    ],
)
def test_usage_errors_exit_2_with_one_line(target, capsys, suffix, extra, match):
    code = _cli.main(["lint", f"{target}{suffix}", "--no-measure", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert match in err and err.count("\n") == 1


@pytest.mark.skipif(__import__("jax").default_backend() != "cpu", reason="CPU's CSE")
def test_has_aux_compiles_the_losss_gradient(target, capsys):
    """A loss returning (loss, aux): `--has-aux` compiles its gradient (RM005 on CPU)."""
    assert _cli.main(["lint", f"{target}:with_aux", "--has-aux"]) == 1
    assert "RM005" in capsys.readouterr().out
