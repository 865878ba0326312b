"""Where a compiled step's memory goes: live bytes along XLA's schedule, and what is live at
the peak, read from XLA's buffer assignment (`remat._measure._xla_dump`).

XLA places every value of the optimised program in an allocation at an offset; values that
share a place one after the other (a loop's carry and the loop body's output, a stacked
residual and the loop that fills it) form one *buffer*. `read_memory` joins them, gives each
buffer a kind and a label, and adds up the bytes of the buffers live at every position of
the schedule (every computation's instructions in execution order, each loop body once, as
XLA's ``HloLiveRange`` lists them).

Kinds (`KINDS`):

- ``parameter``, ``optimizer state``, ``input``: the step's arguments (what ``argnums``
  differentiates, the optimizer state of a training step, everything else), live throughout;
- ``gradient``: the gradients the step returns (and their accumulators in the backward pass);
  ``output``: the loss, aux outputs, and the updated parameters of a training step;
- ``saved``: a value produced by the forward pass and read by the backward pass: what
  autodiff keeps (a scan's stacked residuals: one copy per step), named by its
  `checkpoint_name` where the traced program has one (`remat.Measurement.residuals`);
- ``recomputation``: a value the backward pass recomputes (inside a checkpoint's
  rematerialised computation);
- ``temporary``: every other intermediate.

On the CPU backend the compiled peak (`remat._measure._peak`) counts the whole temporaries
buffer and every output for the whole run; the bytes live at the busiest position add up to
it up to the temporaries buffer's fragmentation, which `MemoryView.unused_bytes` reports.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ._measurement import Residual
from ._xla_dump import Allocation, Dump, Value

PARAMETER = "parameter"
OPTIMIZER = "optimizer state"
INPUT = "input"
GRADIENT = "gradient"
OUTPUT = "output"
SAVED = "saved"
RECOMPUTE = "recomputation"
TEMPORARY = "temporary"
KINDS = (PARAMETER, OPTIMIZER, INPUT, GRADIENT, OUTPUT, SAVED, RECOMPUTE, TEMPORARY)

_SHAPE = re.compile(r"^(\w+)\[([\d,]*)\]")
_DTYPES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "s32": "int32",
    "s64": "int64", "s8": "int8", "s16": "int16", "u8": "uint8", "u32": "uint32",
    "u64": "uint64", "pred": "bool", "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}  # fmt: skip
_TRANSFORM = re.compile(
    r"^(jit|jvp|transpose|pjit|vmap|remat|checkpoint|closed_call|rematted_computation)(\(|$)"
)
_LOOK_THROUGH = ("bitcast", "copy", "get-tuple-element", "reshape", "tuple", "parameter")


@dataclasses.dataclass(frozen=True)
class LiveValue:
    """One buffer of the compiled step (live at the peak, in `MemoryView.live_at_peak`).

    Attributes:
      bytes: its size on one device.
      shape, dtype: of the whole buffer (a scan's stacked residual has the steps first).
      kind: one of `KINDS`.
      label: what it is: an argument's path (``"args[0]['w']"``), a saved value's
        `checkpoint_name` or primitive, ...
      steps: copies stacked in it, one per step of the scan that saved it (1 otherwise).
      scan: the named scope of the scan that saved or used it, e.g. ``"GPT.stack"``.
      op_name: the ``op_name`` XLA kept for the instruction that produced it.
      source: ``"file.py:12"`` of the traced value it was matched to, if any.
      start, end: the first and last position of the schedule where it is live.
      instruction: the name of the HLO instruction that produced it.
    """

    bytes: int
    shape: tuple[int, ...]
    dtype: str
    kind: str
    label: str
    steps: int = 1
    scan: str | None = None
    op_name: str = ""
    source: str | None = None
    start: int = 0
    end: int = 0
    instruction: str = ""

    def describe(self) -> str:
        """One line: the label, and for a stacked value its steps and scan."""
        text = self.label
        if self.steps > 1:
            text += f" × {self.steps} steps"
        if self.scan:
            text += f" of {self.scan}"
        return text


@dataclasses.dataclass(frozen=True)
class MemoryView:
    """The compiled step's memory along XLA's schedule: `remat.memory` returns it.

    Attributes:
      label: what was compiled (``"as written"``, a strategy's name, ``"plan"``).
      peak_bytes: the compiled peak, the figure `remat.measure` reports.
      live_bytes: bytes live at each position of the schedule.
      by_kind: ``(kind, bytes live at each position)`` for each kind present, in `KINDS`
        order; they add up to ``live_bytes``.
      peak_index: the position where the most bytes are live.
      backward_start: the first position of the backward pass (None if not found).
      op_names: the ``op_name`` of the instruction at each position (``""`` if none).
      live_at_peak: every buffer live at ``peak_index``, largest first.
      num_devices: devices the step runs on; every figure is per device.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
      ...     return x.sum()
      >>> view = remat.memory(loss, jnp.ones((4, 16, 16)), jnp.ones((8, 16)))
      >>> view.peak_bytes == remat.measure(loss, jnp.ones((4, 16, 16)), jnp.ones((8, 16)),
      ...                                  repeats=0).peak_bytes
      True
      >>> sum(v.bytes for v in view.live_at_peak) + view.unused_bytes == view.peak_bytes
      True
    """

    label: str
    peak_bytes: int
    live_bytes: tuple[int, ...]
    by_kind: tuple[tuple[str, tuple[int, ...]], ...]
    peak_index: int
    backward_start: int | None
    op_names: tuple[str, ...]
    live_at_peak: tuple[LiveValue, ...]
    num_devices: int = 1

    @property
    def live_peak_bytes(self) -> int:
        """Bytes live at the busiest position: ``live_bytes[peak_index]``."""
        return self.live_bytes[self.peak_index] if self.live_bytes else 0

    @property
    def unused_bytes(self) -> int:
        """What the compiled peak holds beyond the values live at the busiest position: the
        temporaries buffer's fragmentation and outputs not written yet (CPU)."""
        return self.peak_bytes - self.live_peak_bytes

    def kind_bytes_at_peak(self) -> dict[str, int]:
        """Bytes live at the peak per kind, largest first."""
        totals: collections.Counter[str] = collections.Counter()
        for value in self.live_at_peak:
            totals[value.kind] += value.bytes
        return dict(totals.most_common())

    def summary(self, top: int = 3) -> str:
        """One sentence: where the peak is and what fills it.

        Example:
          >>> import jax, jax.numpy as jnp, remat
          >>> def loss(ws, x):
          ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
          ...     return x.sum()
          >>> view = remat.memory(loss, jnp.ones((4, 64, 64)), jnp.ones((2048, 64)))
          >>> view.summary(top=1)[:42]
          'peak 8.6 MiB in the forward, at while/body'
        """
        mib = 2**20
        kinds = ", ".join(
            f"{kind} {nbytes / mib:.1f} MiB"
            for kind, nbytes in list(self.kind_bytes_at_peak().items())[:4]
        )
        largest = "; ".join(
            f"{v.describe()} {v.bytes / mib:.1f} MiB" for v in self.live_at_peak[:top]
        )
        return (
            f"peak {self.peak_bytes / mib:.1f} MiB in the {self.where()}: {kinds}. "
            f"Largest: {largest}."
        )

    def where(self, index: int | None = None) -> str:
        """``"forward"`` or ``"backward"`` and the op at a position (default: the peak)."""
        index = self.peak_index if index is None else index
        side = "forward"
        if self.backward_start is not None and index >= self.backward_start:
            side = "backward"
        return f"{side}, at {short_op_name(self.op_names[index]) or 'step ' + str(index)}"


### Reading the dump


def short_op_name(op_name: str) -> str:
    """An ``op_name`` without JAX's transform wrappers: ``"GPT.stack/while/body/.../dot_general"``."""
    parts = [p for p in op_name.split("/") if p and not _is_transform(p)]
    return "/".join(parts)


def _is_transform(part: str) -> bool:
    return bool(
        re.match(
            r"^(jit|jvp|transpose|pjit|vmap|remat|checkpoint|closed_call|rematted_computation)(\(|$)",
            part,
        )
    )


def scope_of(op_name: str) -> str | None:
    """The named scope of the loop an ``op_name`` is in: the part before ``/while``, or the
    first scope inside the loop's body when the loop has none (``flax.linen.scan``)."""
    short = "/" + short_op_name(op_name)
    if "/while" not in short:
        return None
    head, _, rest = short.partition("/while")
    head = head.strip("/")
    if head:
        return head
    parts = [p for p in rest.split("/") if p and p not in ("body", "cond")]
    return parts[0] if len(parts) > 1 else "scan"


def parse_shape(text: str) -> tuple[tuple[int, ...], str]:
    """``("f32[4,8]{1,0}") -> ((4, 8), "float32")``; tuples give ``((), "tuple")``."""
    match = _SHAPE.match(text)
    if not match:
        return (), "tuple"
    dims = tuple(int(d) for d in match[2].split(",") if d)
    return dims, _DTYPES.get(match[1], match[1])


@dataclasses.dataclass
class _Buffer:
    allocation: Allocation
    offset: int
    size: int
    start: int
    end: int
    values: list[Value]


def _buffers(dump: Dump) -> list[_Buffer]:
    """Values joined into buffers: values at one place whose live ranges touch."""
    slots: dict[tuple[int, int, int], list[tuple[int, int, Value]]] = collections.defaultdict(list)
    last = max(len(dump.sequence) - 1, 0)
    for value in dump.values:
        allocation = dump.allocations[value.allocation]
        if not allocation.counted or value.size == 0:
            continue
        start, end = dump.ranges.get(value.key, (0, last))
        if allocation.parameter is not None:
            start, end = 0, last  # arguments are held for the whole step
        slots[(value.allocation, value.offset, value.size)].append((start, end, value))
    buffers: list[_Buffer] = []
    for (index, offset, size), entries in slots.items():
        entries.sort(key=lambda e: (e[0], e[1]))
        current: _Buffer | None = None
        for start, end, value in entries:
            if current is not None and start <= current.end:
                current.end = max(current.end, end)
                current.values.append(value)
                continue
            current = _Buffer(dump.allocations[index], offset, size, start, end, [value])
            buffers.append(current)
    return buffers


def _producer(dump: Dump, buffer: _Buffer) -> Value:
    """The value that fills a buffer: the first with an op_name that is not a copy, or the
    loop body's dynamic-update-slice that fills a stacked buffer (not its initial value)."""
    named = [
        v
        for v in buffer.values
        if dump.op_names.get(v.instruction) and dump.opcodes.get(v.instruction) not in _LOOK_THROUGH
    ]
    for value in named:
        if dump.op_names[value.instruction].endswith("dynamic_update_slice") or (
            "dynamic-update-slice" in value.instruction
            and "/while/" in dump.op_names[value.instruction]
        ):
            return value
    return named[0] if named else buffer.values[0]


def backward_start(dump: Dump) -> int | None:
    """Where the backward pass starts: the position that best splits the forward pass's
    instructions (``jvp(...)`` in their ``op_name``) from the backward pass's
    (``transpose(...)``); None when there is no backward pass. XLA may schedule a forward
    instruction late (the loss's reduction after the backward loop), so the split is the one
    with the fewest instructions on the wrong side."""
    side = np.zeros(len(dump.sequence), dtype=np.int64)
    for i, name in enumerate(dump.sequence):
        op_name = dump.op_names.get(name, "")
        if "transpose(" in op_name:
            side[i] = -1
        elif "jvp(" in op_name:
            side[i] = 1
    if not (side == -1).any():
        return None
    # wrong(p) = forward instructions at or after p + backward instructions before p
    forward_after = np.cumsum((side == 1)[::-1])[::-1]
    backward_before = np.concatenate([[0], np.cumsum(side == -1)[:-1]])
    return int(np.argmin(forward_after + backward_before))


def _origin(dump: Dump, instruction: str | None) -> str:
    """The ``op_name`` of the instruction that computed a value, looking into fusions,
    through copies and bitcasts, and from a dynamic-update-slice to the value it writes."""
    callers = {computation: fusion for fusion, computation in dump.calls.items()}
    for _ in range(16):
        if instruction is None:
            return ""
        opcode = dump.opcodes.get(instruction, "")
        operands = dump.operands.get(instruction, ())
        if opcode == "fusion" and instruction in dump.calls:
            instruction = dump.roots.get(dump.calls[instruction])
        elif opcode == "parameter":
            computation, number = dump.parameters.get(instruction, ("", 0))
            caller = callers.get(computation)
            if caller is None:
                return ""
            caller_operands = dump.operands.get(caller, ())
            instruction = caller_operands[number] if number < len(caller_operands) else None
        elif opcode == "dynamic-update-slice":
            instruction = operands[1] if len(operands) > 1 else None
        elif opcode in _LOOK_THROUGH or opcode == "reduce-precision":
            instruction = operands[0] if operands and opcode != "get-tuple-element" else None
        else:
            return dump.op_names.get(instruction, "") or opcode
    return ""


def _match(residuals: Sequence[Residual], dims, dtype, steps, primitive):
    """``(name or None, source or None)`` of the traced residuals this buffer may be."""
    per_step = math.prod(dims[1:]) if steps > 1 else math.prod(dims)
    fits = [
        r
        for r in residuals
        if r.dtype == dtype
        and math.prod(r.shape) == per_step
        and r.multiplicity % max(steps, 1) == 0
        and (steps > 1) == (r.multiplicity > 1)
    ]
    same = [r for r in fits if r.primitive == primitive] or fits
    names = {r.name for r in same if r.name}
    sources = {r.source for r in same}
    name = names.pop() if len(names) == 1 and all(r.name for r in same) else None
    return name, (sources.pop() if len(sources) == 1 else None)


def _classify(dump, buffer, boundary, inputs, outputs, residuals) -> LiveValue:
    producer = _producer(dump, buffer)
    op_name = dump.op_names.get(producer.instruction, "")
    dims, dtype = parse_shape(producer.shape)
    common = dict(
        bytes=buffer.size, shape=dims, dtype=dtype, op_name=op_name, start=buffer.start,
        end=buffer.end, instruction=producer.instruction,
    )  # fmt: skip
    allocation = buffer.allocation
    if allocation.parameter is not None:
        kind, label = inputs.get(allocation.parameter, (INPUT, f"argument {allocation.parameter}"))
        return LiveValue(kind=kind, label=label, **common)
    if allocation.output:
        # an output allocation may hold other values (a loop counter) before its output
        index = next((dump.outputs[v.key] for v in buffer.values if v.key in dump.outputs), None)
        if index is not None and dtype != "tuple":
            kind, label = outputs.get(index, (OUTPUT, f"output {index}"))
            return LiveValue(kind=kind, label=label, **common)
    if dtype == "tuple":
        return LiveValue(kind=TEMPORARY, label="tuple (pointers)", **common)
    scan = scope_of(op_name)
    backward = "transpose(" in op_name
    if backward and "rematted_computation" in op_name:
        primitive = op_name.rsplit("/", 1)[-1]
        return LiveValue(kind=RECOMPUTE, label=primitive, scan=scan, **common)
    if not backward and boundary is not None and buffer.end >= boundary and op_name:
        steps, primitive = 1, op_name.rsplit("/", 1)[-1]
        if (
            scan is not None
            and "dynamic-update-slice" in producer.instruction + primitive.replace("_", "-")
            and len(dims) > 1
        ):
            steps = dims[0]
        origin = _origin(dump, producer.instruction)
        primitive = origin.rsplit("/", 1)[-1] or primitive
        if scan == "scan":
            scan = scope_of(origin) or scan
        if primitive == "dynamic_update_slice":
            primitive = "stacked value"
        name, source = _match(residuals, dims, dtype, steps, primitive)
        label = f"{name} ({primitive})" if name else primitive
        return LiveValue(kind=SAVED, label=label, steps=steps, scan=scan, source=source, **common)
    label = (op_name.rsplit("/", 1)[-1] if op_name else producer.instruction) or "value"
    return LiveValue(kind=TEMPORARY, label=label, scan=scan, **common)


def _positions(dump: Dump, spans: Sequence[Any]) -> int:
    """Schedule positions to count: the instruction sequence, or further where a live range
    (``.end``, inclusive) reaches past it."""
    return max([len(dump.sequence)] + [s.end + 1 for s in spans])


def _live_series(spans: Iterable[tuple[int, int, int]], n: int) -> np.ndarray:
    """Bytes live at each of ``n`` positions, from ``(start, end, bytes)`` live ranges (inclusive)."""
    diff = np.zeros(n + 1, dtype=np.int64)
    for start, end, size in spans:
        diff[start] += size
        diff[end + 1] -= size
    return np.cumsum(diff)[:n]


def live_bytes(dump: Dump) -> np.ndarray:
    """Bytes live at each position of the schedule: the buffers `read_memory` counts, summed."""
    return live_spans(dump)[1]


def live_spans(dump: Dump) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """``(spans, live)``: each counted buffer's ``(start, end, bytes)`` (positions inclusive)
    and `live_bytes`."""
    spans = [(b.start, b.end, b.size) for b in _buffers(dump)]
    return spans, _live_series(spans, max([len(dump.sequence)] + [e + 1 for _, e, _ in spans]))


def read_memory(
    dump: Dump,
    peak_bytes: int,
    *,
    inputs: dict[int, tuple[str, str]] | None = None,
    outputs: dict[int, tuple[str, str]] | None = None,
    residuals: Sequence[Residual] = (),
    label: str = "as written",
    num_devices: int = 1,
) -> MemoryView:
    """The `MemoryView` of a parsed dump.

    Args:
      dump: what `remat._measure._xla_dump.read_dump` read.
      peak_bytes: the compiled peak (`remat._measure._peak.compiled_memory`).
      inputs: ``entry parameter number -> (kind, label)`` (default: ``input``).
      outputs: ``flat output index -> (kind, label)`` (default: ``output``).
      residuals: the traced residuals (`remat._measure._residuals.saved_residuals`), to name
        saved values.
      label: what was compiled.
      num_devices: devices of the compiled program.
    """
    boundary = backward_start(dump)
    buffers = _buffers(dump)
    values = [_classify(dump, b, boundary, inputs or {}, outputs or {}, residuals) for b in buffers]
    n = _positions(dump, values)
    by_kind = {
        kind: _live_series(((v.start, v.end, v.bytes) for v in values if v.kind == kind), n)
        for kind in KINDS
    }
    live = sum(by_kind.values())
    peak_index = int(np.argmax(live))
    at_peak = sorted(
        (v for v in values if v.start <= peak_index <= v.end),
        key=lambda v: (-v.bytes, KINDS.index(v.kind), v.label),
    )
    return MemoryView(
        label=label,
        peak_bytes=int(peak_bytes),
        live_bytes=tuple(int(x) for x in live),
        by_kind=tuple((kind, tuple(int(x) for x in s)) for kind, s in by_kind.items() if s.any()),
        peak_index=peak_index,
        backward_start=boundary,
        op_names=tuple(dump.op_names.get(name, "") for name in dump.sequence)
        + ("",) * (n - len(dump.sequence)),
        live_at_peak=tuple(at_peak),
        num_devices=num_devices,
    )
