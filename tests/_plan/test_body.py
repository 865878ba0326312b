"""A scan-alone program derived from the body traced once is the program traced with its
save set: the same lowered text and the same compiled memory, byte for byte."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from conftest import fixed_save_sets, mlp_stack
from remat._measure._peak import compiled_memory
from remat._models._gpt import make_gpt
from remat._models._maxtext import decoder_shapes
from remat._plan import _body
from remat._plan._compile import SCAN, compile_lowered, scan_options
from remat._plan._costmodel import model_scans
from remat._trace._tag import ScanChoice

# A bf16 Llama-style decoder from shapes alone (GQA, SwiGLU, MaxText's names), small.
DECODER = dict(layers=2, d_model=32, heads=4, kv_heads=2, mlp_dim=64, seq=16, batch=1,
               vocab=64, dtype=jnp.bfloat16)  # fmt: skip


def programs(loss, args):
    """The scan, its length, and four save sets: every needed value, none, the unfused
    values, and the program's own names (or two matmul outputs)."""
    info, length, choices = fixed_save_sets(loss, args)
    values = model_scans([info])[0].values
    named = [v.name for v in values if v.user_name] or [v.name for v in values if v.flops][:2]
    return info, length, [*choices, ScanChoice(names=tuple(named))]


@pytest.fixture(scope="module", params=["decoder", pytest.param("gpt", marks=pytest.mark.slow)])
def case(request):
    if request.param == "gpt":
        return programs(*make_gpt(layers=2, d_model=32, seq=16, batch=2, heads=2))
    return programs(*decoder_shapes(None, DECODER))


def test_each_save_sets_program_is_the_one_traced_with_it(case, monkeypatch):
    info, length, choices = case
    temps = set()
    for choice in choices:
        assert _body._derivable(choice)
        derived = _body.lower_scan(info, choice, length)
        with monkeypatch.context() as m:
            m.setattr(_body, "_derivable", lambda _: False)
            traced = _body.lower_scan(info, choice, length)
        assert derived.as_text() == traced.as_text()
        memory = [compiled_memory(compile_lowered(p, SCAN, options=scan_options()))
                  for p in (derived, traced)]  # fmt: skip
        assert memory[0] == memory[1]
        temps.add(memory[0].temp_bytes)
    assert len(temps) > 2  # the save sets are different programs


def test_the_body_is_traced_once_for_every_save_set(case, monkeypatch):
    info, length, choices = case
    traced = []
    original = _body.scan_program

    def counted(info_, choice, length_):
        traced.append(choice)
        return original(info_, choice, length_)

    monkeypatch.setattr(_body, "scan_program", counted)
    monkeypatch.setattr(_body, "_FORWARDS", type(_body._FORWARDS)())
    for choice in choices:
        _body.lower_scan(info, choice, length)
    assert [c.names for c in traced] == [()]  # the forward program, with a placeholder policy
    _body.lower_scan(info, None, length)  # as written: no checkpoint to put a policy in
    assert traced[1:] == [None]


def test_mixes_sharing_a_save_set_reuse_its_layers_traces(case, monkeypatch):
    """A per-layer program's layers are the same checkpointed functions for one scan body and
    save set (`_periodic._layer`, `_body._bodies`): a mix lowered after another sharing one
    of its sets traces the body fewer times, and lowers to the same program."""
    from remat._trace import _periodic

    info, length, choices = case
    shared, other, third = choices[3].names, (), choices[2].names

    def mix(a, b):
        return ScanChoice(names=tuple(sorted({*a, *b})), pattern=(a,) * (length - 1) + (b,))

    calls = []
    traced = _body.eval_tagged
    monkeypatch.setattr(_body, "eval_tagged", lambda *a: calls.append(1) or traced(*a))
    monkeypatch.setattr(_body, "_BODIES", {})
    monkeypatch.setattr(_periodic, "_LAYERS", {})
    _body.lower_scan(info, mix(shared, other), length)
    calls.clear()
    after = _body.lower_scan(info, mix(shared, third), length).as_text()
    reused = len(calls)
    monkeypatch.setattr(_body, "_BODIES", {})
    monkeypatch.setattr(_periodic, "_LAYERS", {})
    calls.clear()
    fresh = _body.lower_scan(info, mix(shared, third), length).as_text()
    assert reused < len(calls)
    assert after == fresh


def test_a_scan_alone_as_written_keeps_the_programs_checkpoints():
    # The scan-alone program "as written" (``choice=None``) measures the memory outside the
    # scans (`Prepared.margin`): a body the program checkpoints itself saves nothing.
    def loss(params, x):
        block = jax.checkpoint(lambda h, w: (h + jnp.tanh(h @ w[0]) @ w[1], None),
                               policy=jax.checkpoint_policies.nothing_saveable)  # fmt: skip
        return jnp.mean(jax.lax.scan(block, x, params)[0] ** 2)

    info, length, (_, nothing, _) = fixed_save_sets(loss, mlp_stack(layers=4, batch=64)[1])
    temp = {name: _body.scan_memory(info, choice, length).temp_bytes
            for name, choice in [("written", None), ("nothing", nothing),
                                 ("plain", ScanChoice(names=None))]}  # fmt: skip
    assert temp["written"] == temp["nothing"] < temp["plain"]


def test_a_scan_alone_as_written_without_checkpoints_runs_flattened():
    # Without checkpoints of its own the body runs as every candidate's does, its jitted
    # calls inlined: kept, XLA packs the scan-alone program otherwise, and the memory outside
    # the scans learnt from it moves (Llama-3-8B presets, `benchmarks/scale_bench.py`).
    def loss(params, x):
        mlp = jax.jit(lambda h, w: jnp.tanh(h @ w[0]) @ w[1])
        return jnp.mean(jax.lax.scan(lambda h, w: (h + mlp(h, w), None), x, params)[0] ** 2)

    info, length, _ = fixed_save_sets(loss, mlp_stack(layers=4, batch=64)[1])
    written = _body.lower_scan(info, None, length).as_text()
    assert written == _body.lower_scan(info, ScanChoice(names=None), length).as_text()
