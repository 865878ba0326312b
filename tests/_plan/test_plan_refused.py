"""Planning where the compiler refuses the un-checkpointed step for memory (as XLA's TPU
compiler does above a chip's HBM): a checkpointed step stands in for it (`_plan._baseline`).

The CPU backend never refuses a program, so these tests stand in for the TPU compiler: every
whole step whose peak is over a limit raises the TPU compiler's error
(`refusal_message`), stating the bytes asked for, or not.
"""

import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._measure._peak import peak_bytes
from remat._measure._refusal import refusal_message, refusal_of
from remat._plan import _compile, _memo
from remat._plan._baseline import REFUSED, STATED


def loss(ws, x):
    def body(h, w):
        return jnp.tanh(jnp.sin(h @ w) @ w), None

    h, _ = jax.lax.scan(body, x, ws)
    return (h**2).sum()


WS, X = jnp.full((8, 64, 64), 0.01), jnp.ones((512, 64))


@pytest.fixture(scope="module")
def plain():
    return remat.measure(loss, WS, X, repeats=0)


@contextlib.contextmanager
def refusing(limit: int, stated: bool = True):
    """Whole steps over ``limit`` bytes refused as the TPU compiler refuses them; every
    refused compile's peak listed in the yielded list."""
    real = _compile.compile_lowered
    refused = []

    def compile_lowered(lowered, kind, read=None, options=None):
        out = real(lowered, kind, read, options)
        compiled = out if read is None else out[0]
        peak = peak_bytes(compiled)
        if kind == _compile.STEP and peak > limit:
            refused.append(peak)
            text = (
                refusal_message(peak, limit)
                if stated
                else "RESOURCE_EXHAUSTED: Ran out of memory on HBM"
            )
            raise jax.errors.JaxRuntimeError(text)
        return out

    _memo.forget()  # what is learned under a fake compiler is not kept
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_compile, "compile_lowered", compile_lowered)
        try:
            yield refused
        finally:
            _memo.forget()


def stated(n: int) -> int:
    """``n`` bytes as `refusal_message` states them (KiB to two decimals), read back."""
    return refusal_of(jax.errors.JaxRuntimeError(refusal_message(n, 1))).asked_bytes


def test_relative_budget_is_of_the_peak_the_refusal_states(plain):
    limit = plain.peak_bytes * 6 // 10
    with refusing(limit) as refused:
        p = remat.plan(loss, WS, X, budget="50%", verbose=False)
    assert refused[0] == plain.peak_bytes  # the first compile: the step as written
    assert p.baseline_peak_bytes == stated(plain.peak_bytes)
    assert p.budget_bytes == int(0.5 * p.baseline_peak_bytes)
    # the un-checkpointed FLOPs: the recomputing step's less the model's recomputed FLOPs
    assert p.baseline_flops == plain.flops
    assert p.measured_peak_bytes <= p.budget_bytes
    g, want = jax.grad(p.fn)(WS, X), jax.grad(loss)(WS, X)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


def test_stand_in_flops_are_the_jaxprs_whatever_the_compiler_adds_to_the_recomputing_step(plain):
    """Near a chip's memory the TPU compiler recomputes values of its own accord, so the step
    that recomputes everything can do more matmul FLOPs than its checkpoints ask for: the
    stand-in's FLOPs are the un-checkpointed step's counted on its jaxpr, never that step's
    measured FLOPs less the model's recomputation. Here the compiler is made to add 1 GFLOP
    to the recomputing step."""
    import dataclasses

    from remat._plan import _baseline

    extra = 1e9
    real = _baseline.compile_measure

    def compile_measure(fn, args, argnums, label, baseline, **kw):
        out = real(fn, args, argnums, label, baseline, **kw)
        return dataclasses.replace(out, flops=out.flops + extra) if label == "full" else out

    limit = plain.peak_bytes * 6 // 10
    with refusing(limit), pytest.MonkeyPatch.context() as mp:
        mp.setattr(_baseline, "compile_measure", compile_measure)
        p = remat.plan(loss, WS, X, budget="50%", verbose=False)
        know = next(iter(_memo._MEMORY.values()))
    assert p.baseline_flops == plain.flops == _baseline.traced_step_flops(loss, (WS, X), 0)
    # the recomputing step less the model's recomputation would have been 1 GFLOP over it
    ((nothing, full),) = know.prepared.compiled
    assert nothing.flops > 0
    assert full.flops - nothing.flops == pytest.approx(plain.flops + extra, rel=1e-9)


def test_budget_above_what_the_compiler_gives_is_planned_at_it(plain):
    limit = plain.peak_bytes * 6 // 10
    with refusing(limit), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = remat.plan(loss, WS, X, budget=plain.peak_bytes, verbose=False)
    said = [str(w.message) for w in caught if issubclass(w.category, remat.RematWarning)]
    assert any("above the" in s and "the compiler gives a program" in s for s in said), said
    given = refusal_of(jax.errors.JaxRuntimeError(refusal_message(1, limit))).available_bytes
    assert p.budget_bytes == given
    assert p.measured_peak_bytes <= given


def test_unstated_refusal_refuses_a_relative_budget_and_plans_bytes(plain):
    limit = plain.peak_bytes * 6 // 10
    with refusing(limit, stated=False) as refused:
        with pytest.raises(ValueError, match=r"`remat.plan` got the relative budget '50%'.*bytes"):
            remat.plan(loss, WS, X, budget="50%", verbose=False)
        # a budget over the limit: plans the compiler refuses are excluded, never returned
        p = remat.plan(loss, WS, X, budget=plain.peak_bytes * 9 // 10, verbose=False)
        know = next(iter(_memo._MEMORY.values()))
    assert p.measured_peak_bytes <= limit
    assert p.measured.peak_source != REFUSED
    assert know.prepared.baseline.peak_source == STATED
    # unstated: one byte over the step that recomputes everything, a lower bound
    full = remat.measure(remat.apply(loss, "full"), WS, X, repeats=0)
    assert know.prepared.baseline.peak_bytes == full.peak_bytes + 1
    assert know.prepared.baseline.flops == plain.flops
    sources = [k.measured.peak_source for k in know.measured.values()]
    assert sources.count(REFUSED) == len(refused) - 1 > 0  # every refusal but the baseline


def test_layers_in_a_python_loop_refused_as_written_are_rolled_and_planned():
    """The program without scans (the same 8 layers in a Python loop) refused as written: the
    planner rolls its layers and plans the rolled program as a refused scanned program is
    planned (its un-checkpointed step refused too: the step that recomputes everything
    stands in); the plan compiles under the budget and keeps the gradients."""

    def unrolled(ws, x):
        h = x
        for i in range(ws.shape[0]):
            h = jnp.tanh(jnp.sin(h @ ws[i]) @ ws[i])
        return (h**2).sum()

    written = remat.measure(unrolled, WS, X, repeats=0).peak_bytes
    limit = written * 8 // 10
    with refusing(limit) as refused:
        p = remat.plan(unrolled, WS, X, budget=limit * 19 // 20, verbose=False)
    assert refused[0] == written and len(refused) >= 2
    assert p.rolled
    assert p.baseline_peak_bytes == stated(refused[1])  # the rolled program, un-checkpointed
    assert p.measured_peak_bytes <= p.budget_bytes == limit * 19 // 20
    g, want = jax.grad(p.fn)(WS, X), jax.grad(unrolled)(WS, X)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


def test_other_compile_errors_are_not_refusals():
    assert refusal_of(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: bad")) is None
    r = refusal_of(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM"))
    assert (r.asked_bytes, r.available_bytes, r.over_bytes) == (None, None, None)


def test_offloaded_values_the_compiler_kept_on_the_device_are_said(plain):
    """A plan that offloads but whose compiled step keeps nothing in host memory warns (the
    transfers it was priced for do not happen); on CPU, with no host memory of its own, or
    with host bytes, nothing is said."""
    import dataclasses
    import types

    from remat._plan._baseline import check_offloaded

    choice = types.SimpleNamespace(choices={0: types.SimpleNamespace(offload=("act",))})
    on_tpu = dataclasses.replace(plain, backend="tpu", host_bytes=0)
    with pytest.warns(remat.RematWarning, match="offloads act to host memory, but the step"):
        check_offloaded(choice, on_tpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_offloaded(choice, dataclasses.replace(on_tpu, host_bytes=2**20))
        check_offloaded(choice, plain)  # cpu


def test_a_refused_scan_alone_program_is_the_size_its_refusal_states():
    """A scan compiled alone that the compiler refuses (its calibration point saving every
    value, over a chip's HBM) is as large as the refusal states: its temporaries are that
    less its arguments (the weights, the carry and the carry's cotangent) and outputs (the
    gradients of the weights and the carry)."""
    from remat._plan._body import _lowered, _memory, _Refusable

    (info,) = remat.list_scans(loss, WS, X[:8])
    lowered, io = _lowered(info, None, info.length)
    argument, output = io
    weights, carry = 8 * 64 * 64 * 4, 8 * 64 * 4
    assert (argument, output) == (weights + 2 * carry, weights + carry)

    class Refused:
        def compile(self, options=None):
            raise jax.errors.JaxRuntimeError(refusal_message(3 * 2**20, 2**20))

    memory = _memory(_Refusable(Refused(), io, "cpu").compile())
    assert memory.temp_bytes == 3 * 2**20 - argument - output
    assert memory.peak_bytes == 3 * 2**20
    assert _memory(_Refusable(lowered, io, "cpu").compile()).temp_bytes > 0  # compiles on CPU


def test_a_refusable_scan_alone_program_is_compiled_once_by_its_own_method(monkeypatch):
    """`compile_lowered` hands a scan-alone `_Refusable` program to its own
    ``compile_measured`` (which measures its lowering, on the platform that lowering is for),
    never to `compile_measured` on the wrapper, whose platform it cannot read."""
    from remat._plan import _body
    from remat._plan._body import _lowered, _memory, _Refusable

    (info,) = remat.list_scans(loss, WS, X[:8])
    lowered, io = _lowered(info, None, info.length)
    calls = []
    for module in (_body, _compile):
        real = module.compile_measured
        monkeypatch.setattr(module, "compile_measured",
                            lambda low, options=None, real=real: calls.append(low) or real(low, options))  # fmt: skip
    compiled = _compile.compile_lowered(_Refusable(lowered, io, "cpu"), _compile.SCAN)
    assert calls == [lowered]
    assert _memory(compiled).temp_bytes > 0
