"""Checkpoints that recompute but do not lower the peak are reported, with both figures.

The model is the common case: `nn.remat` around each block of a linen model whose blocks run in
a Python loop. On the CPU backend the recomputation survives (more FLOPs) while the compiled
peak stays within 2% of the un-checkpointed one.
"""

from __future__ import annotations

import textwrap
import warnings

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._cli import main
from remat._report._report import Machine

MODEL = """
import flax.linen as nn
import jax
import jax.numpy as jnp


class Block(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(self.hidden)(nn.LayerNorm()(x)))
        return x + nn.Dense(x.shape[-1])(h)


class Model(nn.Module):
    checkpointed: bool

    @nn.compact
    def __call__(self, x):
        block = nn.remat(Block) if self.checkpointed else Block
        for _ in range(8):
            x = block(512)(x)
        return x


def make(checkpointed=True):
    model = Model(checkpointed)
    x = jnp.ones((32, 128))
    params = model.init(jax.random.key(0), x)

    def loss(params, x):
        return jnp.mean(model.apply(params, x) ** 2)

    return loss, (params, x)


def make_plain():
    return make(False)
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "unrolled_model.py"
    path.write_text(textwrap.dedent(MODEL))
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return path, namespace


def _measure_quietly(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        return remat.measure(fn, *args, repeats=0)


def test_measure_warns_with_both_figures(model):
    _, ns = model
    loss, args = ns["make"]()
    with pytest.warns(remat.RematWarning, match=r"not 2% below the [0-9.]+ MiB") as record:
        m = remat.measure(loss, *args, repeats=0)
    plain = _measure_quietly(*ns["make_plain"]())
    assert m.recompute_requested and not m.recompute_eliminated
    assert m.flops > plain.flops  # the recomputation survived compilation ...
    assert m.plain_peak_bytes == plain.peak_bytes
    assert m.peak_bytes > 0.98 * plain.peak_bytes  # ... and the peak did not fall
    assert m.saves_nothing
    message = str(record[0].message)
    assert f"{m.peak_bytes / 2**20:.2f} MiB" in message
    assert f"{plain.peak_bytes / 2**20:.2f} MiB" in message


def test_a_checkpoint_that_saves_memory_is_not_reported():
    ws, x = jnp.full((8, 32, 32), 0.1), jnp.ones((1024, 32))

    def loss(ws, x):
        body = jax.checkpoint(lambda h, w: (jnp.tanh(jnp.tanh(h @ w) @ w), None))
        h, _ = jax.lax.scan(body, x, ws)
        return jnp.sum(h**2)

    with warnings.catch_warnings():
        warnings.simplefilter("error", remat.RematWarning)
        m = remat.measure(loss, ws, x, repeats=0)
    assert m.recompute_requested and not m.saves_nothing
    assert m.peak_bytes < m.plain_peak_bytes


def test_report_marks_the_row_and_gives_both_figures(model):
    _, ns = model
    plain = _measure_quietly(*ns["make_plain"]())
    checkpointed = _measure_quietly(*ns["make"]())
    report = remat.Report(
        rows=(("as written", plain), ("nn.remat per layer", checkpointed)),
        baseline="as written",
        machine=Machine("cpu", "cpu", 1, jax.__version__),
    )
    assert report.saves_nothing() == ("nn.remat per layer",)
    text = report.render(width=200)
    assert "nn.remat per layer ~" in text
    assert f"{checkpointed.peak_bytes / 2**20:.2f} MiB" in text
    assert f"{plain.peak_bytes / 2**20:.2f} MiB" in text
    assert "no memory saved" in report.markdown()


def test_cli_measure_says_so(model, capsys):
    path, _ = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        assert main(["measure", f"{path}:make", "--repeats", "0"]) == 0
    out = capsys.readouterr().out
    assert "no memory saved" in out


def test_lint_reports_rm009_with_both_figures(model):
    _, ns = model
    loss, args = ns["make"]()
    findings = remat.lint(loss, *args)
    codes = [f.code for f in findings]
    assert "RM009" in codes
    f = next(f for f in findings if f.code == "RM009")
    assert "MiB against" in f.message and "unrolled_model.py" in (f.source or "")


def test_a_checkpointed_scan_that_saves_nothing_is_not_said_to_be_outside_a_loop():
    # Four narrow layers in a scan beside a 2 MiB head and its 2 MiB output: the layers'
    # activations (4 KiB each) are nothing next to the rest at the peak.
    def loss(params, x):
        body = jax.checkpoint(lambda h, w: (jnp.tanh(jnp.tanh(h @ w) @ w), None))
        h, _ = jax.lax.scan(body, x, params["layers"])
        return jnp.sum((h @ params["head"]) ** 2)

    params = {"layers": jnp.full((4, 32, 32), 0.1), "head": jnp.full((32, 16384), 0.01)}
    with pytest.warns(remat.RematWarning, match="not 2% below") as record:
        m = remat.measure(loss, params, jnp.ones((32, 32)), repeats=0)
    assert m.saves_nothing
    message = " ".join(str(r.message) for r in record)
    assert "inside a loop" in message and "Outside a loop" not in message
