"""`remat.measure`: residuals, memory, FLOPs and eliminated recomputation, by hand."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import remat
from conftest import assert_tree_allclose
from remat._measure._measure import measure_compiled
from remat._measure._residuals import saved_residuals
from remat._trace._checkpoints import recompute_requested, strip_checkpoints

L, B, D = 5, 4, 8
F32, LAYER = 4, 2 * B * D * D
FULL = jax.checkpoint_policies.nothing_saveable


def relu_body(y, w):
    return jax.nn.relu(y @ w), None


def relu_layers(ws, x):
    y, _ = lax.scan(relu_body, x, ws)
    return jnp.sum(y)


def relu_layers_full(ws, x):  # hand-checkpointed twin: recompute each step's matmul
    y, _ = lax.scan(jax.checkpoint(relu_body, policy=FULL), x, ws)
    return jnp.sum(y)


def unrolled_full(ws, x):  # the same layers as a Python loop under one checkpoint
    def layers(ws, x):
        for i in range(L):
            x = jax.nn.relu(x @ ws[i])
        return x

    return jnp.sum(jax.checkpoint(layers, policy=FULL)(ws, x))


@pytest.fixture(scope="module")
def args():
    return jnp.full((L, D, D), 0.1), jnp.linspace(-1.0, 1.0, B * D).reshape(B, D)


@pytest.fixture(scope="module")
def plain(args):
    return remat.measure(relu_layers, *args, repeats=2)


@pytest.fixture(scope="module")
def full(args):
    return remat.measure(relu_layers_full, *args, repeats=0)


def kept(m):
    return sorted((r.primitive, r.shape, r.dtype, r.multiplicity) for r in m.residuals)


def test_plain_scan_residuals_by_hand(plain):
    # Per step, relu(y @ w) keeps y (the carry, for dW = y^T g) and relu's mask y @ w > 0
    # (bool); the stacked weights are kept as the argument they are; relu's JVP also keeps
    # one zeros array for `select`, outside the loop.
    assert kept(plain) == [
        ("argument", (L, D, D), "float32", 1),
        ("broadcast_in_dim", (B, D), "float32", 1),
        ("gt", (B, D), "bool", L),
        ("max", (B, D), "float32", L),
    ]
    assert plain.residual_bytes == L * D * D * F32 + B * D * F32 + L * B * D * (F32 + 1)
    assert plain.residual_bytes == sum(r.bytes * r.multiplicity for r in plain.residuals)


def test_full_checkpoint_keeps_only_the_carry_per_step(full, plain):
    assert kept(full) == [("argument", (L, D, D), "float32", 1), ("max", (B, D), "float32", L)]
    assert full.residual_bytes == L * D * D * F32 + L * B * D * F32 < plain.residual_bytes


def test_strategy_full_via_apply_matches_hand_checkpoint(args, full):
    m = remat.measure(relu_layers, *args, strategy="full", repeats=0)
    assert m.strategy == "full"
    assert kept(m) == kept(full) and m.residual_bytes == full.residual_bytes
    assert (m.flops, m.forward_flops) == (full.flops, full.forward_flops)
    assert m.recompute_requested and not m.recompute_eliminated
    assert m.plain_flops == 3 * L * LAYER  # the plain twin of a strategy is `fn` itself


def test_residual_sources_and_names_point_at_user_code():
    def named(ws, x):
        def body(y, w):
            h = checkpoint_name(y @ w, "h")
            return jnp.sin(h), None

        return jnp.sum(lax.scan(body, x, ws)[0])

    line = inspect.getsourcelines(named)[1] + 2  # the `h = checkpoint_name(...)` line
    policy = jax.checkpoint_policies.save_only_these_names("h")
    m = remat.measure(named, jnp.ones((3, D, D)), jnp.ones((B, D)), strategy=policy, repeats=0)
    (h,) = [r for r in m.residuals if r.name == "h"]
    assert (h.primitive, h.shape, h.multiplicity) == ("dot_general", (B, D), 3)
    assert h.source.endswith(f"test_measure.py:{line}")


def test_nested_scan_multiplicities_multiply():
    outer, inner = 2, 3

    def nested(ws, x):
        def block(y, w_block):
            return lax.scan(lambda z, w: (jnp.sin(z @ w), None), y, w_block)[0], None

        return jnp.sum(lax.scan(block, x, ws)[0])

    res = saved_residuals(nested, jnp.ones((outer, inner, D, D)), jnp.ones((B, D)))
    per_step = sorted(
        (r.primitive, r.shape, r.multiplicity) for r in res if r.primitive != "argument"
    )
    # z (for dW) and cos(z @ w) (for sin's derivative), at every inner step of every outer step
    assert per_step == [("cos", (B, D), outer * inner), ("sin", (B, D), outer * inner)]


def test_flops_hand_worked(plain, full):
    assert plain.forward_flops == full.forward_flops == L * LAYER
    assert plain.flops == 3 * L * LAYER  # forward + dW + dx
    assert full.flops == 4 * L * LAYER  # + the recomputed forward matmul


def test_memory_fields_are_xla_memory_analysis(args, plain):
    compiled = jax.jit(jax.value_and_grad(relu_layers)).lower(*args).compile()
    stats = compiled.memory_analysis()
    assert plain.temp_bytes == stats.temp_size_in_bytes
    assert plain.argument_bytes == stats.argument_size_in_bytes == (L * D * D + B * D) * F32
    assert plain.output_bytes == stats.output_size_in_bytes >= (1 + L * D * D) * F32
    assert plain.alias_bytes == stats.alias_size_in_bytes
    floor = stats.temp_size_in_bytes + stats.argument_size_in_bytes - stats.alias_size_in_bytes
    if stats.peak_memory_in_bytes >= floor:  # a peak that includes the temporaries
        assert plain.peak_source == "peak_memory_in_bytes"
        assert plain.peak_bytes == stats.peak_memory_in_bytes
    else:  # the CPU backend's reported peak leaves the temporaries out
        assert plain.peak_source == "temp+argument+output-alias"
        assert plain.peak_bytes == floor + stats.output_size_in_bytes


def test_full_checkpoint_lowers_compiled_memory():
    # long enough that the per-step residuals dominate XLA's temporaries
    ws, x = jnp.full((64, D, D), 0.1), jnp.ones((64, D))
    plain = remat.measure(relu_layers, ws, x, repeats=0)
    full = remat.measure(relu_layers, ws, x, strategy="full", repeats=0)
    # no per-step masks (64 steps of (64, D) bools) and no relu zeros (64, D) floats
    assert plain.residual_bytes - full.residual_bytes == 64 * 64 * D + 64 * D * F32
    assert full.temp_bytes < plain.temp_bytes
    assert full.peak_bytes < plain.peak_bytes


@dataclasses.dataclass
class FakeStats:
    peak_memory_in_bytes: int
    temp_size_in_bytes: int = 100
    argument_size_in_bytes: int = 40
    output_size_in_bytes: int = 20
    alias_size_in_bytes: int = 8


@dataclasses.dataclass
class FakeCompiled:
    stats: FakeStats | None

    def memory_analysis(self):
        return self.stats


@pytest.mark.parametrize(
    "reported, peak, source",
    [
        # On CPU the backend's figure is never taken: it leaves the temporaries out even when
        # it is above temp + argument - alias (see remat._measure._peak).
        (150, 152, "temp+argument+output-alias"),
        (0, 152, "temp+argument+output-alias"),  # not reported
        (60, 152, "temp+argument+output-alias"),  # leaves the temporaries out (CPU)
    ],
)
def test_peak_source(reported, peak, source):
    m = measure_compiled(FakeCompiled(FakeStats(reported)))
    assert (m["peak_bytes"], m["peak_source"]) == (peak, source)
    assert (m["temp_bytes"], m["argument_bytes"], m["output_bytes"], m["alias_bytes"]) == (
        100,
        40,
        20,
        8,
    )


def test_no_memory_analysis():
    assert measure_compiled(FakeCompiled(None))["peak_source"] == "unavailable"


def test_no_checkpoint_requests_no_recompute(plain):
    assert not plain.recompute_requested and not plain.recompute_eliminated
    assert plain.plain_flops is None


def test_everything_saveable_requests_no_recompute(args):
    policy = jax.checkpoint_policies.everything_saveable

    def saved(ws, x):
        return jnp.sum(lax.scan(jax.checkpoint(relu_body, policy=policy), x, ws)[0])

    assert not recompute_requested(jax.make_jaxpr(saved)(*args).jaxpr)
    assert recompute_requested(jax.make_jaxpr(relu_layers_full)(*args).jaxpr)


def test_checkpoint_inside_scan_is_not_eliminated(full):
    # the fixture ran under `filterwarnings = error`: no RematWarning was raised
    assert full.recompute_requested and not full.recompute_eliminated
    assert full.plain_flops == 3 * L * LAYER < full.flops


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU expands optimisation barriers")
def test_checkpoint_outside_a_loop_is_eliminated_on_cpu(args):
    with pytest.warns(remat.RematWarning, match=r"(?s)CPU backend.*lax\.scan"):
        m = remat.measure(unrolled_full, *args, repeats=0)
    assert m.recompute_requested and m.recompute_eliminated
    # traced, the gradient recomputes L matmuls; compiled, it does not
    assert m.flops == m.plain_flops


def test_strip_checkpoints_is_the_plain_twin(args):
    for fn in (relu_layers_full, unrolled_full):
        twin = strip_checkpoints(fn)
        assert not recompute_requested(jax.make_jaxpr(twin)(*args).jaxpr)
        step, twin_step = (jax.jit(jax.value_and_grad(f, argnums=(0, 1))) for f in (fn, twin))
        assert_tree_allclose(step(*args), twin_step(*args))


def test_timing_and_labels(plain, full):
    t = plain.seconds
    assert t.repeats == 2 and 0 < t.min <= t.median <= t.max
    assert full.seconds is None
    assert plain.compile_seconds > 0
    assert (plain.strategy, plain.backend) == ("none", jax.default_backend())
    assert plain.num_devices == 1


def test_pytree_args_and_argnums():
    params = {"w": jnp.full((3, D, D), 0.1), "scale": jnp.float32(2.0)}

    def loss(params, x):
        return params["scale"] * relu_layers(params["w"], x)

    m = remat.measure(loss, params, jnp.ones((B, D)), argnums=(0, 1), repeats=0)
    assert m.forward_flops == 3 * LAYER and m.flops == 3 * 3 * LAYER


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda a: remat.measure(lambda ws, x: ws * 2, *a), ValueError, "scalar"),
        (lambda a: remat.measure(relu_layers, "ws", a[1]), TypeError, "str"),
        (lambda a: remat.measure(relu_layers, a[0], a[1], argnums=2), ValueError, "argnums"),
        (lambda a: remat.measure(relu_layers, a[0], a[1], repeats=-1), ValueError, "repeats"),
        (lambda a: remat.measure("fn", *a), TypeError, "not callable"),
        (lambda a: remat.measure(relu_layers, *a, strategy="fastest"), ValueError, "strategy"),
        (
            lambda a: remat.measure(lambda n, x: relu_layers(a[0], x) * n, 3, a[1]),
            TypeError,
            "int32",
        ),
    ],
)
def test_errors_name_measure(args, call, error, match):
    with pytest.raises(error, match=r"`remat\.measure`") as info:
        call(args)
    assert match in str(info.value)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU expands optimisation barriers")
def test_strategy_on_a_program_without_scan_is_eliminated_on_cpu(args):
    def unrolled(ws, x):
        for i in range(L):
            x = jax.nn.relu(x @ ws[i])
        return jnp.sum(x)

    with pytest.warns(remat.RematWarning) as record:
        m = remat.measure(unrolled, *args, strategy="full", repeats=0, roll=False)
    assert m.recompute_requested and m.recompute_eliminated
    assert any("compiled program contains none" in str(w.message) for w in record)


def test_abstract_arguments_are_measured_without_running(args, full):
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    m = remat.measure(relu_layers_full, *abstract, repeats=0)
    assert (m.flops, m.peak_bytes, m.residual_bytes) == (
        full.flops,
        full.peak_bytes,
        full.residual_bytes,
    )
    with pytest.raises(TypeError, match=r"`remat\.measure`.*repeats=0"):
        remat.measure(relu_layers_full, *abstract, repeats=1)


def test_arrays_closed_over_are_named_with_the_bytes_the_peak_leaves_out():
    """Closed-over arrays are constants of the compiled program, outside its memory analysis:
    the peak of the closure is below the peak with the weights as an argument by more than
    their bytes (8 bytes of alignment)."""
    ws = jnp.full((4, 256, 256), 0.01)  # 1 MiB
    x = jnp.ones((8, 256))
    with pytest.warns(remat.RematWarning, match=r"closes over 1 array\(s\) of 1.00 MiB"):
        closed = remat.measure(lambda x: relu_layers(ws, x), x, repeats=0)
    as_arg = remat.measure(relu_layers, ws, x, argnums=1, repeats=0)  # no warning
    assert closed.argument_bytes == as_arg.argument_bytes - ws.nbytes
    assert closed.peak_bytes + ws.nbytes == as_arg.peak_bytes - 8
    small = jnp.full((4, 64, 64), 0.01)  # 64 KiB: a mask or a table, not worth a word
    remat.measure(lambda x: relu_layers(small, x), x[:, :64], repeats=0)
