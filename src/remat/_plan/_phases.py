"""What a scan adds to the step's peak, by phase (`PhaseModel`).

A scan compiled alone (`remat._plan._body`) has the step's loops without the step around
them: no loss head between the loops, no parameters' gradients beside the backward loop.
The step adds a different amount to each phase (`remat._measure._phases.LoopPhases`), and
which phase sets the step's peak depends on the save set: with everything saved, XLA's
float32 copies of bfloat16 stacks overlap their originals at the scan-alone program's peak
and not at the step's (it makes them before the loss head); with little saved, the loss
head's values beside the stacks set the step's peak, where the scan-alone program peaks in
its backward loop. The scan-alone peak plus one margin mispredicted the step by 3% at 80
layers (measured on a Llama-style decoder: what the step adds beside the backward loop and
between the loops each stayed within 0.1 MB over five save sets).

So each phase's addition is read once, from the un-checkpointed step and its scan compiled
alone as written, and a save set's contribution is the largest of its scan-alone phases,
each moved by what the step adds to that phase beyond what it adds beside the backward loop
(`contribution`); the margin (`remat._plan._calibrate.Prepared.margin`) is then what the step
adds beside the backward loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._measure._phases import LoopPhases


@dataclasses.dataclass(frozen=True)
class ScanMemory:
    """A scan-alone program's compiled memory (`remat._measure._peak.CompiledMemory`) and,
    where read from XLA's dump, its phases."""

    memory: Any
    phases: LoopPhases | None = None

    @property
    def temp_bytes(self) -> int:
        return self.memory.temp_bytes


@dataclasses.dataclass(frozen=True)
class PhaseModel:
    """What the step adds to a scan's phases, relative to what it adds beside the backward
    loop (`phase_model`).

    Attributes:
      between: added to the scan-alone program's bytes as its backward loop starts (the
        step's loss head sits between the loops).
      forward: added to the scan-alone program's forward phase.
      shift: added to the temporaries of a scan-alone program whose phases were not read
        (a `remat.Nested` or `remat.Binomial` schedule's loops): the as-written scan's
        contribution minus its temporaries, so that such a program is predicted as the
        margin of the un-checkpointed step predicts it.
    """

    between: float
    forward: float
    shift: float = 0.0


def phase_model(step: LoopPhases, written: ScanMemory) -> PhaseModel | None:
    """The `PhaseModel` from the un-checkpointed step's phases and its one scan compiled
    alone as written; None where the latter's phases were not read.

    Example:
      >>> from remat._measure._phases import LoopPhases
      >>> from remat._measure._peak import CompiledMemory
      >>> from remat._plan._phases import ScanMemory, phase_model, contribution
      >>> step = LoopPhases(forward=290, between=380, entry=360, backward=362, after=135)
      >>> alone = ScanMemory(CompiledMemory.from_parts(temp=232, argument=28, output=28,
      ...                    alias=0), LoopPhases(205, 288, 281, 283, 57))
      >>> model = phase_model(step, alone)
      >>> model.between, model.forward
      (20.0, 6.0)
      >>> contribution(alone, model)  # the loss head beside every stack sets the peak
      245.0
    """
    if written.phases is None:
        return None
    a = written.phases
    beside = step.backward - a.backward
    model = PhaseModel(
        between=float(step.between - a.entry - beside),
        forward=float(step.forward - a.forward - beside),
    )
    return dataclasses.replace(model, shift=contribution(written, model) - written.temp_bytes)


def contribution(scan: ScanMemory, model: PhaseModel | None) -> float:
    """What a scan-alone program adds to the step's peak beyond the step's arguments and
    outputs and the margin: its temporaries where there is no model, else the largest of its
    phases as the step moves them (see `PhaseModel`), less its own arguments and outputs."""
    if model is None:
        return float(scan.temp_bytes)
    if scan.phases is None:
        return float(scan.temp_bytes + model.shift)
    m, p = scan.memory, scan.phases
    io = m.argument_bytes + m.output_bytes - m.alias_bytes
    return float(max(p.backward, p.entry + model.between, p.forward + model.forward) - io)
