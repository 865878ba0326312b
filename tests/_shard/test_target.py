"""`remat.Target`: naming TPU slices, placing arguments on them, and the error without libtpu.

Nothing here needs libtpu; the TPU compiler's own tests are in ``test_target_tpu.py``."""

import jax
import jax.numpy as jnp
import pytest

import remat
from remat._shard import _target
from remat._shard._target import _placed_spec, parse_target


@pytest.mark.parametrize(
    ("name", "chip", "topology", "chips"),
    [
        ("tpu:v5e:2x2", "v5e", (2, 2), 4),
        ("tpu:v5e-16", "v5e", (4, 4), 16),
        ("tpu:v5e-8", "v5e", (2, 4), 8),
        ("tpu:v5e-1", "v5e", (1, 1), 1),
        ("tpu:v5p-8", "v5p", (2, 2, 1), 4),  # v5p names count TensorCores, two per chip
        ("tpu:v5p-16", "v5p", (2, 2, 2), 8),
        ("tpu:v5p-128", "v5p", (4, 4, 4), 64),
        ("TPU:V6E:4x4", "v6e", (4, 4), 16),
        ("tpu:v5e:2x2:2slices", "v5e", (2, 2), 8),
    ],
)
def test_parse_target_names(name, chip, topology, chips):
    t = parse_target(name)
    assert (t.chip, t.topology, t.num_chips) == (chip, topology, chips)
    assert parse_target(t.name) == t  # the name reads back
    assert hash(t) == hash(parse_target(t.name))


def test_hbm_per_chip():
    assert parse_target("tpu:v5e:2x2").hbm_bytes == 16 * 2**30
    assert parse_target("tpu:v5p-8").hbm_bytes == 95 * 2**30


@pytest.mark.parametrize("name", ["v5e:2x2", "tpu:v9:2x2", "tpu:v5e-12", "tpu:v5p-3", "gpu:h100"])
def test_unknown_names_say_the_grammar(name):
    with pytest.raises(ValueError, match=r"`remat.measure` got target=.*tpu:v5e-16"):
        parse_target(name, "remat.measure")


def test_not_a_name():
    with pytest.raises(TypeError, match=r"pass a `remat.Target` or its name"):
        parse_target(4, "remat.plan")


def test_placement_rule_fsdp():
    P = jax.sharding.PartitionSpec
    # parameters: the largest dimension the devices divide (the first of equals)
    assert _placed_spec((16, 4096, 1024), 4, param=True) == P(None, "fsdp", None)
    assert _placed_spec((1024, 1024), 4, param=True) == P("fsdp", None)
    assert _placed_spec((6, 10), 4, param=True) == P()
    # data: the first (batch) dimension, or replicated
    assert _placed_spec((8, 2048), 4, param=False) == P("fsdp", None)
    assert _placed_spec((2, 2048), 4, param=False) == P()
    assert _placed_spec((), 4, param=True) == P()


def test_no_libtpu_says_how_to_install(monkeypatch):
    monkeypatch.setattr(_target, "libtpu_available", lambda: False)
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w))  # noqa: E731
    w, x = jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32)
    with pytest.raises(RuntimeError, match=r"libtpu is not installed.*pip install 'remat\[tpu\]'"):
        remat.measure(loss, w, x, target="tpu:v5e:2x2")
    with pytest.raises(RuntimeError, match=r"`remat.plan` got target='tpu:v5e:2x2'"):
        remat.plan(loss, w, x, budget="1MiB", target="tpu:v5e:2x2")


def test_a_target_is_not_timed():
    loss = lambda w: jnp.sum(w**2)  # noqa: E731
    with pytest.raises(ValueError, match=r"compiled for, never run here. Pass repeats=0"):
        remat.measure(loss, jnp.ones(3), target="tpu:v5e:2x2", repeats=3)


def test_chip_figures_for_pricing_and_the_compilers_limit():
    """What the planner reads from a TPU device: the chip's peak bf16 rate and host link
    (offloading's price), and the HBM the compiler gives a program (its refusals say 15.75G
    on a v5e, 95.74G on a v5p)."""
    import types

    v5e = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    v5p = types.SimpleNamespace(platform="tpu", device_kind="TPU v5")
    assert _target.offload_rates(v5e) == (197e12, 1.5e10)
    assert _target.offload_rates(v5p) == (459e12, 1.5e10)
    assert _target.usable_bytes(v5e) == 16128 * 2**20
    assert _target.usable_bytes(v5p) == int(95.74 * 2**30)
    cpu = jax.devices("cpu")[0]
    assert _target.offload_rates(cpu) is None and _target.usable_bytes(cpu) is None
    t = parse_target("tpu:v5e-4")
    assert (t.flops_per_second, t.host_bandwidth, t.usable_bytes) == (197e12, 1.5e10, 16128 * 2**20)
