"""FLOPs read from optimised HLO with loop trip counts, checked against hand-worked numbers."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import remat
from remat._measure._hlo import hlo_flops, while_trip_counts
from remat._measure._step import ANALYSIS_OPTIONS

L, B, D = 6, 4, 8
LAYER = 2 * B * D * D  # one (B, D) @ (D, D) matmul: B*D outputs, D multiply-adds each


def layers(ws, x):
    y, _ = lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
    return jnp.sum(y)


def full_layers(ws, x):
    body = jax.checkpoint(
        lambda y, w: (jnp.tanh(y @ w), None), policy=jax.checkpoint_policies.nothing_saveable
    )
    y, _ = lax.scan(body, x, ws)
    return jnp.sum(y)


@pytest.fixture(scope="module")
def args():
    return jnp.full((L, D, D), 0.1), jnp.ones((B, D))


def compiled_text(fn, *args):
    return jax.jit(fn).lower(*args).compile(ANALYSIS_OPTIONS).as_text()  # read, never run


def test_forward_scan_counts_every_layer(args):
    assert hlo_flops(compiled_text(layers, *args)) == L * LAYER


def test_plain_gradient_is_three_forwards(args):
    # backward per layer: dW = y^T @ g and dx = g @ W^T, one forward-sized matmul each
    step = jax.value_and_grad(layers, argnums=(0, 1))
    assert hlo_flops(compiled_text(step, *args)) == 3 * L * LAYER


def test_recomputed_gradient_is_four_forwards(args):
    # per step recompute ("full"): the forward matmul runs once more in the backward loop
    step = jax.value_and_grad(full_layers, argnums=(0, 1))
    assert hlo_flops(compiled_text(step, *args)) == 4 * L * LAYER


def test_xla_cost_analysis_counts_the_scan_body_once(args):
    compiled = jax.jit(layers).lower(*args).compile()
    xla = compiled.cost_analysis()["flops"]
    # XLA's number (one layer's matmul plus elementwise work) is far below L layers' matmuls
    assert LAYER <= xla < 2 * LAYER < L * LAYER == hlo_flops(compiled.as_text())


def test_nested_scans_multiply_trip_counts():
    outer, inner = 3, 4

    def nested(ws, x):
        def block(y, w_block):
            return lax.scan(lambda z, w: (z @ w, None), y, w_block)[0], None

        return jnp.sum(lax.scan(block, x, ws)[0])

    text = compiled_text(nested, jnp.ones((outer, inner, D, D)), jnp.ones((B, D)))
    assert sorted(while_trip_counts(text).values()) == [outer, inner]
    assert hlo_flops(text) == outer * inner * LAYER


# b, d >= 2: XLA rewrites a contraction of size 1 (e.g. the outer product dW = y^T g for
# b = 1) as elementwise work, which is not counted
@pytest.mark.parametrize(
    "outer, inner, b, d, grad", [(2, 3, 2, 3, False), (3, 2, 3, 2, True), (1, 4, 2, 5, True)]
)
def test_nested_scan_flops_property(outer, inner, b, d, grad):
    def nested(ws, x):
        def block(y, w_block):
            return lax.scan(lambda z, w: (jnp.sin(z @ w), None), y, w_block)[0], None

        return jnp.sum(lax.scan(block, x, ws)[0])

    fn = jax.grad(nested, argnums=(0, 1)) if grad else nested
    text = compiled_text(fn, jnp.ones((outer, inner, d, d)), jnp.ones((b, d)))
    # forward: one (b, d) @ (d, d) per layer; gradient: that plus dW and dx per layer
    assert hlo_flops(text) == (3 if grad else 1) * outer * inner * 2 * b * d * d


def test_trip_count_from_loop_condition_without_backend_config(args):
    text = compiled_text(layers, *args)
    stripped = re.sub(r', backend_config=\{[^\n]*"known_trip_count"[^\n]*\}', "", text)
    assert "known_trip_count" in text and "known_trip_count" not in stripped
    assert hlo_flops(stripped) == L * LAYER


def test_unknown_trip_count_warns_and_counts_body_once():
    def until_big(x):
        return lax.while_loop(lambda y: jnp.sum(y) < 100.0, lambda y: y @ y + 1.0, x)

    text = compiled_text(until_big, jnp.ones((4, 4)))
    with pytest.warns(remat.RematWarning, match="lower bound"):
        assert hlo_flops(text) == 2 * 4 * 4 * 4


def conv(x, k, stride=(1, 1), padding="VALID"):
    return lax.conv_general_dilated(
        x, k, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def test_convolution_flops_by_hand():
    x, k = jnp.ones((2, 9, 9, 3)), jnp.ones((3, 3, 3, 5))
    # 'VALID': 2 * 7 * 7 outputs * 5 features, each 3*3*3 multiply-adds
    assert hlo_flops(compiled_text(conv, x, k)) == 2 * (2 * 7 * 7 * 5) * (3 * 3 * 3)


@pytest.mark.parametrize(
    "stride, padding", [((1, 1), "SAME"), ((2, 2), "SAME"), ((2, 1), [(1, 2), (0, 1)])]
)
def test_convolution_padding_taps_match_xla(stride, padding):
    # with padding, taps that read padding do no work; XLA's count for a lone conv is exact
    x, k = jnp.ones((2, 11, 10, 6)), jnp.ones((3, 3, 6, 4))
    compiled = jax.jit(lambda x, k: conv(x, k, stride, padding)).lower(x, k).compile()
    assert hlo_flops(compiled.as_text()) == compiled.cost_analysis()["flops"]


def test_convolution_gradient_is_three_forwards():
    x, k = jnp.ones((2, 9, 9, 3)), jnp.ones((3, 3, 3, 5))
    step = jax.grad(lambda x, k: jnp.sum(conv(x, k) ** 2), argnums=(0, 1))
    # dx is a padded ('full') convolution: only taps inside the input count
    assert hlo_flops(compiled_text(step, x, k)) == 3 * hlo_flops(compiled_text(conv, x, k))


# A hand-written module: one computation called from two call sites, a while loop of 5
# steps inside it, a conditional and a cuBLAS gemm custom call.
_HANDWRITTEN = """
HloModule handwritten

%body (p: (s32[], f32[2,3])) -> (s32[], f32[2,3]) {
  %p = (s32[], f32[2,3]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[2,3]{1,0} get-tuple-element(%p), index=1
  %w = f32[3,3]{1,0} constant({...})
  %d = f32[2,3]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[2,3]{1,0}) tuple(%j, %d)
}

%cond (q: (s32[], f32[2,3])) -> pred[] {
  %q = (s32[], f32[2,3]{1,0}) parameter(0)
  %k = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%k, %n), direction=LT
}

%loop (a: f32[2,3]) -> f32[2,3] {
  %a = f32[2,3]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[2,3]{1,0}) tuple(%zero, %a)
  %wh = (s32[], f32[2,3]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[2,3]{1,0} get-tuple-element(%wh), index=1
}

%cheap (c: f32[2,3]) -> f32[2,3] {
  ROOT %c = f32[2,3]{1,0} parameter(0)
}

%costly (e: f32[2,3]) -> f32[2,3] {
  %e = f32[2,3]{1,0} parameter(0)
  %v = f32[3,3]{1,0} constant({...})
  ROOT %f = f32[2,3]{1,0} dot(%e, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x0: f32[2,3], pr: pred[], g: f32[4,8]) -> f32[2,3] {
  %x0 = f32[2,3]{1,0} parameter(0)
  %pr = pred[] parameter(1)
  %g = f32[4,8]{1,0} parameter(2)
  %c1 = f32[2,3]{1,0} call(%x0), to_apply=%loop
  %c2 = f32[2,3]{1,0} call(%c1), to_apply=%loop
  %br = f32[2,3]{1,0} conditional(%pr, %c2, %c2), branch_computations={%cheap, %costly}
  %gemm = (f32[4,16]{1,0}, s8[0]{0}) custom-call(%g, %g), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"]}}}
  ROOT %out = f32[2,3]{1,0} add(%br, %br)
}
"""


def test_handwritten_module_call_sites_loops_branches_gemm():
    dot = 2 * 2 * 3 * 3  # (2, 3) @ (3, 3)
    gemm = 2 * 4 * 16 * 8  # (4, 16) result, 8 contracted
    assert while_trip_counts(_HANDWRITTEN) == {"wh": 5}
    # two call sites x 5 steps, plus the costlier branch, plus the gemm
    assert hlo_flops(_HANDWRITTEN) == 2 * 5 * dot + dot + gemm


def test_text_without_entry_is_an_error():
    with pytest.raises(ValueError, match=r"`remat._measure._hlo.hlo_flops`.*ENTRY"):
        hlo_flops("not hlo")


def test_trip_count_reads_the_counters_start_and_step_from_the_loop():
    """A loop without `known_trip_count` whose counter starts at 1 and steps by 2 below 9
    runs 4 times (1, 3, 5, 7): its start is read from the loop's operand, its step from the
    body's add (XLA:TPU's windowed einsums over a ring of chips step by 2; counted as
    stepping by 1 they doubled the matmul FLOPs of FSDP steps)."""
    text = (
        _HANDWRITTEN.replace("%one = s32[] constant(1)", "%one = s32[] constant(2)")
        .replace("%zero = s32[] constant(0)", "%zero = s32[] constant(1)")
        .replace("%n = s32[] constant(5)", "%n = s32[] constant(9)")
    )
    assert while_trip_counts(text) == {"wh": 4}
    dot, gemm = 2 * 2 * 3 * 3, 2 * 4 * 16 * 8
    assert hlo_flops(text) == 2 * 4 * dot + dot + gemm
