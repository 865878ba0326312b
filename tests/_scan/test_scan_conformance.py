"""`remat.scan` as a drop-in for `lax.scan`: the cases JAX's own scan tests cover.

Modelled on the scan tests of JAX's ``tests/lax_control_flow_test.py`` (what they cover, not
their text): every case runs `remat.scan` on each schedule and `lax.scan` on the same
arguments, and compares every output and derivative. The schedules: ``per_step``; `Nested`
with a length (13) that is not a power of its block count, so a remainder block runs; and
`Binomial` with few snapshots, so the backward sweep recomputes. Each case runs forward and
with ``reverse=True``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import remat
from conftest import assert_tree_allclose

N = 13
SCHEDULES = ["per_step", remat.Nested(2), remat.Nested(3), remat.Binomial(2)]
ids = str
slow = pytest.mark.slow


def pair(schedule, reverse=False, unroll=1):
    """``remat.scan`` on ``schedule`` and ``lax.scan``, with the same keyword arguments."""
    got = functools.partial(remat.scan, reverse=reverse, unroll=unroll, schedule=schedule)
    want = functools.partial(lax.scan, reverse=reverse, unroll=unroll)
    return got, want


def rnn_step(w):
    """A step with a pytree carry (float + int counter), pytree xs and ys."""

    def step(carry, x):
        h, k = carry
        h = jnp.tanh(w @ h + x["u"]) * (1.0 + 0.05 * x["v"])
        return (h, k + 1), {"sq": jnp.sum(h * h), "k": k, "h": h}

    return step


def rnn_inputs(n=N):
    u = 0.5 * jnp.sin(jnp.arange(3 * n, dtype=jnp.float32)).reshape(n, 3)
    v = jnp.cos(jnp.arange(n, dtype=jnp.float32))
    w = jnp.array([[0.9, 0.1, 0.0], [-0.2, 0.8, 0.1], [0.1, 0.0, 0.7]])
    return w, jnp.array([0.3, -0.1, 0.2]), {"u": u, "v": v}


def rnn_loss(scan):
    def loss(w, h0, xs):
        (h, _), ys = scan(rnn_step(w), (h0, jnp.int32(0)), xs)
        weights = jnp.cos(jnp.arange(ys["sq"].shape[0], dtype=jnp.float32))
        return jnp.sum(h**2) + jnp.sum(ys["sq"] * weights) + jnp.sum(jnp.sin(ys["h"]))

    return loss


parametrize = pytest.mark.parametrize
# Nested(3) (three levels over 13 steps: blocks of 3, a remainder at two levels) is `slow`.
schedules = parametrize(
    "schedule",
    [pytest.param(s, id=str(s), marks=slow if s == remat.Nested(3) else ()) for s in SCHEDULES],
)
reverses = parametrize("reverse", [False, True], ids=["forward", "reverse"])

# The costly cases (second order, vmap) run by default on one (schedule, direction) pair
# each, reverse=True where it matters most (Nested's remainder block runs first, Binomial's
# table reads xs backwards); the rest of the grid is `slow`.
_FAST = {("per_step", False), (str(remat.Nested(2)), True), (str(remat.Binomial(2)), True)}


def _grid():
    return [
        pytest.param(
            s,
            r,
            id=f"{s}-{'reverse' if r else 'forward'}",
            marks=() if (str(s), r) in _FAST else slow,
        )
        for s in SCHEDULES
        for r in (False, True)
    ]


costly = parametrize(("schedule", "reverse"), _grid())


# ---------------------------------------------------------------------------------------
# Values: pytrees, reverse, unroll, xs=None, jit, weak types, keys, ints


@schedules
@reverses
@parametrize("unroll", [1, 2, pytest.param(True, marks=slow), pytest.param(0, marks=slow)])
def test_outputs_match(schedule, reverse, unroll):
    got, want = pair(schedule, reverse, unroll)
    w, h0, xs = rnn_inputs()
    init = (h0, jnp.int32(0))
    assert_tree_allclose(got(rnn_step(w), init, xs), want(rnn_step(w), init, xs))
    if unroll == 1:
        jitted = jax.jit(lambda w, h0, xs: got(rnn_step(w), (h0, jnp.int32(0)), xs))
        assert_tree_allclose(jitted(w, h0, xs), want(rnn_step(w), init, xs))


@schedules
@reverses
def test_xs_none_with_length_and_python_scalar_carry(schedule, reverse):
    got, want = pair(schedule, reverse)
    step = lambda c, _: (c * 0.9 + 1.0, c)  # noqa: E731
    c, ys = got(step, 0.0, None, length=N)
    assert_tree_allclose((c, ys), want(step, 0.0, None, length=N))
    # The weakly typed Python scalar takes the body's type, as in `lax.scan`.
    assert jax.typeof(c) == jax.typeof(want(step, 0.0, None, length=N)[0])


@schedules
def test_single_step_and_empty_scans(schedule):
    got, want = pair(schedule)
    step = lambda c, x: (c + x, c * x)  # noqa: E731
    for n in (0, 1):
        xs = jnp.arange(n, dtype=jnp.float32)
        assert_tree_allclose(got(step, 1.0, xs), want(step, 1.0, xs))


@schedules
def test_random_key_and_int_carry(schedule):
    got, want = pair(schedule)

    def step(carry, x):
        key, count = carry
        key, sub = jax.random.split(key)
        return (key, count + 1), jax.random.normal(sub, ()) * x

    init = (jax.random.key(0), jnp.int32(0))
    xs = jnp.linspace(0.0, 1.0, N)
    (k1, c1), ys1 = jax.jit(lambda xs: got(step, init, xs))(xs)
    (k2, c2), ys2 = want(step, init, xs)
    assert_tree_allclose((jax.random.key_data(k1), c1, ys1), (jax.random.key_data(k2), c2, ys2))
    # A key in the carry does not stop differentiation through the float parts.
    grad = lambda scan: jax.jit(jax.grad(lambda xs: scan(step, init, xs)[1].sum()))(xs)  # noqa: E731
    assert_tree_allclose(grad(got), grad(want))


@schedules
def test_body_without_xs_or_ys(schedule):
    got, want = pair(schedule)
    step = lambda c, _: (jnp.sin(c), None)  # noqa: E731
    assert_tree_allclose(got(step, 0.5, None, length=N), want(step, 0.5, None, length=N))


# ---------------------------------------------------------------------------------------
# Reverse mode


@schedules
@reverses
def test_grad_value_and_grad_and_vjp(schedule, reverse):
    got, want = (rnn_loss(s) for s in pair(schedule, reverse))
    args = rnn_inputs()
    vg = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(*args)  # noqa: E731
    assert_tree_allclose(vg(got), vg(want), scale=10.0)
    ct = jnp.float32(1.5)
    vjp = lambda f: jax.jit(lambda *a: jax.vjp(f, *a)[1](ct))(*args)  # noqa: E731
    assert_tree_allclose(vjp(got), vjp(want), scale=10.0)


@schedules
def test_jacrev_of_every_output(schedule):
    got, want = pair(schedule, reverse=True)
    w, h0, xs = rnn_inputs()

    def outputs(scan):
        def f(h0):
            (h, _), ys = scan(rnn_step(w), (h0, jnp.int32(0)), xs)
            return h, ys["sq"], ys["h"]  # the float outputs (`jacrev` refuses int ones)

        return f

    jac = lambda scan: jax.jit(jax.jacrev(outputs(scan)))(h0)  # noqa: E731
    assert_tree_allclose(jac(got), jac(want), scale=10.0)


@schedules
def test_grad_of_closed_over_tracer(schedule):
    got, want = pair(schedule)
    xs = jnp.linspace(0.1, 1.0, N)

    def loss(scan):
        def f(a):
            return scan(lambda c, x: (c * jnp.sin(a * x) + a, c), 1.0, xs)[1].sum()

        return f

    assert_tree_allclose(jax.jit(jax.grad(loss(got)))(0.7), jax.grad(loss(want))(0.7), scale=10.0)


# ---------------------------------------------------------------------------------------
# Forward mode and second order


@costly
def test_jvp_linearize_and_jacfwd(schedule, reverse):
    got, want = (rnn_loss(s) for s in pair(schedule, reverse))
    args = rnn_inputs()
    tangents = jax.tree_util.tree_map(jnp.ones_like, args)
    jvp = lambda f: jax.jit(lambda a, t: jax.jvp(f, a, t))(args, tangents)  # noqa: E731
    assert_tree_allclose(jvp(got), jvp(want), scale=10.0)
    lin = lambda f: jax.jit(lambda t: jax.linearize(f, *args)[1](*t))(tangents)  # noqa: E731
    assert_tree_allclose(lin(got), lin(want), scale=10.0)
    jacfwd = lambda f: jax.jit(jax.jacfwd(f, argnums=(0, 1)))(*args)  # noqa: E731
    assert_tree_allclose(jacfwd(got), jacfwd(want), scale=10.0)


@costly
def test_hessian_and_grad_of_grad(schedule, reverse):
    got, want = (rnn_loss(s) for s in pair(schedule, reverse))
    w, h0, xs = rnn_inputs()
    hess = lambda f: jax.jit(jax.hessian(f, argnums=1))(w, h0, xs)  # noqa: E731
    assert_tree_allclose(hess(got), hess(want), scale=10.0)

    def grad_of_grad(f):
        inner = jax.grad(f, argnums=(0, 2))
        return jax.jit(jax.grad(lambda w: jnp.sum(inner(w, h0, xs)[1]["u"] ** 2)))(w)

    assert_tree_allclose(grad_of_grad(got), grad_of_grad(want), scale=10.0)


@costly
def test_jacrev_of_jacrev_and_jvp_of_grad(schedule, reverse):
    got, want = pair(schedule, reverse)
    xs = jnp.linspace(0.1, 1.0, N)

    def f(scan):
        return lambda c: scan(lambda c, x: (jnp.sin(c) * x + c**2 / 4, c**3), c, xs)[1].sum()

    rr = lambda scan: jax.jit(jax.jacrev(jax.jacrev(f(scan))))(0.3)  # noqa: E731
    assert_tree_allclose(rr(got), rr(want), scale=10.0)
    fr = lambda scan: jax.jit(lambda c: jax.jvp(jax.grad(f(scan)), (c,), (1.0,)))(0.3)  # noqa: E731
    assert_tree_allclose(fr(got), fr(want), scale=10.0)
    rf = lambda scan: jax.jit(jax.grad(lambda c: jax.jvp(f(scan), (c,), (1.0,))[1]))(0.3)  # noqa: E731
    assert_tree_allclose(rf(got), rf(want), scale=10.0)


# ---------------------------------------------------------------------------------------
# vmap


IN_AXES = {
    "closed_over": (0, None, None),
    "carry": (None, 0, None),
    "xs_axis1": (None, None, 1),
    "all": (1, 0, 0),
}


def _vmap_cases():
    """Every batching of the inputs for `Binomial`, whose sweep is a `jax.custom_jvp` of the
    closure-converted body (a batched closed-over value, carry or xs each takes its own path
    there); `Nested` batched everywhere and with xs batched on axis 1 (its blocks reshape xs);
    ``per_step``, a `lax.scan` whose batching is JAX's own, batched everywhere. The other
    pairs are `slow`."""
    fast = {("per_step", "all"), ("Nested", "all"), ("Nested", "xs_axis1")}
    fast |= {("Binomial", axes) for axes in IN_AXES}
    return [
        pytest.param(
            s,
            IN_AXES[axes],
            id=f"{axes}-{s}",
            marks=() if (str(s).split("(")[0], axes) in fast else slow,
        )
        for s in ["per_step", remat.Nested(2), remat.Binomial(2)]
        for axes in IN_AXES
    ]


@parametrize(("schedule", "in_axes"), _vmap_cases())
def test_vmap_of_outputs_and_gradients(schedule, in_axes):
    got, want = (rnn_loss(s) for s in pair(schedule, reverse=True))
    w, h0, xs = rnn_inputs()
    batch = 3
    scale = jnp.arange(1.0, batch + 1.0) / batch
    args = []
    for a, axis in zip((w, h0, xs), in_axes, strict=True):
        if axis is None:
            args.append(a)
        else:
            args.append(
                jax.tree_util.tree_map(
                    lambda t, axis=axis: jnp.stack([t * s for s in scale], axis=axis), a
                )
            )
    axes = tuple(
        a if a is None or i < 2 else {"u": a, "v": min(a, 1)} for i, a in enumerate(in_axes)
    )
    for transform in (lambda f: f, jax.grad):
        run = lambda f, transform=transform: jax.jit(jax.vmap(transform(f), axes))(*args)  # noqa: E731
        assert_tree_allclose(run(got), run(want), scale=10.0)


@schedules
def test_vmap_with_read_only_carry_and_out_axes(schedule):
    got, want = pair(schedule)

    def f(scan):
        def g(a, xs):
            (a_out, c), ys = scan(lambda c, x: ((c[0], c[1] * x + c[0]), c[1]), (a, 1.0), xs)
            return a_out, c, ys

        return jax.vmap(g, in_axes=(0, None), out_axes=(0, 0, 1))

    a = jnp.arange(3.0)
    xs = jnp.linspace(0.5, 1.0, N)
    assert_tree_allclose(f(got)(a, xs), f(want)(a, xs))
    grad = lambda scan: jax.grad(lambda a: f(scan)(a, xs)[2].sum())(a)  # noqa: E731
    assert_tree_allclose(grad(got), grad(want))


# ---------------------------------------------------------------------------------------
# Nesting


# Outer and inner schedules: `Binomial`'s custom_jvp sweep inside a `lax.scan` body and inside
# another sweep, and `Nested`'s blocks around a plain scan; the pairs left to `slow` (a
# `lax.scan` in a `lax.scan`, `Binomial` inside `Nested`) take no path the others miss.
_NESTED_SLOW = {("per_step", "per_step"), (str(remat.Nested(2)), str(remat.Binomial(1)))}


@parametrize(
    ("schedule", "inner"),
    [
        pytest.param(s, i, id=f"{i}-{s}", marks=slow if (str(s), str(i)) in _NESTED_SLOW else ())
        for i in ["per_step", remat.Binomial(1)]
        for s in ["per_step", remat.Nested(2), remat.Binomial(2)]
    ],
)
def test_nested_scans(schedule, inner):
    def loss(outer_scan, inner_scan):
        def f(c0, xs):
            def outer(c, row):
                c, ys = inner_scan(lambda d, x: (jnp.sin(d) * x + 0.1, d), c, row)
                return c, ys.sum()

            c, ys = outer_scan(outer, c0, xs)
            return c + ys.sum()

        return f

    xs = jnp.linspace(0.1, 1.0, N * 4).reshape(N, 4)
    got = loss(*(functools.partial(remat.scan, schedule=s) for s in (schedule, inner)))
    want = loss(lax.scan, lax.scan)
    for transform in (lambda f: f, jax.grad, functools.partial(jax.jacfwd, argnums=1)):
        assert_tree_allclose(jax.jit(transform(got))(0.4, xs), transform(want)(0.4, xs), scale=10.0)


# ---------------------------------------------------------------------------------------
# Errors: `lax.scan`'s type and message, with remat's advice appended


def _lax_error(call):
    with pytest.raises(Exception) as info:
        call(lax.scan)
    return type(info.value), str(info.value)


ERRORS = {
    "carry_structure": lambda scan: scan(lambda c, x: ((c, c), x), 0.0, jnp.ones(5)),
    "carry_dtype": lambda scan: scan(lambda c, x: (c + x, x), jnp.int32(0), jnp.ones(5)),
    "carry_shape": lambda scan: scan(lambda c, x: (jnp.stack([c, x]), x), 0.0, jnp.ones(5)),
    "carry_several": lambda scan: scan(
        lambda x, _: ((x[0].astype("float32"), x[1].astype("float32").reshape(1, 1), x[2]), None),
        (jnp.array(0, "int32"),) * 3,
        None,
        length=1,
    ),
    "not_a_pair": lambda scan: scan(lambda c, x: c + x, 0.0, jnp.ones(5)),
    "length_mismatch": lambda scan: scan(lambda c, x: (c, x), 0.0, jnp.ones(5), length=4),
    "different_leading_axes": lambda scan: scan(
        lambda c, x: (c, x), 0.0, (jnp.ones(5), jnp.ones(4))
    ),
    "no_length": lambda scan: scan(lambda c, x: (c, x), 0.0),
    "traced_length": lambda scan: jax.jit(
        lambda n: scan(lambda c, x: (c + 1, c), 0, None, length=n)
    )(3),
    "scalar_xs": lambda scan: scan(lambda c, x: (c, x), 0.0, jnp.float32(1.0)),
    "negative_unroll": lambda scan: scan(lambda c, x: (c, x), 0, jnp.arange(5), unroll=-1),
    "not_callable": lambda scan: scan(3, 0.0, jnp.ones(5)),
}


@schedules
@parametrize("case", sorted(ERRORS))
def test_errors_are_lax_scans(schedule, case):
    call = ERRORS[case]
    kind, message = _lax_error(call)
    with pytest.raises(kind) as info:
        call(functools.partial(remat.scan, schedule=schedule))
    assert type(info.value) is kind
    assert message in str(info.value)
    if "remat.scan" not in message:  # remat's advice is a note (PEP 678) on lax's error
        assert "`remat.scan`" in "\n".join(getattr(info.value, "__notes__", ()))


@schedules
def test_lax_messages_are_unchanged(schedule):
    """lax.scan's message exactly (JAX's testScanLengthError matches it literally); remat's
    advice and the schedule are in the error's notes."""
    scan = functools.partial(remat.scan, schedule=schedule)
    with pytest.raises(ValueError) as info:
        scan(lambda *args: args, 0, jnp.arange(10), length=5)
    assert str(info.value) == (
        "scan got `length` argument of 5 which disagrees with leading axis sizes [10]."
    )
    assert any("got length=5 but xs has 10 steps" in n for n in info.value.__notes__)


@schedules
def test_traced_unroll_is_lax_concreteness_error(schedule):
    scan = functools.partial(remat.scan, schedule=schedule)
    f = jax.jit(lambda n, x: scan(lambda c, z: (c, z), x, (), 10, unroll=n))
    for n in (3, True):
        with pytest.raises(jax.errors.ConcretizationTypeError, match="`unroll` argument"):
            f(n, 1.0)


@parametrize("schedule", ["per_step", remat.Nested(2)], ids=str)
def test_unroll_true_leaves_no_loop(schedule):
    """As JAX's test_scan_unroll: ``unroll=True`` lowers the forward pass without a loop."""
    scan = functools.partial(remat.scan, schedule=schedule, unroll=True)
    hlo = jax.jit(lambda c, xs: scan(lambda c, x: (jnp.sin(c * x), c), c, xs))
    assert "while(" not in hlo.lower(jnp.ones(4), jnp.ones((20, 4))).as_text("hlo")


@schedules
def test_readonly_carry_is_a_constant(schedule):
    """A carry that the body returns unchanged leaves the loop, as in lax.scan: under a cond
    with a batched predicate it stays unbatched (JAX's test_scan_readonly_carry_optimization),
    and it is differentiated as a constant of the body."""
    scan = functools.partial(remat.scan, schedule=schedule)

    def f(x, y):
        def g(_, y):
            return scan(lambda y, _: (y, None), y, None, length=1)[0]

        return lax.cond(x < 0, g, g, x, y)

    assert float(jax.vmap(f, (0, None), None)(jnp.arange(3.0), 3.0)) == 3.0

    def loss(scan, w, c0, xs):
        def step(c, x):
            h, n, w_ = c
            return (jnp.tanh(w_ * h + x), n, w_), h * w_

        (h, n, _), ys = scan(step, (c0, 3, w), xs)
        assert n == 3  # returned as given, like lax.scan's
        return h + jnp.sum(ys)

    xs = jnp.linspace(0.0, 1.0, 7)
    want = jax.grad(functools.partial(loss, lax.scan), (0, 1, 2))(0.7, 0.3, xs)
    got = jax.grad(functools.partial(loss, scan), (0, 1, 2))(0.7, 0.3, xs)
    assert_tree_allclose(got, want)


@schedules
def test_non_integer_unroll_is_a_type_error(schedule):
    with pytest.raises(TypeError, match="'float' object cannot be interpreted as an integer"):
        remat.scan(lambda c, x: (c, x), 0.0, jnp.ones(5), unroll=1.5, schedule=schedule)


def test_what_cannot_apply():
    """Two `lax.scan` behaviours that a checkpointing schedule cannot share, on purpose.

    - A negative ``length`` is a `ValueError` in `remat.scan`; `lax.scan` has no check of
      its own for it (it fails later, with an unrelated `TypeError`).
    - `lax.scan`'s jaxpr (one ``scan`` equation, its residual layout, input-to-output
      forwarding) is not `remat.scan`'s, whose schedules build other loops; tests that read
      it are not conformance tests.
    """
    with pytest.raises(ValueError, match="got length=-1"):
        remat.scan(lambda c, x: (c, x), 0.0, length=-1)


@schedules
def test_closed_over_traced_int_key_and_float_under_jit(schedule):
    # Under `jit` the closed-over values are tracers: a float scale, an int table and a PRNG
    # key (the last two are never differentiated, so `jax.closure_convert` would leave them
    # closed over inside the staged-out derivative).
    ws = jnp.linspace(0.1, 0.9, N * 9).reshape(N, 3, 3)

    def loss(scan, ws, c0, scale, table, key):
        def body(c, wi):
            w, i = wi
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.8, c.shape)
            c = jnp.tanh(w @ c) * scale + table[i] * jnp.where(keep, c, 0.0)
            return c, c.sum()

        c, ys = scan(body, c0, (ws, jnp.arange(N)))
        return jnp.sum(c**2) + jnp.sum(ys)

    got, want = pair(schedule)
    args = (ws, jnp.ones(3), 0.7, jnp.arange(N) % 3, jax.random.key(1))
    grad = lambda scan: jax.jit(jax.value_and_grad(functools.partial(loss, scan), (0, 1, 2)))  # noqa: E731
    assert_tree_allclose(grad(got)(*args), grad(want)(*args))
