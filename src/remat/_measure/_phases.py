"""The phases of a differentiated scan's program, read from XLA's dump: the most bytes live
before and during the forward loop, between the two loops (a step's loss head), as the
backward loop starts, during it, and after it (a step's optimizer update).

A step's peak is the largest of these, and each phase holds a different part of the scan's
memory: between the loops every stacked residual is live (and, on CPU, XLA's float32 copies
of bfloat16 stacks, made before the backward loop starts) beside the loss head's values;
during the backward loop, one step's working values beside the stacks. The planner reads the
same phases of a scan compiled alone (`remat._plan._body`) to tell which phase sets the
step's peak for a save set (`remat._plan._phases`).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat._measure._phases import loop_phases
  >>> from remat._measure._xla_dump import compile_with_dump
  >>> def loss(ws, x):
  ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
  ...     return x.sum()
  >>> lowered = jax.jit(jax.grad(loss)).lower(jnp.ones((4, 16, 16)), jnp.ones((8, 16)))
  >>> phases = loop_phases(compile_with_dump(lowered)[1])
  >>> phases.entry <= phases.backward
  True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._memory import live_spans
from ._xla_dump import Dump


@dataclasses.dataclass(frozen=True)
class LoopPhases:
    """Most bytes live in each phase of a program with one forward and one backward loop
    (every figure counts the buffers XLA's memory analysis counts, arguments included).

    Attributes:
      forward: up to the end of the forward loop.
      between: after the forward loop, before the backward loop.
      entry: as the backward loop starts (what the forward pass left for it).
      backward: during the backward loop.
      after: after the backward loop (0 when nothing follows it).
      passing: of ``between``, where it is reached as an input of the backward loop is
        made, the bytes of the buffers held since the forward loop that die there (e.g. a
        stack XLA converts to float32 for the backward loop): which buffer XLA holds so
        differs between programs whose loops are the same (see `remat._plan._phases`).
    """

    forward: int
    between: int
    entry: int
    backward: int
    after: int
    passing: int = 0

    @property
    def largest(self) -> int:
        """The most bytes live in any phase: on CPU, the compiled peak less the temporaries
        buffer's unused bytes."""
        return max(self.forward, self.between, self.entry, self.backward, self.after)


def loop_phases(dump: Dump) -> LoopPhases | None:
    """The `LoopPhases` of a compiled program, or None unless its loops are one forward loop
    (instructions whose ``op_name`` has ``/while`` and no ``transpose(``) wholly before one
    backward loop (``transpose(`` and ``/while``), with something between them."""
    forward, backward = [], []
    for i, name in enumerate(dump.sequence):
        op_name = dump.op_names.get(name, "")
        if "/while" in op_name:
            (backward if "transpose(" in op_name else forward).append(i)
    if not forward or not backward or forward[-1] >= backward[0] - 1:
        return None
    spans, live = live_spans(dump)
    end, start, stop = forward[-1] + 1, backward[0], backward[-1] + 1
    most = end + int(np.argmax(live[end:start]))
    return LoopPhases(
        forward=int(live[:end].max()),
        between=int(live[most]),
        entry=int(live[start]),
        backward=int(live[start:stop].max()),
        after=int(live[stop:].max()) if stop < len(live) else 0,
        passing=_passing(spans, end, most, start),
    )


def _passing(spans, end: int, most: int, start: int) -> int:
    """`LoopPhases.passing`: where the instruction at ``most`` (the peak between the loops)
    makes a buffer the backward loop starts with (live at ``start``), the bytes of the
    buffers held since the forward loop (from before ``end``) that die there; else 0."""
    if not any(first == most and last >= start for first, last, _ in spans):
        return 0
    return sum(size for first, last, size in spans if last == most and first < end)
