"""Bad input through the public API: a ValueError/TypeError that names the public function,
says what it got and how to fix it, raised from remat's own code, never from inside JAX."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._core._strategy import offload_available

_JAX_DIR = os.path.dirname(jax.__file__) + os.sep
WS = jnp.ones((2, 3, 3)) * 0.1
X = jnp.ones((2, 3))


def loss(ws, x):
    return jnp.sum(jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0])


def vector_loss(ws, x):
    return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]


def step(c, x):
    return c + x, x


# (call, exception type, public name, what it got, a word of the fix)
CASES = {
    # non-scalar loss
    "measure-non-scalar": (
        lambda: remat.measure(vector_loss, WS, X),
        ValueError,
        "remat.measure",
        "float32[2, 3]",
        "scalar",
    ),
    # non-array arguments
    "measure-str-arg": (
        lambda: remat.measure(loss, "weights", X),
        TypeError,
        "remat.measure",
        "str",
        "Close over",
    ),
    "measure-int-arg": (
        lambda: remat.measure(loss, jnp.ones((2, 3, 3), jnp.int32), X),
        TypeError,
        "remat.measure",
        "int32",
        "float",
    ),
    "lint-str-arg": (
        lambda: remat.lint(loss, "weights", X),
        TypeError,
        "remat.lint",
        "str",
        "functools.partial",
    ),
    "lint-not-callable": (
        lambda: remat.lint("loss", WS, X),
        TypeError,
        "remat.lint",
        "'loss'",
        "Pass the function",
    ),
    "apply-not-callable": (
        lambda: remat.apply(3, "full"),
        TypeError,
        "remat.apply",
        "fn=3",
        "pass the function",
    ),
    "scan-str-init": (
        lambda: remat.scan(step, {"c": "zero"}, jnp.ones(3)),
        TypeError,
        "remat.scan",
        "str at init['c']",
        "Close over",
    ),
    # snapshots < 1
    "binomial-zero": (lambda: remat.Binomial(0), ValueError, "remat.Binomial", "0", ">= 1"),
    "binomial-negative": (
        lambda: remat.Binomial(-2),
        ValueError,
        "remat.Binomial",
        "-2",
        ">= 1",
    ),
    "binomial-str": (lambda: remat.Binomial("4"), ValueError, "remat.Binomial", "'4'", ">= 1"),
    "nested-zero": (lambda: remat.Nested(0), ValueError, "remat.Nested", "0", ">= 1"),
    # unknown schedule or strategy names
    "scan-schedule": (
        lambda: remat.scan(step, 0.0, jnp.ones(3), schedule="binomial"),
        ValueError,
        "remat.scan",
        "'binomial'",
        "remat.Binomial",
    ),
    "strategy-schedule": (
        lambda: remat.Strategy("full", schedule="nested"),
        ValueError,
        "remat.Strategy",
        "'nested'",
        "remat.Nested",
    ),
    "scan-policy": (
        lambda: remat.scan(step, 0.0, jnp.ones(3), policy="dot"),
        ValueError,
        "remat.scan",
        "'dot'",
        "Valid strings",
    ),
    "apply-strategy": (
        lambda: remat.apply(loss, "recompute"),
        ValueError,
        "remat.apply",
        "'recompute'",
        "Valid strings",
    ),
    "measure-strategy": (
        lambda: remat.measure(loss, WS, X, strategy="names"),
        ValueError,
        "remat.measure",
        "'names'",
        "Valid strings",
    ),
    "lint-strategy": (
        lambda: remat.lint(loss, WS, X, strategy="dotz"),
        ValueError,
        "remat.lint",
        "'dotz'",
        "Valid strings",
    ),
    "strategy-empty-names": (
        lambda: remat.Strategy("names:"),
        ValueError,
        "remat.Strategy",
        "'names:'",
        "names:attn_out",
    ),
    "compare-non-scalar": (
        lambda: remat.compare(vector_loss, WS, X, strategies=["full"], repeats=0),
        ValueError,
        "remat.compare",
        "float32[2, 3]",
        "scalar",
    ),
    "compare-str-arg": (
        lambda: remat.compare(loss, "weights", X, strategies=["full"], repeats=0),
        TypeError,
        "remat.compare",
        "str",
        "Close over",
    ),
    # budgets: negative, zero, unparseable, above the device's memory
    "plan-negative-budget": (
        lambda: remat.plan(loss, WS, X, budget=-5),
        ValueError,
        "remat.plan",
        "budget=-5",
        "positive amount of memory",
    ),
    "plan-zero-budget": (
        lambda: remat.plan(loss, WS, X, budget="0%"),
        ValueError,
        "remat.plan",
        "budget='0%'",
        "positive amount of memory",
    ),
    "plan-unparseable-budget": (
        lambda: remat.plan(loss, WS, X, budget="half"),
        ValueError,
        "remat.plan",
        "budget='half'",
        "'512MiB'",
    ),
    "plan-budget-above-device": (
        lambda: remat.plan(loss, WS, X, budget="2GiB", device_memory=2**30),
        ValueError,
        "remat.plan",
        "budget='2GiB'",
        "budget='90%'",
    ),
    "plan-float-budget-over-one": (
        lambda: remat.plan(loss, WS, X, budget=1.5),
        ValueError,
        "remat.plan",
        "budget=1.5",
        "(0, 1], e.g. budget=0.5",
    ),
    "plan-non-scalar": (
        lambda: remat.plan(vector_loss, WS, X, budget="50%"),
        ValueError,
        "remat.plan",
        "float32[2, 3]",
        "scalar",
    ),
    "plan-str-arg": (
        lambda: remat.plan(loss, "weights", X, budget="50%"),
        TypeError,
        "remat.plan",
        "str",
        "array",
    ),
    # the mistakes of issue 14, in the words the user typed
    "measure-repeated-argnums": (
        lambda: remat.measure(loss, WS, X, argnums=(0, 0), repeats=0),
        ValueError,
        "remat.measure",
        "argnums=(0, 0)",
        "each position once",
    ),
    "strategy-float-scans": (
        lambda: remat.Strategy("full", scans=1.5),
        ValueError,
        "remat.Strategy",
        "scans=1.5",
        "scans=(0, 'decoder')",
    ),
    "nested-int-lengths": (
        lambda: remat.Nested(lengths=5),
        ValueError,
        "remat.Nested",
        "lengths=5",
        "lengths=(4, 8)",
    ),
    "plan-tiny-fraction": (
        lambda: remat.plan(loss, WS, X, budget=1e-9),
        ValueError,
        "remat.plan",
        "budget=1e-09",
        "[0.001, 1]",
    ),
    "plan-overflowing-budget": (
        lambda: remat.plan(loss, WS, X, budget="1e400"),
        ValueError,
        "remat.plan",
        "budget='1e400'",
        "'6GiB'",
    ),
    "plan-str-device-memory": (
        lambda: remat.plan(loss, WS, X, budget=0.5, device_memory="abc"),
        ValueError,
        "remat.plan",
        "device_memory='abc'",
        "16 * 2**30",
    ),
    "plan-str-schedules": (
        lambda: remat.plan(loss, WS, X, budget=0.5, schedules="yes"),
        ValueError,
        "remat.plan",
        "schedules='yes'",
        "True or False",
    ),
    "compare-unknown-baseline": (
        lambda: remat.compare(loss, WS, X, strategies=["full"], baseline="bogus", repeats=0),
        ValueError,
        "remat.compare",
        "baseline='bogus'",
        "baseline='none'",
    ),
    # found by giving every public argument a wrong type, range or unit
    "strategy-negative-scan": (
        lambda: remat.Strategy("full", scans=(-1,)),
        ValueError,
        "remat.Strategy",
        "scans=(-1,)",
        "ints >= 0",
    ),
    "plan-budget-in-the-wrong-unit": (
        lambda: remat.plan(loss, WS, X, budget=5),
        ValueError,
        "remat.plan",
        "budget=5",
        "'5GiB'",
    ),
    "plan-percent-as-bytes": (
        lambda: remat.plan(loss, WS, X, budget=50),
        ValueError,
        "remat.plan",
        "budget=50",
        "'50%'",
    ),
    "plan-tiny-percent": (
        lambda: remat.plan(loss, WS, X, budget="0.00001%"),
        ValueError,
        "remat.plan",
        "budget='0.00001%'",
        "'50%'",
    ),
    "plan-device-memory-in-gib": (
        lambda: remat.plan(loss, WS, X, budget=0.5, device_memory=16),
        ValueError,
        "remat.plan",
        "device_memory=16",
        "16 * 2**30",
    ),
    "plan-float-device-memory": (
        lambda: remat.plan(loss, WS, X, budget=0.5, device_memory=1.5e10),
        ValueError,
        "remat.plan",
        "device_memory=15000000000.0",
        "int number of bytes",
    ),
    "plan-str-host-bandwidth": (
        lambda: remat.plan(loss, WS, X, budget=0.5, host_bandwidth="fast"),
        ValueError,
        "remat.plan",
        "host_bandwidth='fast'",
        "25e9",
    ),
    "plan-host-bandwidth-in-gb": (
        lambda: remat.plan(loss, WS, X, budget=0.5, host_bandwidth=25),
        ValueError,
        "remat.plan",
        "host_bandwidth=25",
        "host_bandwidth=25e9",
    ),
    "plan-str-offload": (
        lambda: remat.plan(loss, WS, X, budget=0.5, offload="yes"),
        ValueError,
        "remat.plan",
        "offload='yes'",
        "True or False",
    ),
    "plan-str-max-rounds": (
        lambda: remat.plan(loss, WS, X, budget=0.5, max_rounds="4"),
        ValueError,
        "remat.plan",
        "max_rounds='4'",
        "int >= 1",
    ),
    "plan-repeated-argnums": (
        lambda: remat.plan(loss, WS, X, budget=0.5, argnums=(1, 1)),
        ValueError,
        "remat.plan",
        "argnums=(1, 1)",
        "argnums=1",
    ),
    "plan-none-budget": (
        lambda: remat.plan(loss, WS, X, budget=None),
        ValueError,
        "remat.plan",
        "budget=None",
        "'512MiB'",
    ),
    "plan-budgets-as-one-string": (
        lambda: remat.plan_budgets(loss, WS, X, budgets="50%"),
        ValueError,
        "remat.plan_budgets",
        "budgets='50%'",
        "budgets=['75%', '50%', '2GiB']",
    ),
    "plan-budgets-bad-entry": (
        lambda: remat.plan_budgets(loss, WS, X, budgets=["50%", "lots"]),
        ValueError,
        "remat.plan_budgets",
        "budget='lots'",
        "'512MiB'",
    ),
    "plan-budgets-str-schedules": (
        lambda: remat.plan_budgets(loss, WS, X, budgets=["50%"], schedules="no"),
        ValueError,
        "remat.plan_budgets",
        "schedules='no'",
        "True or False",
    ),
    "compare-negative-repeats": (
        lambda: remat.compare(loss, WS, X, strategies=["full"], repeats=-1),
        ValueError,
        "remat.compare",
        "repeats=-1",
        "int >= 0",
    ),
    "compare-float-repeats": (
        lambda: remat.compare(loss, WS, X, strategies=["full"], repeats=2.5),
        ValueError,
        "remat.compare",
        "repeats=2.5",
        "int >= 0",
    ),
    "compare-title-not-str": (
        lambda: remat.compare(loss, WS, X, strategies=["full"], repeats=0, title=3),
        ValueError,
        "remat.compare",
        "title=3",
        "string",
    ),
    "compare-str-progress": (
        lambda: remat.compare(loss, WS, X, strategies=["full"], repeats=0, progress="no"),
        ValueError,
        "remat.compare",
        "progress='no'",
        "True or False",
    ),
    "lint-str-measure": (
        lambda: remat.lint(loss, WS, X, measure="yes"),
        ValueError,
        "remat.lint",
        "measure='yes'",
        "True",
    ),
    "load-plan-not-callable": (
        lambda: remat.load_plan("plan.json", "loss", WS, X),
        TypeError,
        "remat.load_plan",
        "fn='loss'",
        "remat.load_plan(path, loss, *args)",
    ),
    "load-plan-directory": (
        lambda: remat.load_plan(os.path.dirname(__file__), loss, WS, X),
        ValueError,
        "remat.load_plan",
        os.path.dirname(__file__),
        "Plan.to_json",
    ),
    "report-from-json-directory": (
        lambda: remat.Report.from_json(os.path.dirname(__file__)),
        ValueError,
        "remat.Report.from_json",
        os.path.dirname(__file__),
        "cannot read it",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_names_function_input_and_fix(case):
    call, kind, public, got, fix = CASES[case]
    with pytest.raises(kind) as info:
        call()
    # Notes (PEP 678) print with the error: `remat.scan` keeps `lax.scan`'s own message
    # whole, as code that matches it expects, and adds its advice as a note.
    message = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert f"`{public}`" in message
    assert got in message
    assert re.search(re.escape(fix), message, re.IGNORECASE)
    # Raised by remat itself: the innermost frame is not JAX's.
    assert not str(info.traceback[-1].path).startswith(_JAX_DIR)


# --- output files are written atomically ---


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from pathlib import Path

    from remat._core._io import atomic_write_text

    target = tmp_path / "out" / "report.json"
    real_write = Path.write_text

    def half_then_fail(self, text, *args, **kwargs):
        real_write(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of writing

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, '{"a": 1, "b": 2}')
    assert list(target.parent.iterdir()) == []  # neither the file nor a temporary one

    monkeypatch.setattr(Path, "write_text", real_write)
    atomic_write_text(target, "old")
    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new contents")
    assert target.read_text() == "old"  # the previous complete file survives
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_atomic_write_gives_the_mode_of_an_ordinary_write(tmp_path):
    from remat._core._io import atomic_write_text

    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open(path, "w") gives under this process's umask
    new = atomic_write_text(tmp_path / "new.txt", "x")
    assert new.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkstemp's 0600
    os.chmod(new, 0o640)
    atomic_write_text(new, "y")  # replacing a file keeps its mode
    assert new.stat().st_mode & 0o777 == 0o640


@pytest.mark.skipif(offload_available(), reason="needs a device without host memory")
@pytest.mark.parametrize("public", ["measure", "compare", "lint"])
def test_offload_strategy_without_host_memory_names_the_function_called(public):
    args = (WS, X)
    call = {
        "measure": lambda: remat.measure(loss, *args, strategy="offload:a", repeats=0),
        "compare": lambda: remat.compare(loss, *args, strategies=["offload:a"], repeats=0),
        "lint": lambda: remat.lint(loss, *args, strategy=remat.Strategy("offload:a")),
    }[public]
    with pytest.raises(ValueError, match=rf"^`remat.{public}` got strategy 'offload:a'.*names:a"):
        call()


def test_unparseable_budget_names_no_internal_placeholder():
    with pytest.raises(ValueError) as info:
        remat.plan(loss, WS, X, budget="lots")
    message = str(info.value)
    assert "`remat.plan`" in message and "budget='lots'" in message
    assert "2**62" not in message and str(2**62) not in message and "0 bytes" not in message


@pytest.mark.parametrize("spelled", ["0.5", " 0.5 ", "5e-1"])
def test_a_unitless_string_fraction_is_that_fraction_of_the_peak(spelled):
    from remat._core._budget import read_budget

    budget = read_budget(spelled, sensible=True)
    assert budget.fraction == 0.5 and budget.bytes is None
    assert budget.to_bytes(baseline_peak=1000) == 500


@pytest.mark.parametrize(
    ("content", "why"), [(b"\xff\xfe\x00garbage", "UTF-8"), (b"{not json", "invalid JSON")]
)
def test_report_from_json_names_the_file_it_cannot_read(tmp_path, content, why):
    path = tmp_path / "report.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        remat.Report.from_json(path)
    message = str(info.value)
    assert "`remat.Report.from_json`" in message and str(path) in message and why in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


class _Picky(TypeError):
    """An error class that is not made from a message alone (as JAX's tracer errors)."""

    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


def test_renamed_keeps_the_class_only_when_it_carries_the_message():
    from remat._core._errors import renamed

    kept = renamed(ValueError("`remat.measure` got 3"), "`remat.measure`", "`remat.plan`")
    assert type(kept) is ValueError and str(kept) == "`remat.plan` got 3"
    assert kept.__cause__ is None
    picky = _Picky("`remat.measure` got 3", "x")
    wrapped = renamed(picky, "`remat.measure`", "`remat.plan`")
    assert type(wrapped) is TypeError and str(wrapped) == "`remat.plan` got 3 at x"
    assert wrapped.__cause__ is picky  # the original attached
    other = ValueError("the user's own error")
    assert renamed(other, "`remat.measure`", "`remat.plan`") is other  # raised as it is


def test_a_traced_bool_in_an_equinox_module_raises_jaxs_error_not_an_internal_one():
    """An Equinox module whose flag is a bool *array* (traced, as under `eqx.filter_jit`)
    and a loss that branches on it: JAX's `TracerBoolConversionError`, from every entry
    point that checks the loss first (rebuilding it from its message used to fail inside
    remat with an AttributeError)."""
    eqx = pytest.importorskip("equinox")

    class Flagged(eqx.Module):
        w: jax.Array
        train: jax.Array

    def flagged_loss(model, x):
        return jnp.sum(model.w * x) if model.train else jnp.sum(x)

    model = Flagged(jnp.ones(3), jnp.array(True))
    for call in (
        lambda: remat.plan(flagged_loss, model, jnp.ones(3), budget="50%", verbose=False),
        lambda: remat.compare(flagged_loss, model, jnp.ones(3), strategies=["full"]),
        lambda: remat.plan_budgets(
            flagged_loss, model, jnp.ones(3), budgets=["50%"], verbose=False
        ),
        lambda: remat.measure(flagged_loss, model, jnp.ones(3), repeats=0),
    ):
        with pytest.raises(jax.errors.TracerBoolConversionError, match=r"model\.train"):
            call()
