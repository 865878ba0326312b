"""Finding repeated layers in a traced program: `find_runs`, `Run`, `explain_no_roll`.

A model whose layers run in a Python loop traces to a flat list of equations in which one
layer's equations repeat ``k`` times: the same primitives, shapes, dtypes and parameters,
reading different per-layer inputs (weights, dropout keys) and the previous layer's outputs
(the carry). A *run* is a maximal stretch of ``k >= 2`` such layers, ``period`` equations
each, starting at equation ``start``. `_roll_rewrite.py` turns each run into a `lax.scan`.

The algorithm, for a jaxpr of ``n`` equations (each step linear in ``n`` unless said):

1. **Tokens.** Every equation gets a *loose* token, (primitive, input and output shapes and
   dtypes), and a *strict* one that adds its parameters and literal values. Sub-programs in
   parameters (inner `jax.jit`, `custom_jvp_call`, `custom_vjp_call`, `checkpoint`) are
   hashed structurally (their equations, with variables numbered by position) and memoised,
   so a layer wrapped in ``jax.jit`` or ``nn.remat`` is one equation whose token is the same
   in every layer; callables in parameters (custom derivative rules, policies) compare by
   their code object. Tokens are interned to integers.
2. **Candidate periods.** For every loose token, the gaps between its consecutive occurrences
   are counted; a period ``p`` of a run of ``k`` layers shows up ``k - 1`` times for every
   token that occurs once per layer. The 24 most frequent gaps are the candidates. For each,
   ``tok[i] == tok[i - p]`` (one NumPy comparison) gives the maximal periodic stretches;
   those at least ``2p`` long hold two layers or more.
3. **Phase.** A periodic stretch says nothing about where a layer starts. Of the ``p``
   possible starts, the one cut by the fewest values (a value produced before the cut and
   used after it, within one period) is taken, earliest first: the residual stream is
   usually the only value that crosses a layer boundary. ``O(n + p)`` with a difference
   array over the ``p`` phases.
4. **Dataflow check.** Each input of each equation is classified as *internal* (made earlier
   in the same layer, at position ``q``), *carry* (made by the previous layer at position
   ``q``), *outside* (made before the run, or an input of the program) or *far* (made two or
   more layers earlier: rejected). Layer 1's classification is the reference; every layer
   must match it (layer 0 reads outside values where the reference reads the carry: the
   carry's initial value, one per carried value), with equal strict tokens. Equations that
   read only outside values (directly or through each other) and whose strict tokens differ
   between layers (linen folds a per-layer constant into the dropout key; ``keys[i]``
   slices with a per-layer index) are *hoisted*: evaluated for every layer before the scan,
   their outputs stacked. An outside input read through the same variable by every layer is
   *shared* (a scan constant); one read through different variables is *stacked* (scanned
   over). A layer that does not match ends the run; a new run may start at it.
5. **Selection.** The checked runs of all candidate periods are ranked by the number of
   equations they cover (more first; for equal cover, shorter periods first, so ``p`` beats
   ``2p``) and taken greedily without overlap. Top-level equations left outside any run
   that are `jax.jit` or ``closed_call`` calls are searched in turn (their runs carry a
   ``path``).

Values of a layer used after the run (every layer's hidden state collected into a list)
are handled as per-layer outputs (the scan's ``ys``); the last layer's carried values come
out as the scan's final carry.

Cost: tokens ``O(n)`` (each sub-program hashed once), then ``O(24 n)`` for the candidates
and checks: about a second for 200 layers of tens of equations in pure Python.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
from typing import Any

import jax
import numpy as np
from jax._src import linear_util as lu  # custom_vjp_call's rules are `lu.WrappedFun`s
from jax.extend import core as jcore

from ._scan_info import _source

_P = jcore.primitives
_CANDIDATES = 24  # candidate periods tried per jaxpr
_CALLS = ("jit", "closed_call")  # searched inside when not part of a run
_JAX_DIR = os.path.dirname(jax.__file__) + os.sep  # JAX's own code lies below it


### Runs


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


@dataclasses.dataclass(frozen=True)
class Run:
    """``length`` consecutive identical layers of a traced program, to be rolled into a scan.

    Attributes:
      path: indices of the `jax.jit` / ``closed_call`` equations that hold the run, from the
        top-level jaxpr (``()``: the run is in the top-level jaxpr).
      start: index of the first layer's first equation.
      period: equations per layer.
      length: number of layers.
      source: ``"file:line"`` of the first layer's first equation, ``""`` if unknown.
      carry: shape and dtype of each value a layer passes to the next.
      stacked: shape and dtype (of one layer) of each per-layer input the scan runs over.
      shared: shape and dtype of each input every layer reads.
      hoisted: equations per layer evaluated before the scan (per-layer key folding).
    """

    path: tuple[int, ...]
    start: int
    period: int
    length: int
    source: str
    carry: tuple[jax.ShapeDtypeStruct, ...]
    stacked: tuple[jax.ShapeDtypeStruct, ...]
    shared: tuple[jax.ShapeDtypeStruct, ...]
    hoisted: int
    plan: _RunPlan = dataclasses.field(repr=False, compare=False)

    @property
    def stop(self) -> int:
        """Index one past the last layer's last equation."""
        return self.start + self.period * self.length

    @property
    def stacked_bytes(self) -> int:
        """Bytes of the stacked copy of the per-layer inputs (all layers)."""
        return self.length * sum(_nbytes(s) for s in self.stacked)


def _nbytes(s) -> int:
    try:
        return int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize
    except TypeError:  # PRNG key dtypes
        return 0


def _spec(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


### Tokens


class _Tokens:
    """Interns structural keys of equations, parameters and sub-programs to integers."""

    def __init__(self):
        self.ids: dict[Any, int] = {}
        self.jaxprs: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps memoised jaxprs alive, so their ids stay unique

    def intern(self, key) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def jaxpr(self, j) -> int:
        found = self.jaxprs.get(id(j))
        if found is None:
            names: dict[Any, int] = {}
            for v in (*j.constvars, *j.invars):
                names[v] = len(names)
            eqns = []
            for e in j.eqns:
                ins = tuple(_literal(v) if _is_lit(v) else names.get(v, -1) for v in e.invars)
                for v in e.outvars:
                    names[v] = len(names)
                eqns.append((self.strict_key(e), ins))
            outs = tuple(_literal(v) if _is_lit(v) else names.get(v, -1) for v in j.outvars)
            key = ("jaxpr", tuple(_aval(v.aval) for v in j.invars), tuple(eqns), outs)
            found = self.jaxprs[id(j)] = self.intern(key)
            self.keep.append(j)
        return found

    def freeze(self, v) -> Any:
        if isinstance(v, jcore.ClosedJaxpr):
            return ("closed", self.jaxpr(v.jaxpr), tuple(_const(c) for c in v.consts))
        if isinstance(v, jcore.Jaxpr):
            return ("open", self.jaxpr(v))
        if isinstance(v, tuple | list):
            return tuple(self.freeze(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, self.freeze(x)) for k, x in v.items()))
        if isinstance(v, np.ndarray | jax.Array):
            return _const(v)
        if isinstance(v, lu.WrappedFun) or (callable(v) and not isinstance(v, type)):
            return _code(v)
        try:
            hash(v)
        except TypeError:
            return ("repr", repr(v))
        return v

    def strict_key(self, e, loose: tuple | None = None) -> tuple:
        params = tuple(sorted((k, self.freeze(x)) for k, x in e.params.items()))
        effects = (id(e),) if e.effects else ()  # effectful equations never repeat
        literals = tuple(_literal(v) for v in e.invars if _is_lit(v))
        return (*(loose or self.loose_key(e)), params, literals, effects)

    @staticmethod
    def loose_key(e) -> tuple:
        ins = tuple(("lit", _aval(v.aval)) if _is_lit(v) else _aval(v.aval) for v in e.invars)
        return (e.primitive.name, ins, tuple(_aval(v.aval) for v in e.outvars))


def _is_lit(v) -> bool:
    return isinstance(v, jcore.Literal)


def _aval(a):
    """Avals hash and compare by shape, dtype, weak type and sharding."""
    return a


def _literal(v) -> tuple:
    val = v.val
    item = val.item() if hasattr(val, "item") else val
    return ("lit", _aval(v.aval), type(val).__name__, str(getattr(val, "dtype", "")), item)


def _const(c) -> tuple:
    a = np.asarray(c) if not jax.dtypes.issubdtype(c.dtype, jax.dtypes.prng_key) else None
    if a is None or a.size > 1 << 16:
        return ("const", id(c))
    return ("const", a.shape, str(a.dtype), hash(a.tobytes()))


def _code(f, depth: int = 0) -> tuple:
    """Callables compare by the code they wrap and what it closes over, so two rules that
    could compute differently never match: functions (and ``lu.WrappedFun``s) by their own
    code, hashable values by value, anything else by identity. JAX's own thunks (made per
    call, holding memo tables and stores) compare by the functions they close over only."""
    if isinstance(f, lu.WrappedFun):
        steps = tuple(_code(t[0] if isinstance(t, tuple) else t, depth + 1) for t in f.transforms)
        return ("code", "wrapped", _code(f.f, depth + 1), steps)
    bound: list[Any] = []
    for _ in range(8):
        code = getattr(f, "__code__", None)
        if code is not None:
            cells = tuple(_cell(c.cell_contents, depth) for c in (f.__closure__ or ()))
            if code.co_filename.startswith(_JAX_DIR):  # JAX's own thunks: only the functions
                cells = tuple(c for c in cells if isinstance(c, tuple) and c[:1] == ("code",))
            where = (code.co_filename, code.co_firstlineno, code.co_name)
            return ("code", where, cells, tuple(bound))
        if isinstance(f, functools.partial):
            bound.append((tuple(map(_by_value, f.args)), tuple(map(_by_value, f.keywords))))
        inner = getattr(f, "f", None) or getattr(f, "func", None) or getattr(f, "__wrapped__", None)
        if inner is None:
            break
        f = inner
    return ("callable", _by_value(f))


def _cell(x, depth: int) -> Any:
    if depth < 4 and (isinstance(x, lu.WrappedFun) or (callable(x) and not isinstance(x, type))):
        return _code(x, depth + 1)
    return _by_value(x)


def _by_value(x) -> Any:
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return x


### Dataflow


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
            out.append(("lit",))
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
    """The start in ``[lo, lo + period)`` whose layer boundaries the fewest values cross."""
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
    return lo + int(np.argmin(crossing))


@dataclasses.dataclass(frozen=True)
class _Mismatch:
    index: int  # equation index in the later layer
    other: int  # the equation it was compared with
    what: str


def _check(flow, strict, start, period, k) -> tuple[int, _Mismatch | None]:
    """How many leading layers of ``k`` from ``start`` form a valid run (0 if not two)."""
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
        if not hoistable[q] and strict[i] != strict[j]:
            return "parameters"
        for c, r in zip(classes, ref[q], strict=True):
            if c[0] == "far":
                return "reads a value from two or more layers before"
            if r[0] == "prev" and layer == 0:
                if c[0] != "out":
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


### Search


def _candidates(loose: np.ndarray) -> list[int]:
    last: dict[int, int] = {}
    gaps: collections.Counter = collections.Counter()
    for i, t in enumerate(loose.tolist()):
        if t in last:
            gaps[i - last[t]] += 1
        last[t] = i
    return [p for p, n in gaps.most_common(_CANDIDATES) if n >= 1]


def _stretches(loose: np.ndarray, p: int) -> list[tuple[int, int]]:
    """Maximal ``[lo, hi)`` with ``loose[i] == loose[i - p]`` for ``lo + p <= i < hi``, at
    least two periods long."""
    if p >= len(loose):
        return []
    same = np.concatenate([[False], loose[p:] == loose[:-p], [False]])
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    out = []
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        if b - a >= p:  # same[a..b) true: equations [a, b + p) are periodic
            out.append((int(a), int(b) + p))
    return out


def _search(jaxpr, tokens: _Tokens, mismatches: list) -> list[tuple[int, int, int, _Flow, list]]:
    """Checked runs ``(start, period, k, flow, strict)`` of one jaxpr, without overlap."""
    eqns = jaxpr.eqns
    if len(eqns) < 2:
        return []
    keys = [tokens.loose_key(e) for e in eqns]
    loose = np.array([tokens.intern(k) for k in keys], np.int64)
    strict = [tokens.intern(tokens.strict_key(e, k)) for e, k in zip(eqns, keys, strict=True)]
    flow = _Flow.of(jaxpr)
    found = []
    for p in _candidates(loose):
        for lo, hi in _stretches(loose, p):
            pos = _phase(flow, lo, min(hi, lo + 3 * p), p)
            while (hi - pos) // p >= 2:
                k, bad = _check(flow, strict, pos, p, (hi - pos) // p)
                if bad is not None:
                    mismatches.append(bad)
                if k >= 2:
                    found.append((pos, p, k))
                pos += max(k, 1) * p
    found.sort(key=lambda r: (-r[1] * r[2], r[1], r[0]))
    taken: list[tuple[int, int, int]] = []
    for s, p, k in found:
        if all(s + p * k <= t or t + q * n <= s for t, q, n in taken):
            taken.append((s, p, k))
    return [(s, p, k, flow, strict) for s, p, k in sorted(taken)]


def _find(jaxpr, path, tokens, mismatches, out: list[Run]) -> None:
    runs = _search(jaxpr, tokens, mismatches)
    for s, p, k, flow, strict in runs:
        plan, summary = _plan(flow, strict, s, p, k)
        out.append(Run(path, s, p, k, _source(jaxpr.eqns[s]), plan=plan, **summary))
    covered = [(s, s + p * k) for s, p, k, _, _ in runs]
    for i, e in enumerate(jaxpr.eqns):
        if e.primitive.name in _CALLS and not any(a <= i < b for a, b in covered):
            sub = e.params.get("jaxpr") or e.params.get("call_jaxpr")
            _find(sub.jaxpr, (*path, i), tokens, mismatches, out)


def find_runs(closed_jaxpr: jcore.ClosedJaxpr) -> list[Run]:
    """The runs of repeated layers in a traced program (see the module docstring).

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.

    Returns:
      The runs, in order of their path and start; empty when nothing repeats.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_detect import find_runs
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return x.sum()
      >>> run, = find_runs(jax.make_jaxpr(f)([jnp.ones((3, 3))] * 4, jnp.ones(3)))
      >>> run.length, run.period, len(run.stacked)
      (4, 2, 1)
    """
    out: list[Run] = []
    _find(closed_jaxpr.jaxpr, (), _Tokens(), [], out)
    return out


### Explaining


def _where(e) -> str:
    src = _source(e)
    return f" ({src.rsplit('/', 1)[-1]})" if src else ""


def _describe(a, b) -> str:
    """What differs between two equations compared as corresponding layer positions."""
    if a.primitive != b.primitive:
        return f"{a.primitive.name} vs {b.primitive.name}"
    ia = [str(v.aval.str_short()) for v in a.invars]
    ib = [str(v.aval.str_short()) for v in b.invars]
    if ia != ib:
        pairs = [(x, y) for x, y in zip(ia, ib, strict=False) if x != y] or [(ia, ib)]
        x, y = pairs[0]
        return f"{a.primitive.name} input {x} vs {y}"
    oa = [str(v.aval.str_short()) for v in a.outvars]
    ob = [str(v.aval.str_short()) for v in b.outvars]
    if oa != ob:
        return f"{a.primitive.name} output {oa} vs {ob}"
    return f"{a.primitive.name} parameters differ"


def explain_no_roll(closed_jaxpr: jcore.ClosedJaxpr) -> str:
    """One line saying why nothing in a program can be rolled into a scan.

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.

    Returns:
      The reason, e.g. ``"layer at eqn 120 (model.py:33) differs from the one before it:
      dot_general input f32[64,128] vs f32[64,256]"``; when runs are found, a line that
      says how many.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_detect import explain_no_roll
      >>> explain_no_roll(jax.make_jaxpr(lambda x: jnp.sin(x).sum())(jnp.ones(3)))
      'no repeated structure found: no sequence of equations repeats (2 equations)'
    """
    runs = find_runs(closed_jaxpr)
    if runs:
        layers = ", ".join(f"{r.length} layers at eqn {r.start}" for r in runs)
        return f"{len(runs)} run(s) roll: {layers}"
    jaxpr = closed_jaxpr.jaxpr
    eqns = jaxpr.eqns
    mismatches: list[_Mismatch] = []
    _search(jaxpr, _Tokens(), mismatches)
    if mismatches:
        m = mismatches[0]
        a, b = eqns[m.index], eqns[m.other]
        what = m.what if m.what not in ("parameters",) else _describe(a, b)
        return (
            f"layer at eqn {m.index}{_where(a)} differs from the one before it: "
            f"{what if m.what != 'dataflow' else 'it reads its inputs differently'}"
        )
    # Same primitives in the same order, different shapes: compare by primitive name only.
    names = [e.primitive.name for e in eqns]
    ids: dict[str, int] = {}
    coarse = np.array([ids.setdefault(n, len(ids)) for n in names], np.int64)
    best = None
    for p in _candidates(coarse):
        for lo, hi in _stretches(coarse, p):
            if best is None or hi - lo > best[1] - best[0]:
                best = (lo, hi, p)
    if best is not None:
        lo, hi, p = best
        tokens = _Tokens()
        for i in range(lo + p, hi):
            a, b = eqns[i], eqns[i - p]
            if tokens.loose_key(a) != tokens.loose_key(b):
                return (
                    f"layer at eqn {i}{_where(a)} differs from the one before it: {_describe(a, b)}"
                )
    return f"no repeated structure found: no sequence of equations repeats ({len(eqns)} equations)"
