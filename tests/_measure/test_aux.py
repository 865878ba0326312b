"""``has_aux=True`` through `remat.apply`, `remat.measure`, `remat.compare`, `remat.plan` and the
CLI, with the meaning it has in `jax.value_and_grad`: the loss returns ``(loss, aux)``."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import pytest

import remat
from conftest import assert_tree_allclose

L, B, D = 4, 8, 16


def loss_with_metrics(ws, x):
    def layer(h, w):
        h = jnp.tanh(h @ w)
        return h, jnp.mean(h)

    h, means = jax.lax.scan(layer, x, ws)
    loss = jnp.mean(h**2)
    return loss, {"means": means, "max": jnp.max(h)}


@functools.cache
def weights(layers=L, batch=B, width=D):
    kw, kx = jax.random.split(jax.random.key(2))
    return (
        jax.random.normal(kw, (layers, width, width)) / width**0.5,
        jax.random.normal(kx, (batch, width)),
    )


def test_apply_passes_aux_through():
    ws, x = weights()
    want = jax.value_and_grad(loss_with_metrics, has_aux=True)(ws, x)
    for strategy in ("full", remat.Strategy(schedule=remat.Binomial(2))):
        fn = remat.apply(loss_with_metrics, strategy, has_aux=True)
        assert_tree_allclose(jax.value_and_grad(fn, has_aux=True)(ws, x), want)
    decorated = remat.apply(strategy="dots", has_aux=True)(loss_with_metrics)
    assert_tree_allclose(decorated(ws, x), loss_with_metrics(ws, x))


def test_measure_and_compare_with_aux():
    ws, x = weights()
    m = remat.measure(loss_with_metrics, ws, x, strategy="full", has_aux=True, repeats=1)
    plain = remat.measure(loss_with_metrics, ws, x, has_aux=True, repeats=0)
    assert m.flops > plain.flops and m.residual_bytes < plain.residual_bytes
    # the aux is an output of the measured step: more output bytes than the loss alone
    alone = remat.measure(lambda ws, x: loss_with_metrics(ws, x)[0], ws, x, repeats=0)
    assert plain.output_bytes > alone.output_bytes
    report = remat.compare(
        loss_with_metrics, ws, x, strategies=["full"], has_aux=True, repeats=0, progress=False
    )
    assert report.labels == ("none", "full")


def test_aux_errors_name_the_function():
    ws, x = weights()
    with pytest.raises(ValueError, match=r"`remat\.measure` got has_aux=True.*pair"):
        remat.measure(lambda ws, x: loss_with_metrics(ws, x)[0], ws, x, has_aux=True)
    with pytest.raises(ValueError, match=r"`remat\.measure`.*scalar.*pass has_aux=True"):
        remat.measure(loss_with_metrics, ws, x)
    with pytest.raises(ValueError, match=r"scalar-valued") as err:  # a pair, but not (loss, aux)
        remat.measure(lambda ws, x: (ws, loss_with_metrics(ws, x)[0]), ws, x)
    assert "has_aux" not in str(err.value)
    with pytest.raises(ValueError, match=r"`remat\.compare` got has_aux=True"):
        remat.compare(lambda ws, x: jnp.sum(ws), ws, x, strategies=["full"], has_aux=True)
    with pytest.raises(TypeError, match=r"`remat\.apply` got has_aux"):
        remat.apply(loss_with_metrics, "full", has_aux="yes")


def test_plan_with_aux():
    ws, x = weights(8, 64, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematWarning)
        plan = remat.plan(loss_with_metrics, ws, x, budget=0.8, has_aux=True, schedules=False)
    assert plan.has_aux and plan.measured_peak_bytes <= plan.budget_bytes
    assert_tree_allclose(
        jax.value_and_grad(plan.fn, has_aux=True)(ws, x),
        jax.value_and_grad(loss_with_metrics, has_aux=True)(ws, x),
    )
    assert plan.to_dict()["has_aux"] is True


def test_cli_has_aux(tmp_path, capsys):
    from remat._cli._cli import main

    path = tmp_path / "model.py"
    path.write_text(
        "import jax, jax.numpy as jnp\n"
        "def loss(ws, x):\n"
        "    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)\n"
        "    return jnp.mean(h ** 2), {'max': jnp.max(h)}\n"
        "def make():\n"
        "    return loss, (jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8)))\n"
    )
    assert main(["measure", f"{path}:make", "--has-aux", "--repeats", "0"]) == 0
    assert "peak memory" in capsys.readouterr().out


def test_a_large_aux_is_one_line_and_the_cli_names_its_flag(tmp_path, capsys):
    """A pair whose aux is a model's batch statistics: the message counts the aux's arrays
    rather than quoting every shape, and names `--has-aux` for the command line."""
    from remat._cli._cli import main

    def loss(ws, x):
        stats = {f"layer_{i}": {"mean": x[0] * i, "var": x[1] * i} for i in range(40)}
        return jnp.sum(ws) * jnp.sum(x), stats

    ws, x = weights()
    with pytest.raises(ValueError, match=r"fn returned \(float32\[\], an aux of 80 arrays\)"):
        remat.measure(loss, ws, x)
    path = tmp_path / "model.py"
    path.write_text(
        "import jax.numpy as jnp\n"
        "def loss(w, x):\n"
        "    return jnp.sum(w * x), {f'b{i}': x * i for i in range(40)}\n"
        "def make():\n"
        "    return loss, (jnp.ones(4), jnp.ones(4))\n"
    )
    assert main(["plan", f"{path}:make", "--budget", "50%"]) == 2
    err = capsys.readouterr().err
    assert "an aux of 40 arrays" in err and "--has-aux" in err and len(err) < 500, err


def test_a_flag_made_a_shape_by_eval_shape_is_named_in_the_tracing_error():
    """`jax.eval_shape` turns a model's Python bool flag into a `bool[]` shape; the loss then
    fails as JAX traces it, and the error says which leaves and how to keep the flag."""

    def loss(model, x):
        return jnp.sum(x if model["inference"] else 2 * x)

    model = jax.eval_shape(lambda: {"inference": False})
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        remat.measure(loss, model, jnp.ones(3), argnums=1, repeats=0)
    assert "1 `bool[]` shape(s)" in "".join(getattr(info.value, "__notes__", []))
    assert "eqx.filter_eval_shape" in "".join(info.value.__notes__)
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:  # a bool array: no note
        remat.measure(loss, {"inference": jnp.array(False)}, jnp.ones(3), argnums=1, repeats=0)
    assert "eqx.filter_eval_shape" not in "".join(getattr(info.value, "__notes__", []))


def test_a_python_bool_argument_is_named_in_the_tracing_error():
    """A Python bool among the arguments (a `train` flag) is traced like every leaf, and the
    loss fails as JAX traces it; the error names the argument and how to close over it."""

    def loss(params, x, train):
        return jnp.sum(params * x) if train else jnp.sum(params)

    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        remat.plan(loss, jnp.ones(3), jnp.ones(3), True, budget=0.5, verbose=False)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "args[2] is a Python bool" in notes and "functools.partial(loss, train=True)" in notes
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:  # a bool array: no note
        remat.measure(loss, jnp.ones(3), jnp.ones(3), jnp.array(True), repeats=0)
    assert "Python bool" not in "".join(getattr(info.value, "__notes__", []))


def test_a_value_passed_as_the_function_is_quoted_short():
    """Parameters passed where the loss belongs are named by type with the start of their
    repr, not every weight."""
    params = {"w": jnp.arange(4096.0).reshape(64, 64)}
    for call in (lambda: remat.apply(params, "full"), lambda: remat.measure(params, params)):
        with pytest.raises(TypeError, match="not callable") as info:
            call()
        assert "got fn=a dict: {'w': Array(" in str(info.value) and len(str(info.value)) < 200
