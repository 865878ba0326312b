"""The sharded demo GPT's layout rules and the `remat demo --sharded` relaunch, on one device.

The 8-device runs are in test_sharded.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from remat._models._gpt_sharded import (
    demo_argv,
    fsdp_spec,
    make_mesh,
    make_sharded_gpt,
    rerun_with_devices,
)


@pytest.mark.parametrize(
    ("shape", "stacked", "spec"),
    [
        ((4, 16, 48), True, P(None, None, "fsdp")),  # largest dimension, never the layers
        ((4, 64, 16), True, P(None, "fsdp")),
        ((4, 16), True, P(None, "fsdp")),  # stacked LayerNorm scales
        ((256, 16), False, P("fsdp")),  # the embedding: its vocabulary
        ((16, 16), False, P(None, "fsdp")),  # a tie goes to the last dimension
        ((3, 5), False, P()),  # nothing divisible: replicated
    ],
)
def test_fsdp_spec_splits_the_largest_divisible_dimension(shape, stacked, spec):
    assert fsdp_spec(shape, 2, stacked=stacked) == spec


def test_make_mesh_says_how_to_get_more_cpu_devices():
    with pytest.raises(ValueError, match=r"xla_force_host_platform_device_count=8"):
        make_mesh((4, 2))


def test_make_sharded_gpt_places_tokens_over_data_and_weights_over_fsdp():
    mesh = make_mesh((1, 1))
    _, (params, tokens) = make_sharded_gpt(
        mesh, layers=1, d_model=8, seq=4, batch=2, heads=2, vocab=16
    )
    assert tokens.sharding.spec == P("data")
    assert params["blocks"]["qkv"]["kernel"].sharding.spec == P()  # fsdp axis of size 1


def test_demo_relaunch_repeats_the_command_line():
    args = argparse.Namespace(layers=2, d_model=16, repeats=1, out=Path("o"))
    assert demo_argv(args, {"layers": 8, "d_model": 128}) == [
        "demo", "--sharded", "--repeats", "1", "--out", "o", "--layers", "2", "--d-model", "16",
    ]  # fmt: skip
    assert rerun_with_devices(1, ["demo"]) is None  # enough devices: no subprocess


@pytest.mark.slow
def test_remat_demo_sharded_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "remat", "demo", "--sharded", "--layers", "2", "--d-model", "16",
         "--seq", "8", "--batch", "8", "--heads", "2", "--repeats", "0", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(per device, 8 devices)" in done.stdout
    assert (tmp_path / "report.json").exists()
