"""Per-layer save sets in one scan (`remat._trace._periodic`): the program's values and
gradients, what each position saves, and that the grouped form copies no stacked input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from conftest import assert_tree_allclose, mlp_stack
from remat._measure._peak import compiled_memory
from remat._measure._step import ANALYSIS_OPTIONS
from remat._trace._periodic import periodic_loop, periods, runs
from remat._trace._tag import ScanChoice, rewrite


def _named_body(consts, carry, x):
    (h,) = carry
    w1, w2 = x
    u = checkpoint_name(h @ w1, "up")
    a = checkpoint_name(jnp.tanh(u), "act")
    h = h + a @ w2
    return [h], [jnp.sum(h, axis=-1)]


def _inputs(layers=8, d=8, batch=4):
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    ws = [
        jax.random.normal(k1, (layers, d, 2 * d)) / 3,
        jax.random.normal(k2, (layers, 2 * d, d)) / 4,
    ]
    return ws, jax.random.normal(k3, (batch, d))


# Reversed: the patterns whose positions differ (the uniform one reverses as a plain scan).
@pytest.mark.parametrize(
    ("pattern", "reverse"),
    [
        ((("up",), ()), False),
        ((("up",), ()), True),
        ((("up", "act"), (), ("act",)), False),
        ((("up", "act"), (), ("act",)), True),
        (((),) * 4, False),
        (((),) * 7 + (("up",),) * 5, False),
        (((),) * 7 + (("up",),) * 5, True),
    ],
)
def test_values_and_gradients_equal_the_plain_scan(pattern, reverse):
    ws, x = _inputs(layers=12)

    def plain(ws, x):
        def step(c, w):
            new, ys = _named_body((), c, w)
            return new, ys

        carry, ys = jax.lax.scan(step, [x], ws, reverse=reverse)
        return jnp.sum(carry[0] ** 2) + jnp.sum(jnp.sin(ys[0]))

    def grouped(ws, x):
        carry, ys = periodic_loop(_named_body, pattern, (), [x], ws, 12, reverse)
        return jnp.sum(carry[0] ** 2) + jnp.sum(jnp.sin(ys[0]))

    # one compiled program each (run op by op, every scan in the gradient compiles alone)
    both = lambda f: jax.jit(jax.value_and_grad(f, (0, 1)))(ws, x)  # noqa: E731
    assert_tree_allclose(both(grouped), both(plain))


def _saved(pattern, layers=8):
    """How many layers' ``(batch, 2d)`` values (``up``, ``act``) and ``(batch, d)`` carries the
    grouped scan saves (from its VJP's residuals: stacked outputs of the forward loop); the
    stacked parameters are residuals as the reshaped inputs themselves, not copies."""
    from jax._src.ad_checkpoint import saved_residuals

    ws, x = _inputs(layers)

    def f(ws, x):
        return periodic_loop(_named_body, pattern, (), [x], ws, layers)[0][0].sum()

    values = carries = 0
    for aval, where in saved_residuals(f, ws, x):
        if aval.shape[1:] == (4, 16):
            values += aval.shape[0]
        elif aval.shape[1:] == (4, 8):
            carries += aval.shape[0]
        else:  # a group of parameters: the reshaped scan input, forwarded
            assert aval.shape[:2] == (layers // len(pattern), len(pattern)), where
            assert "reshape" in where, where
    return values, carries


def test_each_position_saves_its_own_names():
    assert _saved((("up",), ())) == (4, 8)  # layers 0, 2, 4, 6; a carry per layer
    assert _saved((("up", "act"), ("act",), (), ("act",))) == (2 + 6, 8)
    assert _saved(((),) * 2) == (0, 8)


def test_a_period_that_does_not_divide_the_length_is_refused():
    ws, x = _inputs(layers=6)
    with pytest.raises(ValueError, match="period must divide the length"):
        periodic_loop(_named_body, ((), (), (), ()), (), [x], ws, 6)
    assert periods(6) == (2, 3, 6) and periods(7) == (7,) and periods(4) == (2, 4)
    assert periods(16) == (2, 4, 8) and periods(9, most=4) == (3,)


def _peak(loss, args, choice):
    """The compiled peak of the gradient step, compiled as remat compiles what it only reads
    (`ANALYSIS_OPTIONS`: LLVM's optimisation off, the same buffers, less time)."""
    step = jax.jit(jax.grad(rewrite(loss, {0: choice})))
    return compiled_memory(step.lower(*args).compile(ANALYSIS_OPTIONS)).peak_bytes


@pytest.mark.parametrize("layers", [8, pytest.param(16, marks=pytest.mark.slow)])
def test_the_grouped_form_copies_no_stacked_input(layers):
    """With the same save set at every position, the grouped scan's peak exceeds the uniform
    scan's by the parameter gradients of the group's other layers (each lives until the
    group's first layer is differentiated), the same at 8 and at 16 layers: no copy of the
    stacked parameters, and no two positions' recomputed values live at once (one such value,
    batch x 4d, is 16x a layer's parameters here)."""
    layer_params = 2 * 16 * 64 * 4  # one layer's w1 and w2, float32
    one_value = 512 * 64 * 4  # batch x 4d, float32: what each position recomputes
    loss, args = mlp_stack(layers=layers, d=16, batch=512)
    for names in ((), ("remat_s0_e0",)):
        uniform = _peak(loss, args, ScanChoice(names=names))
        for g in (2, 4):
            same = _peak(loss, args, ScanChoice(names=names, pattern=(names,) * g))
            extra = same - uniform - (g - 1) * layer_params
            assert 0 <= extra <= one_value // 16, (layers, names, g, same - uniform)


def test_saving_in_half_the_layers_keeps_about_half_the_bytes():
    loss, args = mlp_stack(layers=16, d=16, batch=64)
    keep = ("remat_s0_e0",)
    none = _peak(loss, args, ScanChoice(names=()))
    every = _peak(loss, args, ScanChoice(names=keep))
    half = _peak(loss, args, ScanChoice(names=keep, pattern=(keep, ())))
    one_value = 64 * 64 * 4  # batch x 4d, float32: saved at 8 of 16 layers
    assert none < half < every
    assert abs((every - half) - 8 * one_value) <= 4 * one_value


def test_rewrite_with_a_pattern_keeps_the_program_gradients():
    loss, args = mlp_stack(layers=8, d=8, batch=16)
    choice = ScanChoice(names=("remat_s0_e0", "remat_s0_e1"),
                        pattern=(("remat_s0_e0",), (), ("remat_s0_e1",), ()))  # fmt: skip
    planned = rewrite(loss, {0: choice})
    assert_tree_allclose(jax.jit(jax.grad(planned))(*args), jax.jit(jax.grad(loss))(*args))


def test_segments_keep_k_of_l_layers_values_and_copy_nothing():
    """A pattern as long as the scan runs as one scan per run of equal save sets, each
    indexing the stacked parameters whole (`segments`). With the same set in every layer the
    peak is one carry (32 KiB) under the plain scan's, within 4.2 KiB, where a copy of the
    stacked parameters would be 64 KiB: nothing is copied, and the first layer reads its input
    from the step's argument (the plain scan stacks a copy of it). Each layer that recomputes
    instead of saving lowers the peak by at least one saved value (a lone layer, whose loop
    XLA removes, by a quarter more); two runs compile two loop bodies, forward and backward,
    whatever the number of layers."""
    loss, args = mlp_stack(layers=8, d=16, batch=512)
    keep = ("remat_s0_e0",)
    one_value = 512 * 64 * 4  # batch x 4d, float32: the value each layer saves
    uniform = _peak(loss, args, ScanChoice(names=keep))
    same = _peak(loss, args, ScanChoice(names=keep, pattern=(keep,) * 8))
    one_carry = 512 * 16 * 4  # batch x d, float32
    assert 0 <= same - (uniform - one_carry) <= 4224, (uniform, same)
    for first in (1, 5):
        pattern = ((),) * first + (keep,) * (8 - first)
        fewer = same - _peak(loss, args, ScanChoice(names=keep, pattern=pattern))
        assert (first - 0.01) * one_value <= fewer <= (first + 0.25) * one_value, (first, fewer)

    step = jax.jit(jax.grad(rewrite(loss, {0: ScanChoice(names=keep, pattern=pattern)})))
    hlo = step.lower(*args).compile(ANALYSIS_OPTIONS).as_text()
    assert hlo.count(" while(") == 4  # two runs, forward and backward

    from jax._src.ad_checkpoint import saved_residuals

    ws, x = _inputs(layers=8)

    def f(ws, x):
        return periodic_loop(_named_body, ((),) * 3 + (("up",),) * 5, (), [x], ws, 8)[0][0].sum()

    kept = [(aval.shape, where) for aval, where in saved_residuals(f, ws, x)]
    assert [s for s, _ in kept if s[1:] == (4, 16)] == [(5, 4, 16)]  # "up" in layers 3..7
    # Input carries: each run's first layer keeps the run's input (the first run's is the
    # argument ``x``, not a copy), the others one slot each of a stack per run.
    assert sorted(s for s, _ in kept if s[1:] == (4, 8)) == [(2, 4, 8), (4, 4, 8)]
    inputs = [where for s, where in kept if s == (4, 8)]
    assert len(inputs) == 2 and "argument x" in inputs[0], kept
    stacks = [where for s, where in kept if s in ((8, 8, 16), (8, 16, 8))]
    assert len(stacks) == 2 and all("argument" in w for w in stacks), kept  # not copied


def test_runs_of_a_pattern():
    assert runs([("a",)] * 3) == [(0, 3)]
    assert runs([(), ("a",), ("a",), (), ()]) == [(0, 1), (1, 3), (3, 5)]


def test_segments_take_integer_inputs_and_outputs():
    """Integer scanned inputs and constants (per-layer indices, a shift) get no cotangent
    (JAX's ``float0``), and stacked outputs of either kind come back in layer order, as
    `jax.lax.scan` gives them, forward and reversed."""
    ws, x = _inputs(layers=6)
    shifts = jnp.arange(6, dtype=jnp.int32)

    def body(consts, carry, xs):
        (h,) = carry
        (offset,) = consts
        w1, w2, s = xs
        u = checkpoint_name(h @ w1, "up")
        h = h + jnp.tanh(jnp.roll(u, s + offset, axis=-1)) @ w2
        return [h], [jnp.sum(h), s * 2]

    def plain(ws, x, reverse):
        def step(c, xs):
            return body((jnp.int32(1),), c, xs)

        (h,), (ys, ss) = jax.lax.scan(step, [x], [*ws, shifts], reverse=reverse)
        return jnp.sum(h**2) + jnp.sum(jnp.sin(ys)), ss

    def split(ws, x, reverse):
        pattern = ((),) * 2 + (("up",),) * 3 + ((),)
        (h,), (ys, ss) = periodic_loop(body, pattern, (jnp.int32(1),), [x], [*ws, shifts], 6,
                                       reverse)  # fmt: skip
        return jnp.sum(h**2) + jnp.sum(jnp.sin(ys)), ss

    def both(f, reverse):  # one compiled program (op by op, each scan compiles alone)
        return jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True), static_argnums=2)(
            ws, x, reverse
        )

    for reverse in (False, True):
        (got, ss), grads = both(split, reverse)
        (want, ss0), grads0 = both(plain, reverse)
        assert_tree_allclose(got, want)
        assert_tree_allclose(grads, grads0)
        assert ss.dtype == jnp.int32 and (ss == ss0).all()


@pytest.fixture(scope="module")
def mlp8():
    return mlp_stack(layers=8, d=16, batch=512)


def _step_of(loss, args, pattern, one_loop, argnums=0):
    """``(compiled peak, while loops, FLOPs, gradients)`` of the gradient step with the scan's
    layers saving ``pattern``, as segments or in one loop each way (`remat._trace._one_loop`)."""
    import remat
    from remat._trace import _periodic

    keep = tuple(sorted(set().union(*pattern)))
    planned = rewrite(loss, {0: ScanChoice(names=keep, pattern=pattern)})
    before, _periodic.ONE_LOOP = _periodic.ONE_LOOP, one_loop
    try:
        compiled = jax.jit(jax.grad(planned, argnums)).lower(*args).compile(ANALYSIS_OPTIONS)
        flops = remat.measure(planned, *args, argnums=argnums, repeats=0).flops
        grads = jax.grad(planned, argnums)(*args)
    finally:
        _periodic.ONE_LOOP = before
    return compiled_memory(compiled).peak_bytes, compiled.as_text().count(" while("), flops, grads


# The one-loop form is off (`_periodic.ONE_LOOP`: it peaks above segments on the plans the
# planner makes); its tests run with the slow ones.
@pytest.mark.slow
@pytest.mark.parametrize("first", [1, 5])
def test_nested_sets_in_one_loop_each_way(mlp8, first):
    """Sets that nest run in one forward and one backward loop (`remat._trace._one_loop`):
    the gradients are the program's; the FLOPs are those of the layers that recompute
    (hand-worked: the stack's first matmul, 512 x 16 x 64 x 2 = 1 MiB of FLOPs, once per
    layer saving nothing, counted through the tagged branches), and the peak is no more than
    the segments' plus 25 KiB (the recomputation's temporaries, live beside the whole
    buffer: a loop frees nothing before its end; with one layer saving nothing it is 3.8 KiB
    under the segments')."""
    loss, args = mlp8
    keep = ("remat_s0_e0",)
    pattern = ((),) * first + (keep,) * (8 - first)
    segments = _step_of(loss, args, pattern, one_loop=False)
    shared = _step_of(loss, args, pattern, one_loop=True)
    none = remat_flops(loss, args)
    assert shared[2] == none + first * 512 * 16 * 64 * 2
    assert shared[0] - segments[0] <= 25 * 1024, (shared[0], segments[0])
    assert shared[1] == 2 and segments[1] == (2 if first == 1 else 4)
    assert_tree_allclose(shared[3], jax.grad(loss)(*args))


@pytest.mark.slow  # the one-loop form is off (see above)
def test_one_loop_recomputes_what_segments_recompute():
    """A layer saving nothing computes the value the others keep (the third matmul's input,
    ``tanh(tanh(h @ w1) @ w2)``) in the switch, through the first matmul, whose output the
    shared VJP reads too (for the first ``tanh``'s derivative and the second matmul's weight
    gradient): the switch gives it to the VJP (`_one_loop._given`) instead of the VJP
    computing it again, so the step's FLOPs are the segments' exactly (computed again, the
    first two matmuls ran twice in that layer: 64 x 8 x 16 x 2 + 64 x 16 x 16 x 2 = 49,152
    FLOPs more). The input's gradient is asked for too: with
    the parameters' only, segments drop the first layer's input cotangent, which a loop
    cannot drop for one of its steps."""

    def block(h, w):
        w1, w2, w3 = w
        return h + jnp.tanh(jnp.tanh(h @ w1) @ w2) @ w3, None

    def loss(params, x):
        h, _ = jax.lax.scan(block, x, params)
        return jnp.mean(h**2)

    ks = jax.random.split(jax.random.key(2), 4)
    params = tuple(jax.random.normal(k, s) / 4 for k, s in
                   zip(ks[:3], [(4, 8, 16), (4, 16, 16), (4, 16, 8)], strict=True))  # fmt: skip
    args = (params, jax.random.normal(ks[3], (64, 8)))
    keep = ("remat_s0_e3",)  # tanh(... @ w2), the value the third matmul reads
    pattern = ((),) + (keep,) * 3
    segments = _step_of(loss, args, pattern, one_loop=False, argnums=(0, 1))
    shared = _step_of(loss, args, pattern, one_loop=True, argnums=(0, 1))
    assert shared[2] == segments[2]
    assert shared[1] == 2 and segments[1] == 2  # a lone layer's loop is removed by XLA
    assert_tree_allclose(shared[3], jax.grad(loss, (0, 1))(*args))


def remat_flops(loss, args):
    import remat

    return remat.measure(loss, *args, repeats=0).flops


def test_sets_that_do_not_nest_run_as_segments():
    from remat._trace._one_loop import chain, one_loop

    assert chain([("a",), ("a", "b"), ()]) == [(), ("a",), ("a", "b")]
    assert chain([("a",), ("b",)]) is None
    ws, x = _inputs(layers=4)
    assert one_loop(_named_body, (("up",), ("up",), ("act",), ("act",)), (), [x], ws) is None
    assert one_loop(_named_body, (("up",),) * 4, (), [x], ws) is None  # one set: segments
    # Names the program gives itself are not named by the planner's tags: segments.
    assert one_loop(_named_body, ((), ("up",), ("up",), ("up",)), (), [x], ws) is None


def _decoder():
    """A toy decoder: an embedding lookup makes the first carry (the head, recomputed for
    the first layer's backward pass), each layer a residual sum and a matmul to 4x width."""
    k = jax.random.split(jax.random.key(0), 6)
    layers, vocab, seq, d = 4, 64, 64, 32
    params = {
        "embed": jax.random.normal(k[0], (vocab, d)) / 4,
        "pos": jax.random.normal(k[1], (seq, d)) / 4,
        "a": jax.random.normal(k[2], (layers, d, d)) / 8,
        "b": jax.random.normal(k[3], (layers, d, 4 * d)) / 8,
        "c": jax.random.normal(k[4], (layers, 4 * d, d)) / 16,
    }
    tokens = jax.random.randint(k[5], (4, seq), 0, vocab)

    def loss(params, tokens):
        x = params["embed"][tokens] + params["pos"]

        def layer(x, p):
            a, b, c = p
            mid = x + jnp.tanh(x) @ a  # e2: the residual sum
            up = mid @ b  # e3
            return mid + jnp.tanh(up) @ c, None

        x, _ = jax.lax.scan(layer, x, (params["a"], params["b"], params["c"]))
        return jnp.mean(x**2)

    return loss, (params, tokens)


def test_a_lone_first_layer_keeps_its_saved_values_not_what_makes_them(monkeypatch):
    """A run of one layer has no loop, and XLA fuses the residual sum it saves into its
    backward pass's reads, keeping the embedding's output and the matmul's it is made of to
    the end of the step instead (`_periodic._materialized` writes them out): one carry
    (4 x 64 x 32 float32 = 32 KiB) less at the peak. The last run's backward pass follows
    its forward pass at once: its values are left to XLA. Gradients are the program's."""
    from remat._trace import _periodic

    loss, args = _decoder()
    less, more = ("remat_s0_e2", "remat_s0_e3"), ("remat_s0_e0", "remat_s0_e2", "remat_s0_e3")
    carry = 4 * 64 * 32 * 4

    choice = ScanChoice(names=more, pattern=(less,) + (more,) * 3)
    with monkeypatch.context() as m:
        m.setattr(_periodic, "_materialized", lambda values: values)
        fused = _peak(loss, args, choice)
    written = _peak(loss, args, choice)
    assert carry - 1024 <= fused - written <= carry, (fused, written)
    grads = jax.jit(jax.grad(rewrite(loss, {0: choice})))(*args)
    assert_tree_allclose(grads, jax.jit(jax.grad(loss))(*args))
    calls = []
    monkeypatch.setattr(_periodic, "_materialized", lambda values: calls.append(1) or values)
    last = rewrite(loss, {0: ScanChoice(names=more, pattern=(more,) * 3 + (less,))})
    jax.make_jaxpr(jax.grad(last))(*args)
    assert not calls  # the last run: left to XLA
