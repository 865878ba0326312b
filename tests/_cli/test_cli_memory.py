"""``remat memory TARGET``: the table of the values live at the peak, and the picture."""

from __future__ import annotations

import textwrap

from remat._cli import _cli

TARGET = textwrap.dedent(
    """
    import jax, jax.numpy as jnp

    def make():
        def loss(ws, x):
            return jnp.sum(jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0] ** 2)
        return loss, (jnp.ones((4, 16, 16)) * 0.1, jnp.ones((32, 16)))
    """
)


def test_memory_prints_both_steps_and_writes_the_picture(capsys, tmp_path):
    target = tmp_path / "model.py"
    target.write_text(TARGET)
    png = tmp_path / "memory.png"
    code = _cli.main(["memory", f"{target}:make", "--strategy", "full", "--png", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "as written: peak" in out and "full: peak" in out
    assert "saved" in out and "args[0]" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_refuses_a_missing_plan_file(capsys, tmp_path):
    target = tmp_path / "model.py"
    target.write_text(TARGET)
    code = _cli.main(["memory", f"{target}:make", "--plan", str(tmp_path / "nope.json")])
    assert code == 2
    assert "nope.json" in capsys.readouterr().err
