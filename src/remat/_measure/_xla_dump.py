"""The reader of XLA's own account of a compiled program's memory.

``lowered.compile({"xla_dump_to": DIR})`` makes XLA write, for that one compile, the
module's buffer assignment (``*-buffer-assignment.txt``: every allocation, its size and kind,
and the values placed in it at which offset), the values' uses and output positions
(``*-buffer-assignment-values.txt``), the live range of every value along the instruction
sequence (``*-live-range.txt``: the sequence of every computation flattened in execution
order, loop bodies once) and the optimised HLO (``*after_optimizations.txt``: each
instruction's ``op_name``, which names the JAX transform, scope and primitive). This module
compiles with a temporary dump folder, reads those files (jax 0.10, every backend writes
them) and returns them as plain data: `Dump`. What the values are (parameters, gradients,
saved residuals, ...) is decided in `remat._measure._memory`.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ._hbm import lowered_platform, no_persistent_cache, record
from ._read_options import read_options

_NO_DUMP = (
    "`remat.memory`: XLA wrote no buffer assignment into its dump folder ({folder}: {files}); "
    "the backend {backend!r} may not support `xla_dump_to`. Use `remat.measure` for the peak."
)

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):$")
_VALUE = re.compile(
    r"^ value: <(\d+) (\S+?)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$"
)
_PARAMETER = re.compile(r"parameter (\d+)")
_RANGE = re.compile(r"^\s+(\S+?)(\{[\d,]*\}):(\d+)-(\d+)$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%(\S+) = (.*?) (\S+?)\((.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_VALUE_HEAD = re.compile(r"^<(\d+) (\S+?)(\{[\d,]*\})?(?: \(phi\))? @\d+>$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*\{$")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_POSITION = re.compile(r"^  (\S+)(?: \{([\d,]*)\})?$")


@dataclasses.dataclass(frozen=True)
class Value:
    """One value in XLA's buffer assignment.

    Attributes:
      key: the instruction's name and output index, as the live-range file writes it
        (``"while.12{2}"``; ``"{}"`` for a whole output).
      allocation: the index of the allocation it is placed in.
      offset, size: where in that allocation, in bytes.
      shape: XLA's shape text, e.g. ``"f32[4,8,16]{2,1,0}"``.
    """

    key: str
    allocation: int
    offset: int
    size: int
    shape: str

    @property
    def instruction(self) -> str:
        return self.key.split("{", 1)[0]


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One allocation of XLA's buffer assignment.

    Attributes:
      index, size: its number and bytes.
      parameter: the entry parameter it holds, or None.
      output: it holds (part of) the program's output.
      temp: it is (a part of) the temporaries buffer.
      counted: it is memory that XLA's memory analysis counts (not a constant compiled into
        the executable nor a thread-local scratch value).
    """

    index: int
    size: int
    parameter: int | None
    output: bool
    temp: bool
    counted: bool


@dataclasses.dataclass(frozen=True)
class Dump:
    """What XLA wrote about one compiled module's memory, parsed.

    Attributes:
      allocations: every allocation, by index.
      values: every value placed in an allocation.
      sequence: the instructions in the order XLA schedules them (loop bodies once).
      ranges: ``key -> (first, last)`` position of every value in ``sequence``.
      op_names: ``instruction -> op_name`` from the optimised HLO's metadata.
      opcodes: ``instruction -> opcode`` from the optimised HLO.
      outputs: ``key -> flat output index`` for the values that are the program's outputs.
      operands: ``instruction -> operand instructions`` from the optimised HLO.
      shapes: ``instruction -> shape text`` from the optimised HLO.
      calls: ``fusion instruction -> the computation it calls``.
      roots: ``computation -> its root instruction``.
      parameters: ``parameter instruction -> (its computation, its number)``.
    """

    allocations: dict[int, Allocation]
    values: tuple[Value, ...]
    sequence: tuple[str, ...]
    ranges: dict[str, tuple[int, int]]
    op_names: dict[str, str]
    opcodes: dict[str, str]
    outputs: dict[str, int]
    operands: dict[str, tuple[str, ...]]
    shapes: dict[str, str]
    calls: dict[str, str] = dataclasses.field(default_factory=dict)
    roots: dict[str, str] = dataclasses.field(default_factory=dict)
    parameters: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)


def parse_buffer_assignment(text: str) -> tuple[dict[int, Allocation], tuple[Value, ...]]:
    """The allocations and values of a ``*-buffer-assignment.txt`` file."""
    allocations: dict[int, Allocation] = {}
    values: list[Value] = []
    current = None
    for line in text.splitlines():
        head = _ALLOCATION.match(line)
        if head:
            index, size, rest = int(head[1]), int(head[2]), head[3]
            param = _PARAMETER.search(rest)
            output = "live-out" in rest or "output shape" in rest
            uncounted = "constant" in rest or "thread-local" in rest
            allocations[index] = Allocation(
                index=index,
                size=size,
                parameter=int(param[1]) if param else None,
                output=output,
                temp=not (param or output or uncounted),
                counted=not uncounted,
            )
            current = index
            continue
        value = _VALUE.match(line)
        if value and current is not None:
            values.append(
                Value(
                    key=value[2] + (value[3] or "{}"),
                    allocation=current,
                    offset=int(value[5]),
                    size=int(value[4]),
                    shape=value[6].strip(),
                )
            )
    return allocations, tuple(values)


def parse_live_range(text: str) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """The instruction sequence and each value's live range from a ``*-live-range.txt``."""
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "InstructionSequence:":
            section = "sequence"
        elif stripped == "BufferLiveRange:":
            section = "ranges"
        elif stripped.startswith("Live ranges at"):
            section = None
        elif section == "sequence" and ":" in stripped:
            sequence.append(stripped.split(":", 1)[1])
        elif section == "ranges":
            match = _RANGE.match(line)
            if match:
                ranges[match[1] + match[2]] = (int(match[3]), int(match[4]))
    return tuple(sequence), ranges


@dataclasses.dataclass
class Hlo:
    """The instructions of an optimised HLO module (see `Dump` for the fields)."""

    op_names: dict[str, str] = dataclasses.field(default_factory=dict)
    opcodes: dict[str, str] = dataclasses.field(default_factory=dict)
    operands: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    shapes: dict[str, str] = dataclasses.field(default_factory=dict)
    calls: dict[str, str] = dataclasses.field(default_factory=dict)
    roots: dict[str, str] = dataclasses.field(default_factory=dict)
    parameters: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    entry_root: str | None = None


def parse_hlo(text: str) -> Hlo:
    """The instructions of an optimised HLO module's text."""
    hlo = Hlo()
    computation, in_entry = None, False
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            computation, in_entry = head[2], bool(head[1])
            continue
        match = _INSTRUCTION.match(line)
        if not match or computation is None:
            continue
        name, opcode = match[2], match[4]
        hlo.opcodes[name] = opcode
        hlo.shapes[name] = match[3]
        args = match[5].split(")", 1)
        hlo.operands[name] = tuple(_OPERAND.findall(args[0]))
        if opcode == "parameter":
            hlo.parameters[name] = (computation, int(args[0] or 0))
        called = _CALLS.search(line)
        if called and opcode == "fusion":
            hlo.calls[name] = called[1]
        op_name = _OP_NAME.search(line)
        if op_name:
            hlo.op_names[name] = op_name[1]
        if match[1]:
            hlo.roots[computation] = name
            if in_entry:
                hlo.entry_root = name
    return hlo


def parse_outputs(text: str, root: str | None) -> dict[str, int]:
    """``value key -> flat output index`` from a ``*-buffer-assignment-values.txt`` file:
    the values with a position in the entry computation's root tuple (or the root itself)."""
    outputs: dict[str, int] = {}
    if root is None:
        return outputs
    key = None
    for line in text.splitlines():
        head = _VALUE_HEAD.match(line)
        if head:
            key = head[2] + (head[3] or "{}")
            continue
        position = _POSITION.match(line)
        if key is not None and position and position[1] == root:
            index = position[2]
            if index:  # "tuple.9 {1}": output 1; nested tuples keep their first index
                outputs[key] = int(index.split(",")[0])
            else:
                outputs.setdefault(key, 0)
    return outputs


def _one(folder: Path, suffix: str) -> str:
    files = sorted(folder.glob(f"*{suffix}"))
    return files[-1].read_text() if files else ""


def read_dump(folder: Path | str, backend: str = "cpu") -> Dump:
    """Parses the dump of one compiled module in ``folder``."""
    folder = Path(folder)
    assignment = _one(folder, "after_optimizations-buffer-assignment.txt")
    if not assignment:
        files = ", ".join(sorted(p.name for p in folder.iterdir())[:5]) or "empty"
        raise RuntimeError(_NO_DUMP.format(folder=folder, files=files, backend=backend))
    allocations, values = parse_buffer_assignment(assignment)
    sequence, ranges = parse_live_range(_one(folder, "after_optimizations-live-range.txt"))
    hlo = parse_hlo(_one(folder, "after_optimizations.txt"))
    values_text = _one(folder, "after_optimizations-buffer-assignment-values.txt")
    return Dump(
        allocations=allocations,
        values=values,
        sequence=sequence,
        ranges=ranges,
        op_names=hlo.op_names,
        opcodes=hlo.opcodes,
        outputs=parse_outputs(values_text, hlo.entry_root),
        operands=hlo.operands,
        shapes=hlo.shapes,
        calls=hlo.calls,
        roots=hlo.roots,
        parameters=hlo.parameters,
    )


def compile_with_dump(lowered: Any, options: dict[str, Any] | None = None) -> tuple[Any, Dump]:
    """``lowered.compile(options)`` with XLA's dump written into a temporary folder (removed
    afterwards) and read: ``(compiled, Dump)``."""
    platform = lowered_platform(lowered)
    options = read_options(options, platform)
    folder = tempfile.mkdtemp(prefix="remat-xla-")
    try:
        with no_persistent_cache():
            compiled = lowered.compile({**(options or {}), "xla_dump_to": folder})
        record(compiled, folder)  # a TPU program's HBM, for the peak (`remat._measure._hbm`)
        return compiled, read_dump(folder, platform)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
