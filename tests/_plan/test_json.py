"""`remat.load_plan` reads only what `Plan.to_json` wrote: every edit, missing field, wrong
type or range is a ValueError that names the field and the file (never a KeyError from
inside), and plan files of format 1 (no checksum) still load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import remat

DATA = Path(__file__).parent.parent / "data"
FIXTURE = DATA / "plan_v1_binomial.json"


def loss(ws, x):
    """The function the plan files in tests/data were made for (with `ARGS`)."""
    x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
    return (x**2).sum()


ARGS = (jnp.ones((64, 8, 8)) * 0.1, jnp.ones((64, 8)))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A plan file of the current format, as `Plan.to_json` writes it."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    remat.load_plan(FIXTURE, loss, *ARGS).to_json(path)
    return json.loads(path.read_text())


def _pop(key):
    def edit(d):
        del d[key]

    return edit


# edit -> the field the refusal must name. Edits of values that keep their type are caught
# by the checksum (format 2); wrong types, ranges and missing fields by the field checks.
EDITS = {
    "save-list-shortened": (lambda d: d["scans"][0]["saved"].pop(), "scans[0].saved"),
    "saved-value-renamed": (
        lambda d: d["scans"][0]["saved"][1].update(name="remat_s0_e9"),
        "scans[0].saved",
    ),
    "names-edited": (lambda d: d["scans"][0].update(names=[]), "scans[0].names"),
    "scans-emptied": (lambda d: d.update(scans=[]), "scans"),
    "schedule-changed": (
        lambda d: d["scans"][0].update(schedule={"binomial": 4}),
        "scans[0].schedule",
    ),
    "schedule-to-per-step": (
        lambda d: d["scans"][0].update(schedule="per_step"),
        "scans[0].schedule",
    ),
    "budget-changed": (lambda d: d.update(budget_bytes=d["budget_bytes"] * 2), "budget_bytes"),
    "measured-peak-changed": (lambda d: d["measured"].update(peak_bytes=1), "measured.peak_bytes"),
    "field-removed": (_pop("rounds"), "rounds"),
    "scan-field-removed": (lambda d: d["scans"][0].pop("length"), "scans[0].length"),
    "measured-field-removed": (lambda d: d["measured"].pop("flops"), "measured.flops"),
    "budget-mistyped": (lambda d: d.update(budget_bytes="65205"), "budget_bytes"),
    "budget-negative": (lambda d: d.update(budget_bytes=-5), "budget_bytes"),
    "length-zero": (lambda d: d["scans"][0].update(length=0), "scans[0].length"),
    "saved-bytes-mistyped": (
        lambda d: d["scans"][0]["saved"][0].update(bytes=None),
        "scans[0].saved[0].bytes",
    ),
    "shape-mistyped": (
        lambda d: d["scans"][0]["saved"][0].update(shape="64x8"),
        "scans[0].saved[0].shape",
    ),
    "schedule-mistyped": (
        lambda d: d["scans"][0].update(schedule={"binomial": "8"}),
        "scans[0].schedule",
    ),
    "schedule-unknown": (lambda d: d["scans"][0].update(schedule="revolve"), "scans[0].schedule"),
    "scans-not-a-list": (lambda d: d.update(scans={"0": {}}), "scans"),
    "scan-not-an-object": (lambda d: d.update(scans=[3]), "scans[0]"),
    "position-repeated": (
        lambda d: d["scans"].append(json.loads(json.dumps(d["scans"][0]))),
        "scans[1].position",
    ),
    "measured-mistyped": (lambda d: d["measured"].update(residuals={}), "measured.residuals"),
    "flops-infinite": (lambda d: d.update(baseline_flops=float("inf")), "baseline_flops"),
    "fingerprint-mistyped": (lambda d: d.update(fingerprint=12), "fingerprint"),
    "argnums-mistyped": (lambda d: d.update(argnums="0"), "argnums"),
    "unknown-field": (lambda d: d.update(extra=1), "extra"),
    "format-unknown": (lambda d: d.update(format=3), "format"),
    "format-removed": (_pop("format"), "format"),
}
# Edits that keep every field's type and range: only the checksum of format 2 sees them.
CHECKSUM_ONLY = {
    "save-list-shortened",
    "saved-value-renamed",
    "names-edited",
    "schedule-changed",
    "schedule-to-per-step",
    "budget-changed",
    "measured-peak-changed",
}


def _refusal(tmp_path, data, edit):
    path = tmp_path / "edited.json"
    edit(data)
    path.write_text(json.dumps(data, indent=1, allow_nan=True))
    with pytest.raises(ValueError) as info:
        remat.load_plan(path, loss, *ARGS)
    return path, str(info.value)


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_plan_file_is_refused_naming_the_field_and_the_file(tmp_path, written, name):
    edit, field = EDITS[name]
    path, message = _refusal(tmp_path, json.loads(json.dumps(written)), edit)
    assert message.startswith("`remat.load_plan`")
    assert f"'{field}'" in message, message
    assert str(path) in message


@pytest.mark.parametrize("name", sorted(set(EDITS) - CHECKSUM_ONLY))
def test_format_1_files_are_checked_field_by_field(tmp_path, name):
    edit, field = EDITS[name]
    path, message = _refusal(tmp_path, json.loads(FIXTURE.read_text()), edit)
    assert f"'{field}'" in message, message
    assert str(path) in message


@pytest.mark.parametrize(
    ("name", "why"),
    [("checksum-removed", "'checksum'"), ("checksum-edited", "'checksum'")],
)
def test_the_checksum_itself_is_checked(tmp_path, written, name, why):
    def edit(d):
        if name == "checksum-removed":
            del d["checksum"]
        else:
            d["checksum"]["body"] = "0" * 64

    path, message = _refusal(tmp_path, json.loads(json.dumps(written)), edit)
    assert why in message and str(path) in message


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00", "UTF-8"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON list"),
        (b"", "not JSON"),
    ],
)
def test_a_file_that_is_not_a_plan_is_refused_naming_the_file(tmp_path, content, why):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        remat.load_plan(path, loss, *ARGS)
    assert why in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_is_a_value_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read .*nothere\.json"):
        remat.load_plan(tmp_path / "nothere.json", loss, *ARGS)


def test_an_unedited_file_loads_and_carries_a_checksum(tmp_path, written):
    assert written["format"] == 2 and len(written["checksum"]["body"]) == 64
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(written, indent=3))  # whitespace is not content
    p = remat.load_plan(path, loss, *ARGS)
    assert p.scans[0].schedule == remat.Binomial(8)
    assert bool(jnp.allclose(p.fn(*ARGS), loss(*ARGS)))


def test_a_file_records_the_jax_that_made_the_plan(tmp_path, written):
    assert written["jax_version"] == ""  # the fixture's file is older than the field
    path = remat.plan(loss, *ARGS, budget=1.0, verbose=False).to_json(tmp_path / "p.json")
    assert json.loads(path.read_text())["jax_version"] == jax.__version__


def test_a_plan_from_another_jax_is_refused_naming_both_versions(tmp_path):
    """JAX versions trace the same function to different programs (JAX 0.11 writes a scan's
    inputs as one ``ft_in`` parameter): the refusal says so instead of "the model changed"."""
    path = tmp_path / "plan.json"

    def other(ws, x):  # a program whose fingerprint differs, as another JAX's trace would
        return loss(ws, x) * 2.0

    made_there = dataclasses.replace(remat.load_plan(FIXTURE, loss, *ARGS), jax_version="0.9.0")
    made_there.to_json(path)
    assert remat.load_plan(path, loss, *ARGS).jax_version == "0.9.0"
    with pytest.raises(ValueError, match=r"load_plan.*made with JAX 0\.9\.0, and this is JAX \d"):
        remat.load_plan(path, other, *ARGS)
    with pytest.raises(ValueError, match=r"apply.*made with JAX 0\.9\.0, and this is JAX \d"):
        remat.apply(other, str(path))(*ARGS)
    with pytest.raises(ValueError, match="different program"):  # the same JAX: the model
        remat.load_plan(FIXTURE, other, *ARGS)
