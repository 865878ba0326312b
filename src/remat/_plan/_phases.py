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

Between the loops XLA holds one more buffer as it consumes it (`LoopPhases.passing`: a
bfloat16 stack of zeros converted to float32 for the backward loop), and which one differs
between programs whose loops are the same: at Llama-3-70B shapes the un-checkpointed step
holds a 35 GiB weight-shaped stack there where its scan alone holds a 17.5 GiB
activation-shaped one, while the steps of the plans hold what their scans alone hold. So the
un-checkpointed step is read as holding no more than its scan alone holds (`as_alone`); read
as it is, it put every plan 17.5 GiB (1.5%) over its compiled peak. (At Llama-3-8B shapes
the step's peak between the loops is the loss head's, where a head value of 1.96 GiB is
consumed, less than the 3.5 GiB stack its scan alone holds: it is read as it is.)
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
    step = as_alone(step, a)
    beside = step.backward - a.backward
    model = PhaseModel(
        between=float(step.between - a.entry - beside),
        forward=float(step.forward - a.forward - beside),
    )
    return dataclasses.replace(model, shift=contribution(written, model) - written.temp_bytes)


def as_alone(step: LoopPhases, alone: LoopPhases) -> LoopPhases:
    """The step's phases less what it holds as it is consumed at its peak between the loops
    (`LoopPhases.passing`) beyond what its scan alone holds so (see the module docstring).
    Where the step holds less, its peak between the loops is elsewhere (the loss head's
    values), and it is read as it is.

    Example:
      >>> from remat._measure._phases import LoopPhases
      >>> from remat._plan._phases import as_alone
      >>> step = LoopPhases(200, 290, 250, 260, 100, passing=35)
      >>> as_alone(step, LoopPhases(150, 180, 170, 175, 50, passing=10)).between
      265
      >>> as_alone(step, LoopPhases(150, 180, 170, 175, 50, passing=40)).between
      290
    """
    excess = max(step.passing - alone.passing, 0)
    return dataclasses.replace(step, between=step.between - excess, passing=step.passing - excess)


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
