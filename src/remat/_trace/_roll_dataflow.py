"""The dataflow of a candidate run of layers: checking it (`_check`) and planning how to
evaluate it as a scan (`_plan`, `_RunPlan`). Steps 3 and 4 of `_roll_detect`'s algorithm.

Positions ``0 <= q < period`` index the equations of one layer. Each input of each equation
is classified as *internal* (made earlier in the same layer), *carry* (made by the previous
layer), *outside* (made before the run, or an input of the program) or *far* (made two or
more layers earlier: the run is rejected).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from ._roll_tokens import _is_lit


@dataclasses.dataclass(frozen=True)
class _RunPlan:
    """How to evaluate a run: positions are ``0 <= q < period`` within a layer.

    ``sources[i][j]`` says where input ``j`` of the ``i``-th body equation comes from:
    ``("local", var)`` (an earlier body equation of layer 0), ``("carry", c)``,
    ``("xs", x)``, ``("shared", var)`` or ``("lit", value)``.
    """

    body: tuple[int, ...]  # positions evaluated in the scan body, in order
    hoisted: tuple[int, ...]  # positions evaluated for every layer before the scan
    sources: tuple[tuple[tuple[str, Any], ...], ...]
    carry: tuple[tuple[int, int], ...]  # (position, output index) of each carried value
    carry_out: tuple[tuple[str, Any], ...]  # where the body finds it: ("local", var) or ("xs", x)
    init: tuple[Any, ...]  # the outside variable layer 0 reads for each carried value
    xs: tuple[tuple[Any, ...], ...]  # per stacked input: its variable in every layer
    ys: tuple[tuple[int, int], ...]  # (position, output index) of each per-layer output
    hoisted_outputs: frozenset  # (position, output index) of hoisted values read by the body


def _spec(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


@dataclasses.dataclass
class _Flow:
    """Producers and consumers of the variables of one jaxpr."""

    eqns: list
    producer: dict  # var -> (eqn index, output index)
    last_use: dict  # var -> index of its last consuming equation (len(eqns) for outputs)

    @classmethod
    def of(cls, jaxpr) -> _Flow:
        producer, last_use = {}, {}
        for i, e in enumerate(jaxpr.eqns):
            for v in e.invars:
                if not _is_lit(v):
                    last_use[v] = i
            for o, v in enumerate(e.outvars):
                producer[v] = (i, o)
        for v in jaxpr.outvars:
            if not _is_lit(v):
                last_use[v] = len(jaxpr.eqns)
        return cls(list(jaxpr.eqns), producer, last_use)


def _classify(flow: _Flow, start: int, period: int, layer: int, q: int) -> list[tuple]:
    """How each input of the equation at position ``q`` of ``layer`` is read."""
    out = []
    first = start + layer * period
    for v in flow.eqns[first + q].invars:
        if _is_lit(v):
            out.append(("lit", v))
            continue
        made = flow.producer.get(v)
        if made is None or made[0] < start:
            out.append(("out", v))
            continue
        i, o = made
        src_layer, src_q = divmod(i - start, period)
        if src_layer == layer:
            out.append(("int", src_q, o))
        elif src_layer == layer - 1:
            out.append(("prev", src_q, o))
        else:
            out.append(("far", src_layer, src_q))
    return out


def _phase(flow: _Flow, lo: int, hi: int, period: int) -> int:
    """The start in ``[lo, lo + period)`` whose layer boundaries the fewest values cross
    (earliest first), among those that leave two layers before ``hi``."""
    cuts = np.zeros(period + 1, np.int64)
    for i in range(lo, hi):
        for v in flow.eqns[i].outvars:
            last = min(flow.last_use.get(v, i), hi - 1)
            if last <= i:
                continue
            if last - i >= period:
                cuts[0] += 1
                cuts[period] -= 1
                continue
            a, b = (i + 1 - lo) % period, (last - lo) % period  # cut before eqn a..b crosses
            if a <= b:
                cuts[a] += 1
                cuts[b + 1] -= 1
            else:
                cuts[a] += 1
                cuts[period] -= 1
                cuts[0] += 1
                cuts[b + 1] -= 1
    crossing = np.cumsum(cuts[:period])
    # A start late in a window of two layers and a little more leaves one layer: not a run.
    whole = lo + np.arange(period) + 2 * period <= hi
    if whole.any() and not whole.all():
        crossing = np.where(whole, crossing, np.iinfo(np.int64).max)
    return lo + int(np.argmin(crossing))


@dataclasses.dataclass(frozen=True)
class _Mismatch:
    index: int  # equation index in the later layer
    other: int  # the equation it was compared with
    what: str


def _check(flow, strict, start, period, k, carry_key=None) -> tuple[int, _Mismatch | None]:
    """How many leading layers of ``k`` from ``start`` form a valid run (0 if not two).

    Layer 0 may read a constant (a literal) where the later layers read the previous
    layer's value: the constant is then the carry's initial value, and ``carry_key(i,
    positions)`` the strict token of equation ``i`` with the literals at ``positions`` read
    as variables (without it, such a layer 0 does not match)."""
    if k < 2:
        return 0, None
    ref = [_classify(flow, start, period, 1, q) for q in range(period)]
    if not any(c[0] == "prev" for row in ref for c in row):
        return 0, None  # independent repeats, not layers chained through a carry
    hoistable = [False] * period
    for q in range(period):
        hoistable[q] = all(
            c[0] in ("lit", "out") or (c[0] == "int" and hoistable[c[1]]) for c in ref[q]
        )
    base = start

    def differs(layer, q, classes, against) -> str | None:
        i, j = base + layer * period + q, base + against * period + q
        if len(classes) != len(ref[q]):  # the layer before a run (see `carry_key`)
            return "dataflow"
        starts = frozenset(
            n
            for n, (c, r) in enumerate(zip(classes, ref[q], strict=False))
            if layer == 0 and c[0] == "lit" and r[0] == "prev"
        )
        key = strict[i] if not starts or carry_key is None else carry_key(i, starts)
        if not hoistable[q] and key != strict[j]:
            return "parameters"
        for c, r in zip(classes, ref[q], strict=True):
            if c[0] == "far":
                return "reads a value from two or more layers before"
            if r[0] == "prev" and layer == 0:
                if c[0] != "out" and not (c[0] == "lit" and carry_key is not None):
                    return "dataflow"
            elif c[0] != r[0] or (c[0] in ("int", "prev") and c[1:] != r[1:]):
                return "dataflow"
        return None

    # Layer 0 against the reference (it reads the carry's initial values from outside).
    init: dict[tuple[int, int], Any] = {}
    for q in range(period):
        classes = _classify(flow, start, period, 0, q)
        what = differs(0, q, classes, 1)
        if what is None:
            for c, r in zip(classes, ref[q], strict=True):
                if r[0] == "prev" and init.setdefault(r[1:], c[1]) is not c[1]:
                    what = "carry"
        if what is not None:
            return 0, _Mismatch(start + period + q, start + q, what)
    for layer in range(2, k):
        for q in range(period):
            what = differs(layer, q, _classify(flow, start, period, layer, q), 1)
            if what is not None:
                i = start + layer * period + q
                return (layer if layer >= 2 else 0), _Mismatch(i, i - period, what)
    return k, None


def _plan(flow, strict, start, period, k) -> tuple[_RunPlan, dict]:
    """The evaluation plan of a checked run, and its shape summary."""
    layers = [[_classify(flow, start, period, L, q) for q in range(period)] for L in range(k)]
    ref = layers[1]
    idx = [[start + L * period + q for q in range(period)] for L in range(k)]
    hoistable = [False] * period
    for q in range(period):
        hoistable[q] = all(
            c[0] in ("lit", "out") or (c[0] == "int" and hoistable[c[1]]) for c in ref[q]
        )
    hoist = set()
    for q in range(period):
        if hoistable[q] and any(strict[idx[L][q]] != strict[idx[0][q]] for L in range(k)):
            hoist.add(q)
    for q in range(period - 1, -1, -1):  # a hoisted equation's inputs are hoisted too
        if q in hoist:
            hoist.update(c[1] for c in ref[q] if c[0] == "int")
    eqns = flow.eqns
    carry: dict[tuple[int, int], int] = {}
    init: list[Any] = []
    xs: dict[tuple, int] = {}
    sources = []
    body = [q for q in range(period) if q not in hoist]
    hoisted_outputs = set()
    for q in body:
        row = []
        for j, r in enumerate(ref[q]):
            v0 = eqns[idx[0][q]].invars[j]
            if r[0] == "lit":
                row.append(("lit", v0.val))
            elif r[0] == "int" and r[1] not in hoist:
                row.append(("local", v0))
            elif r[0] == "int":
                per = tuple(eqns[idx[L][r[1]]].outvars[r[2]] for L in range(k))
                hoisted_outputs.add(r[1:])
                row.append(("xs", xs.setdefault(per, len(xs))))
            elif r[0] == "prev":
                if r[1:] not in carry:
                    carry[r[1:]] = len(carry)
                    init.append(v0)
                row.append(("carry", carry[r[1:]]))
            else:
                per = tuple(eqns[idx[L][q]].invars[j] for L in range(k))
                if all(v is per[0] for v in per):
                    row.append(("shared", per[0]))
                else:
                    row.append(("xs", xs.setdefault(per, len(xs))))
        sources.append(tuple(row))
    carry_out = []
    for q, o in carry:
        if q in hoist:  # the next layer reads a hoisted value: the body passes it on from xs
            per = tuple(eqns[idx[L][q]].outvars[o] for L in range(k))
            carry_out.append(("xs", xs.setdefault(per, len(xs))))
        else:
            carry_out.append(("local", eqns[idx[0][q]].outvars[o]))
    stop = start + k * period
    ys = []
    for q in body:
        for o, v in enumerate(eqns[idx[0][q]].outvars):
            used_after = any(
                flow.last_use.get(eqns[idx[L][q]].outvars[o], -1) >= stop for L in range(k)
            )
            last_is_carry = (q, o) in carry and all(
                flow.last_use.get(eqns[idx[L][q]].outvars[o], -1) < stop for L in range(k - 1)
            )
            if used_after and not last_is_carry and not isinstance(v, jcore.DropVar):
                ys.append((q, o))
    plan = _RunPlan(
        body=tuple(body),
        hoisted=tuple(sorted(hoist)),
        sources=tuple(sources),
        carry=tuple(carry),
        carry_out=tuple(carry_out),
        init=tuple(init),
        xs=tuple(xs),
        ys=tuple(ys),
        hoisted_outputs=frozenset(hoisted_outputs),
    )
    shared = {v for row in sources for kind, v in row if kind == "shared"}
    summary = dict(
        carry=tuple(_spec(eqns[idx[0][q]].outvars[o].aval) for q, o in plan.carry),
        stacked=tuple(_spec(per[0].aval) for per in plan.xs),
        shared=tuple(_spec(v.aval) for v in sorted(shared, key=lambda v: str(v))),
        hoisted=len(hoist),
    )
    return plan, summary
