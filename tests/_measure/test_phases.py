"""`loop_phases`: the phases of a differentiated scan's program, read from XLA's dump.

The five phases partition the schedule, so the largest of them is the most bytes live at any
position (`live_bytes`), which on CPU is the compiled peak less the temporaries buffer's
unused bytes; the backward loop starts with what the forward pass left for it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat._measure._memory import live_bytes, read_memory
from remat._measure._peak import compiled_memory
from remat._measure._phases import loop_phases
from remat._measure._xla_dump import compile_with_dump


def _loss(ws, x):
    x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
    return jnp.sum(x * x)


@pytest.fixture(scope="module")
def dumped():
    ws, x = jnp.ones((6, 32, 32)), jnp.ones((16, 32))
    compiled, dump = compile_with_dump(jax.jit(jax.grad(_loss)).lower(ws, x))
    return compiled, dump


def test_the_largest_phase_is_the_most_bytes_live(dumped):
    compiled, dump = dumped
    phases = loop_phases(dump)
    assert phases is not None
    live = live_bytes(dump)
    assert phases.largest == live.max()
    view = read_memory(dump, compiled_memory(compiled).peak_bytes)
    assert live.max() == view.live_peak_bytes  # the same buffers `remat.memory` counts


def test_the_backward_loop_starts_with_the_forward_pass_residuals(dumped):
    _, dump = dumped
    phases = loop_phases(dump)
    # Six steps of (16, 32) float32 residuals (tanh's output) at least are live as it starts.
    assert phases.entry <= phases.backward
    assert phases.entry >= 6 * 16 * 32 * 4


def test_a_program_without_loops_has_no_phases():
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    _, dump = compile_with_dump(jax.jit(jax.grad(loss)).lower(jnp.ones((8, 8)), jnp.ones((4, 8))))
    assert loop_phases(dump) is None


def test_passing_is_the_stack_consumed_at_the_peak_between_the_loops():
    """A bfloat16 scan: between the loops XLA holds the six steps' (16, 32) bfloat16 stack
    from the forward pass as it consumes it (its float32 copy for the backward loop), and the
    phase's most bytes count it (`LoopPhases.passing`)."""

    def loss(ws, x):
        def step(y, w):
            return jnp.tanh(y @ w.astype(jnp.bfloat16)).astype(jnp.bfloat16), None

        x, _ = jax.lax.scan(step, x.astype(jnp.bfloat16), ws)
        return jnp.sum(x.astype(jnp.float32) ** 2)

    ws, x = jnp.ones((6, 32, 32)), jnp.ones((16, 32))
    _, dump = compile_with_dump(jax.jit(jax.grad(loss)).lower(ws, x))
    phases = loop_phases(dump)
    assert phases.passing == 6 * 16 * 32 * 2
    # Without it, the phase holds less than the backward loop starts with.
    assert phases.between - phases.passing < phases.entry < phases.between
