"""How XLA split a scan's inputs over devices, read from a compiled sharded step.

Under automatic (GSPMD) shardings, a traced jaxpr knows its arguments' shardings only; XLA's
partitioner chooses the intermediates'. `remat._shard._shard_counts` estimates them the way
propagation usually goes, and can be wrong where two shardings meet: a Llama-style decoder
with its batch split over ``fsdp`` and its embedding table's model dimension split over
``fsdp`` too enters its layers with the model dimension split and the batch whole (XLA keeps
the table's layout), four times the bytes per device the estimate gives every activation.

The compiled step's forward loop holds every input of the scan (the carried values, the
loop-invariant ones and the stacked per-step ones) in its state, at its per-device shape, in
XLA's optimised HLO. `loop_splits` reads, for each of the scan's inputs, the split of each
dimension from there: the estimate where the state holds an element of that per-device shape
and dtype (several inputs' pieces may fit one input's global shape: a key projection's
kernel and a query one's of twice its heads), else the least split among the elements of
the same rank whose dimensions each divide the input's (the same dtype first).

Example:
  >>> from remat._measure._loop_state import state_shapes, splits_for
  >>> state = state_shapes("(s32[], bf16[4,256,64]{2,1,0}, f32[4,64,2,32]{3,2,1,0}, "
  ...                      "f32[4,64,1,32]{3,2,1,0})")
  >>> state[:2]
  (((), 's32'), ((4, 256, 64), 'bf16'))
  >>> splits_for((4, 256, 256), "bfloat16", state, estimate=(4, 1, 1))  # not the estimate
  (1, 1, 4)
  >>> splits_for((4, 256, 4, 32), "float32", state)  # a query kernel, 4 heads
  (1, 4, 2, 1)
  >>> # a key kernel of 2 heads: the query's pieces fit it too; the estimate's are there
  >>> splits_for((4, 256, 2, 32), "float32", state), splits_for((4, 256, 2, 32), "float32",
  ...                                                           state, estimate=(1, 4, 2, 1))
  ((1, 4, 1, 1), (1, 4, 2, 1))
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ._xla_dump import Dump

_ELEMENT = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
# XLA's names of the dtypes a scan's inputs have.
_XLA_DTYPES = {
    "bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "bool": "pred",
    "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
}  # fmt: skip

Splits = tuple[int, ...]


def state_shapes(text: str) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``(dims, dtype)`` of each element of an HLO tuple shape's text."""
    return tuple(
        (tuple(int(d) for d in dims.split(",") if d), dtype)
        for dtype, dims in _ELEMENT.findall(text)
    )


def forward_loop(dump: Dump) -> str | None:
    """The one forward loop of a compiled step (a ``while`` whose ``op_name`` has ``/while``
    and no ``transpose(``), or None where there is not exactly one."""
    loops = [
        name
        for name in dump.sequence
        if dump.opcodes.get(name) == "while"
        and "/while" in dump.op_names.get(name, "")
        and "transpose(" not in dump.op_names.get(name, "")
    ]
    return loops[0] if len(loops) == 1 else None


def splits_for(
    shape: Sequence[int],
    dtype: Any,
    state: Sequence[tuple[tuple[int, ...], str]],
    estimate: Sequence[int] | None = None,
) -> Splits | None:
    """The per-dimension split of a ``shape``-d value held in ``state`` at a per-device shape
    (see the module docstring; ``estimate``: the split estimated from the arguments), or None
    where no element can hold it."""
    shape = tuple(int(d) for d in shape)
    fits = [
        (dims, kind)
        for dims, kind in state
        if len(dims) == len(shape)
        and all(d and s % d == 0 for s, d in zip(shape, dims, strict=True))
    ]
    name = _XLA_DTYPES.get(str(dtype))
    same = [dims for dims, kind in fits if kind == name]
    if estimate is not None and len(estimate) == len(shape):
        piece = tuple(s // max(int(e), 1) for s, e in zip(shape, estimate, strict=True))
        if piece in same:
            return tuple(int(e) for e in estimate)
    candidates = same or [dims for dims, _ in fits]
    if not candidates:
        return None
    dims = max(candidates, key=math.prod)
    return tuple(s // d for s, d in zip(shape, dims, strict=True))


def loop_splits(
    dump: Dump, info: Any, estimate: Sequence[Splits] | None = None
) -> list[Splits | None] | None:
    """Per input of the scan ``info`` (a `remat.ScanInfo`: its body's ``consts + carry + xs``,
    ``xs`` one step's slice), its split over devices in the compiled step of ``dump``, or None
    where unread; None where the step has no one forward loop. ``estimate``: per input, the
    split estimated from the arguments (`remat._shard._shard_counts.scan_input_splits`)."""
    loop = forward_loop(dump)
    if loop is None or loop not in dump.shapes:
        return None
    state = state_shapes(dump.shapes[loop])
    stacked_from = info.num_consts + info.num_carry
    out: list[Splits | None] = []
    for i, var in enumerate(info.jaxpr.jaxpr.invars):
        aval = var.aval
        shape = tuple(aval.shape) if i < stacked_from else (info.length, *aval.shape)
        guess = None if estimate is None else tuple(estimate[i])
        if guess is not None and i >= stacked_from:
            guess = (1, *guess)
        splits = splits_for(shape, aval.dtype, state, guess)
        if splits is not None and i >= stacked_from:
            splits = None if splits[0] != 1 else splits[1:]  # the steps' axis is never split
        out.append(splits)
    return out
