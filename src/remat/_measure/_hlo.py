"""Matmul and convolution FLOPs of an optimised HLO module, with loop trip counts.

XLA's own ``compiled.cost_analysis()["flops"]`` visits the body of a ``while`` loop once, so a
model whose layers are a ``lax.scan`` of length ``L`` is reported ``L`` times too cheap. This
module reads the optimised HLO text (``compiled.as_text()``) instead: every ``dot`` and
``convolution`` (and the cuBLAS/cuDNN custom calls they become on GPU) is counted, multiplied by
the trip counts of all the ``while`` loops around it. Computations called from several places
(fusions, ``call``, loop bodies, conditional branches) are counted once per call site.

Elementwise work (additions, nonlinearities, reductions, ...) is not counted: for the programs
checkpointing is about, matmuls dominate, and they are what recomputation repeats.

Loops whose trip count depends on data, and branches taken a known number of times, can say
so with a named scope (`jax.named_scope`) that XLA keeps in the instruction's ``op_name``:
``remat_trips_{A}_per_{M}`` directly around a ``while`` means that over the ``M`` times it
is entered it runs ``A`` iterations in all (``A / M`` per entry), and
``remat_branches_{w0}_{w1}_..._of_{M}`` directly around a ``cond``/``switch`` means branch
``k`` (in `lax.switch` order; `lax.cond` is ``[false, true]``) is taken ``wk`` times out of
``M``. `remat.Binomial`'s backward sweep tags its loops so (`remat._core._flop_tags`):
its FLOPs are exact, not a lower bound.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from functools import cache

import numpy as np

from .._core._flop_tags import BRANCHES_TAG, TRIPS_TAG
from .._core._warnings import RematWarning

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*\(.*\{\s*$")
_SHAPE = re.compile(r"^[a-z]+[0-9]*\[(?P<dims>[^\]]*)\]")
_OPERAND = re.compile(r"%([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_INIT = re.compile(
    r'"known_init_step"\s*:\s*\{\s*"init"\s*:\s*"(-?\d+)"\s*,\s*"step"\s*:\s*"(-?\d+)"'
)
_CONSTANT = re.compile(r"^s\d+\[\]|^u\d+\[\]")
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__onednn$matmul")
_CONV_TARGETS = ("__cudnn$conv",)

_UNKNOWN_TRIP = (
    "`remat.measure` (FLOP count) could not find the trip count of the while loop {name!r} (no "
    "`known_trip_count` and no `compare` against a constant in its condition); its body is "
    "counted once, so the FLOPs are a lower bound."
)


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    shape: str  # the result type as printed, e.g. "f32[2,4]{1,0}" or a tuple "(...)"
    opcode: str
    operands: tuple[str, ...]
    args: str  # the text between the opcode's parentheses, e.g. "7" for `constant(7)`
    attrs: str


def _match_paren(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``text[start]``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for i in range(start, len(text)):
        c = text[i]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def _parse_instr(line: str) -> _Instr | None:
    line = line.strip()
    if line.startswith("ROOT "):
        line = line[5:]
    name, sep, rest = line.partition(" = ")
    if not sep:
        return None
    end = _match_paren(rest, 0) if rest.startswith("(") else rest.find(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren]
    close = _match_paren(rest, paren)
    args = rest[paren + 1 : close - 1]
    return _Instr(
        name.lstrip("%"), shape, opcode, tuple(_OPERAND.findall(args)), args, rest[close:]
    )


def _parse_module(hlo_text: str) -> tuple[dict[str, list[_Instr]], str | None]:
    """Splits HLO text into computations (name -> instructions) and names the entry."""
    comps: dict[str, list[_Instr]] = {}
    entry = None
    current: list[_Instr] | None = None
    for raw in hlo_text.splitlines():
        if current is None:
            m = _HEADER.match(raw)
            if m and not raw.startswith((" ", "\t")):
                current = comps.setdefault(m["name"], [])
                if raw.startswith("ENTRY"):
                    entry = m["name"]
            continue
        if raw.startswith("}"):
            current = None
            continue
        instr = _parse_instr(raw)
        if instr is not None:
            current.append(instr)
    return comps, entry


def _dims(shape: str) -> tuple[int, ...]:
    m = _SHAPE.match(shape)
    if m is None or not m["dims"].strip():
        return ()
    return tuple(int(d.lstrip("<=")) for d in m["dims"].split(","))


def _int_list(attrs: str, key: str) -> tuple[int, ...]:
    m = re.search(key + r"=\{([\d,\s]*)\}", attrs)
    if m is None:
        return ()
    return tuple(int(d) for d in m[1].split(",") if d.strip())


def _called(attrs: str, key: str) -> list[str]:
    m = re.search(key + r"=\{([^}]*)\}", attrs)
    if m is not None:
        return [c.strip().lstrip("%") for c in m[1].split(",") if c.strip()]
    m = re.search(key + r"=%?([\w.\-]+)", attrs)
    return [m[1]] if m else []


def _dot_flops(result: str, lhs: str, contracting: tuple[int, ...]) -> float:
    lhs_dims = _dims(lhs)
    k = math.prod(lhs_dims[d] for d in contracting if d < len(lhs_dims))
    return 2.0 * math.prod(_dims(result)) * k


def _window(attrs: str) -> dict[str, list[tuple[int, ...]]]:
    m = re.search(r"window=\{([^}]*)\}", attrs)
    out: dict[str, list[tuple[int, ...]]] = {}
    for item in m[1].split() if m else []:
        key, _, value = item.partition("=")
        out[key] = [tuple(int(p) for p in part.split("_")) for part in value.split("x")]
    return out


def _valid_pairs(
    size: int, out: int, k: int, pad_lo: int, stride: int, lhs_dil: int, rhs_dil: int
) -> int:
    """(output position, kernel tap) pairs of one spatial dim that read a real input element."""
    o = np.arange(out)[:, None]
    t = np.arange(k)[None, :]
    p = o * stride + t * rhs_dil - pad_lo
    valid = (p >= 0) & (p <= (size - 1) * lhs_dil) & (p % lhs_dil == 0)
    return int(valid.sum())


def _conv_flops(result: str, lhs: str, kernel: str, attrs: str) -> float:
    # Each output element is a dot product over its kernel window and the kernel's input
    # features (per group). Window taps that fall into padding or between dilated input
    # elements do no work and are not counted, as in XLA's own cost analysis.
    m = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    out_dims, lhs_dims, k_dims = _dims(result), _dims(lhs), _dims(kernel)
    if m is None or len(m[2]) != len(k_dims) or len(m[3]) != len(out_dims):
        return 0.0
    in_labels, k_labels, out_labels = m[1], m[2], m[3]
    window = _window(attrs)
    spatial = sorted(c for c in k_labels if c.isdigit())
    pairs = 1
    for n, c in enumerate(spatial):
        k = k_dims[k_labels.index(c)]
        out = out_dims[out_labels.index(c)]

        def get(key: str, default: tuple[int, ...], n: int = n) -> tuple[int, ...]:
            values = window.get(key)
            return values[n] if values and n < len(values) else default

        if len(lhs_dims) == len(in_labels) and c in in_labels:
            size = lhs_dims[in_labels.index(c)]
            pairs *= _valid_pairs(
                size,
                out,
                k,
                get("pad", (0, 0))[0],
                get("stride", (1,))[0],
                get("lhs_dilate", (1,))[0],
                get("rhs_dilate", (1,))[0],
            )
        else:
            pairs *= out * k
    per_output = k_dims[k_labels.index("i")] if "i" in k_labels else 1
    other = math.prod(d for d, c in zip(out_dims, out_labels, strict=True) if not c.isdigit())
    return 2.0 * other * pairs * per_output


def _gemm_flops(instr: _Instr, shapes: dict[str, str]) -> float:
    # cuBLAS gemms keep the dot's dimension numbers in their backend_config.
    m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', instr.attrs)
    if m is None or not instr.operands:
        return 0.0
    contracting = tuple(int(d.strip().strip('"')) for d in m[1].split(",") if d.strip())
    result = instr.shape
    if result.startswith("("):  # (result, workspace)
        result = result[1 : _match_paren(result, 0) - 1].split(" ")[0].rstrip(",")
    return _dot_flops(result, shapes.get(instr.operands[0], ""), contracting)


class _Counter:
    def __init__(self, hlo_text: str):
        self.comps, self.entry = _parse_module(hlo_text)
        self.shapes = {c: {i.name: i.shape for i in instrs} for c, instrs in self.comps.items()}
        self.unknown_loops: list[str] = []
        self.flops = cache(self._flops)

    def _flops(self, comp: str) -> float:
        total = 0.0
        shapes = self.shapes.get(comp, {})
        for instr in self.comps.get(comp, []):
            op = instr.opcode
            if op == "dot" and instr.operands:
                lhs = shapes.get(instr.operands[0], "")
                total += _dot_flops(
                    instr.shape, lhs, _int_list(instr.attrs, "lhs_contracting_dims")
                )
            elif op == "convolution" and len(instr.operands) >= 2:
                lhs, kernel = (shapes.get(o, "") for o in instr.operands[:2])
                total += _conv_flops(instr.shape, lhs, kernel, instr.attrs)
            elif op == "custom-call":
                target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
                target = target[1] if target else ""
                if target.startswith(_GEMM_TARGETS):
                    total += _gemm_flops(instr, shapes)
                elif target.startswith(_CONV_TARGETS) and len(instr.operands) >= 2:
                    result = instr.shape
                    if result.startswith("("):
                        result = result[1:].split(" ")[0].rstrip(",")
                    lhs, kernel = (shapes.get(o, "") for o in instr.operands[:2])
                    total += _conv_flops(result, lhs, kernel, instr.attrs)
                total += sum(self.flops(c) for c in _called(instr.attrs, "called_computations"))
            elif op == "while":
                trips = self._trip_count(instr, comp)
                total += trips * sum(self.flops(c) for c in _called(instr.attrs, "body"))
            elif op == "conditional":
                branches = _called(instr.attrs, "branch_computations") or (
                    _called(instr.attrs, "true_computation")
                    + _called(instr.attrs, "false_computation")
                )
                weights = _branch_weights(instr.attrs, len(branches))
                if weights is None:  # unknown: the most expensive branch
                    total += max((self.flops(c) for c in branches), default=0.0)
                else:
                    total += sum(w * self.flops(c) for w, c in zip(weights, branches, strict=True))
            elif op in ("fusion", "call") or op.endswith("-start"):
                for key in ("calls", "to_apply"):
                    total += sum(self.flops(c) for c in _called(instr.attrs, key))
        return total

    def _trip_count(self, instr: _Instr, comp: str) -> float:
        if (m := TRIPS_TAG.search(instr.attrs)) is not None:
            return int(m[1]) / max(1, int(m[2]))
        m = _TRIP.search(instr.attrs)
        if m is not None:
            return int(m[1])
        # Fall back to the loop condition: `i < K` (or `i <= K`) against a constant, with the
        # counter's start and step from the loop's config, else read from the loop itself
        # (XLA's windowed einsums over a ring of devices count `i += 2` up to a constant).
        init, step = 0, 1
        if (m := _INIT.search(instr.attrs)) is not None:
            init, step = int(m[1]), int(m[2])
        else:
            init, step = self._counter(instr, comp)
        for cond in _called(instr.attrs, "condition"):
            bound, direction = self._compare_constant(cond)
            if bound is not None and step > 0:
                if direction == "LE":
                    bound += 1
                return max(0, -(-(bound - init) // step))
        self.unknown_loops.append(instr.name)
        return 1

    def _counter(self, loop: _Instr, comp: str) -> tuple[int, int]:
        """``(start, step)`` of the tuple element a loop's condition compares with a constant:
        the body adds a constant to it, and the loop's operand sets it to a constant; ``(0,
        1)`` where either cannot be read."""
        conds, bodies = _called(loop.attrs, "condition"), _called(loop.attrs, "body")
        if len(conds) != 1 or len(bodies) != 1:
            return 0, 1
        index = self._compared_index(conds[0])
        step = self._element(bodies[0], index, "add", index) if index is not None else None
        start = self._element(comp, index, "tuple", None, loop) if step else None
        return (start or 0), (step or 1)

    def _compared_index(self, cond: str) -> int | None:
        """The tuple index the condition's root `compare` reads from its parameter."""
        instrs = {i.name: i for i in self.comps.get(cond, [])}
        root = self.comps.get(cond, [None])[-1]
        if root is None or root.opcode != "compare":
            return None
        for name in root.operands:
            read = instrs.get(name)
            if read is not None and read.opcode == "get-tuple-element":
                m = re.search(r"index=(\d+)", read.attrs)
                return int(m[1]) if m else None
        return None

    def _element(
        self, comp: str, index: int, kind: str, read: int | None, loop: _Instr | None = None
    ) -> int | None:
        """A constant about element ``index`` of a tuple in ``comp``: with ``kind="add"``, the
        constant the body's root tuple adds to its parameter's element ``read`` there; with
        ``kind="tuple"``, the constant ``loop``'s operand tuple starts it at."""
        instrs = {i.name: i for i in self.comps.get(comp, [])}

        def constant(name: str) -> int | None:
            c = instrs.get(name)
            if c is None or c.opcode != "constant" or not _CONSTANT.match(c.shape):
                return None
            return int(c.args) if re.fullmatch(r"-?\d+", c.args.strip()) else None

        if kind == "tuple":
            tup = instrs.get(loop.operands[0]) if loop is not None and loop.operands else None
            if tup is None or tup.opcode != "tuple" or index >= len(tup.operands):
                return None
            return constant(tup.operands[index])
        root = self.comps.get(comp, [None])[-1]
        if root is None or root.opcode != "tuple" or index >= len(root.operands):
            return None
        add = instrs.get(root.operands[index])
        if add is None or add.opcode != "add" or len(add.operands) != 2:
            return None
        reads = [instrs.get(o) for o in add.operands]
        if not any(
            r is not None and r.opcode == "get-tuple-element" and f"index={read}" in r.attrs
            for r in reads
        ):
            return None
        steps = [constant(o) for o in add.operands]
        return next((c for c in steps if c is not None), None)

    def _compare_constant(self, comp: str) -> tuple[int | None, str | None]:
        constant, direction = None, None
        stack, seen = [comp], set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for instr in self.comps.get(c, []):
                if instr.opcode == "constant" and _CONSTANT.match(instr.shape):
                    if re.fullmatch(r"-?\d+", instr.args.strip()):
                        constant = int(instr.args)
                elif instr.opcode == "compare":
                    d = re.search(r"direction=(\w+)", instr.attrs)
                    direction = d[1] if d else None
                for key in ("calls", "to_apply"):
                    stack.extend(_called(instr.attrs, key))
        if direction in ("LT", "LE"):
            return constant, direction
        return None, None


def _branch_weights(attrs: str, n: int) -> list[float] | None:
    """How often each of ``n`` branches runs per entry, from a `branch_scope` tag."""
    m = BRANCHES_TAG.search(attrs)
    if m is None:
        return None
    counts = [int(c) for c in m[1].split("_") if c]
    if len(counts) != n:
        return None
    return [c / max(1, int(m[2])) for c in counts]


def hlo_flops(hlo_text: str) -> float:
    """FLOPs of the matmuls and convolutions in an optimised HLO module, with loop trip counts.

    Every ``dot`` counts ``2 * prod(result dims) * prod(contracting dims)``; every
    ``convolution`` counts 2 FLOPs per multiply-add: for every output element, one per kernel
    tap that reads a real input element (not padding) and kernel input feature. The cuBLAS/cuDNN custom calls
    that dots and convolutions become on GPU are counted the same way. Each count is
    multiplied by the trip counts of all enclosing ``while`` loops (``known_trip_count`` from
    the loop's backend config, else the loop condition's comparison against a constant);
    a conditional counts its most expensive branch. Elementwise work is not counted, nor is
    a matmul that XLA rewrote as elementwise work (a contraction of size 1, such as an outer
    product).

    Args:
      hlo_text: the optimised HLO of a compiled program, ``compiled.as_text()``.

    Returns:
      The FLOP count of one execution of the module's entry computation.

    Warns:
      RematWarning: when a loop's trip count cannot be found (its body is counted once).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._hlo import hlo_flops
      >>> def f(ws, x):
      ...     return jax.lax.scan(lambda y, w: (y @ w, None), x, ws)[0]
      >>> compiled = jax.jit(f).lower(jnp.ones((5, 8, 8)), jnp.ones((2, 8))).compile()
      >>> hlo_flops(compiled.as_text())  # 5 layers of (2, 8) @ (8, 8)
      1280.0
    """
    counter = _Counter(hlo_text)
    if counter.entry is None:
        raise ValueError(
            "`remat._measure._hlo.hlo_flops` got text with no ENTRY computation; pass the optimised HLO "
            "module text, e.g. `jax.jit(f).lower(*args).compile().as_text()`."
        )
    total = counter.flops(counter.entry)
    for name in counter.unknown_loops:
        warnings.warn(_UNKNOWN_TRIP.format(name=name), RematWarning, stacklevel=2)
    # Every count is a whole number; tagged loops and branches (average trips per entry)
    # leave rounding errors of a few ulps, which this removes.
    return float(round(total))


def while_trip_counts(hlo_text: str) -> dict[str, int]:
    """The trip count of every ``while`` loop in an HLO module, by instruction name.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._hlo import while_trip_counts
      >>> f = lambda x: jax.lax.fori_loop(0, 7, lambda i, y: y * 2.0, x)
      >>> list(while_trip_counts(jax.jit(f).lower(1.0).compile().as_text()).values())
      [7]
    """
    counter = _Counter(hlo_text)
    return {
        i.name: counter._trip_count(i, comp)
        for comp, instrs in counter.comps.items()
        for i in instrs
        if i.opcode == "while"
    }


__all__ = ["hlo_flops", "while_trip_counts"]
