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
   those at least ``2p`` long hold two layers or more. The gaps to the occurrence before
   the last give the period of layers of two kinds in turn (a pair is then one layer); the
   4 most frequent that are not twice a candidate are tried too. A "layer" of one plain equation
   (no sub-program) is not kept: it has nothing to recompute.
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
   carry's initial value, one per carried value), with equal strict tokens; a layer 0 that
   reads a constant there instead (``aux = 0.0``, then ``aux = aux + ...`` in every layer)
   joins the run found after it, the constant as the carry's initial value. Equations that
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

The steps live in one module each: tokens in `_roll_tokens`, the dataflow check and the
evaluation plan in `_roll_dataflow`, the search (steps 2, 3 and 5) here, and the one-line
reason when nothing rolls in `_roll_explain`.

Cost: tokens ``O(n)`` (each sub-program hashed once), then ``O(24 n)`` for the candidates
and checks: about a second for 200 layers of tens of equations in pure Python.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np
from jax.extend import core as jcore

from ._roll_dataflow import _check, _Flow, _phase, _plan, _RunPlan
from ._roll_tokens import _Tokens
from ._scan_info import _source

_CANDIDATES = 24  # candidate periods tried per jaxpr
_PAIR_CANDIDATES = 4  # and periods of layers of two kinds in turn
_CALLS = ("jit", "closed_call")  # searched inside when not part of a run


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
      name: the rolled scan's name, ``rolled_{length}_layers``; a later run of as many
        layers in the same program gets ``rolled_{length}_layers_2``, ``_3``, ... so that each
        name selects one scan (an encoder and a decoder of three layers each).
      position: the rolled scan's position among the program's scans, set when it is rolled
        (`_roll_rewrite.numbered_runs`): after the program's own scans, in depth-first order.
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
    name: str = ""
    position: int = 0

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


### Search


def _candidates(loose: np.ndarray) -> list[int]:
    """The most frequent gaps between a token's consecutive occurrences, then the most
    frequent gaps to its occurrence before that, where such a gap is not twice a candidate:
    layers of two kinds in turn (GPT-Neo's global and local attention) repeat as a pair,
    whose period only the second gap shows."""
    last: dict[int, int] = {}
    before: dict[int, int] = {}
    gaps: collections.Counter = collections.Counter()
    pairs: collections.Counter = collections.Counter()
    for i, t in enumerate(loose.tolist()):
        if t in before:
            pairs[i - before[t]] += 1
        if t in last:
            gaps[i - last[t]] += 1
            before[t] = last[t]
        last[t] = i
    out = [p for p, _ in gaps.most_common(_CANDIDATES)]
    twice = {2 * p for p in out}
    out += [p for p, _ in pairs.most_common(_PAIR_CANDIDATES) if p not in twice and p not in out]
    return out


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

    def carry_key(i: int, positions: frozenset) -> int:
        return tokens.intern(tokens.carry_key(eqns[i], positions))

    found = []
    for p in _candidates(loose):
        for lo, hi in _stretches(loose, p):
            pos = _phase(flow, lo, min(hi, lo + 3 * p), p)
            while (hi - pos) // p >= 2:
                k, bad = _check(flow, strict, pos, p, (hi - pos) // p)
                if bad is not None:
                    mismatches.append(bad)
                if k >= 2:
                    # the layer before joins if it starts a carried value from a constant
                    # (its loose tokens differ there, so the stretch began after it)
                    before = (
                        _check(flow, strict, pos - p, p, k + 1, carry_key) if pos >= p else (0,)
                    )
                    if before[0] == k + 1:
                        pos, k = pos - p, k + 1
                    found.append((pos, p, k))
                pos += max(k, 1) * p
    found.sort(key=lambda r: (-r[1] * r[2], r[1], r[0]))
    taken: list[tuple[int, int, int]] = []
    for s, p, k in found:
        if all(s + p * k <= t or t + q * n <= s for t, q, n in taken):
            taken.append((s, p, k))
    return [(s, p, k, flow, strict) for s, p, k in sorted(taken)]


def _worth_rolling(jaxpr, start: int, period: int) -> bool:
    """A layer of one plain equation (``a + b + c``: two adds) has nothing to recompute: its
    only residual is its input, which the scan keeps anyway. One equation that calls a
    sub-program (an inner `jax.jit`, a checkpointed layer) is a layer."""
    return period > 1 or bool(list(jcore.jaxprs_in_params(jaxpr.eqns[start].params)))


def _find(jaxpr, path, tokens, mismatches, out: list[Run]) -> None:
    runs = [r for r in _search(jaxpr, tokens, mismatches) if _worth_rolling(jaxpr, r[0], r[1])]
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
    seen: dict[str, int] = {}
    named = []
    for run in out:
        base = f"rolled_{run.length}_layers"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        named.append(dataclasses.replace(run, name=name))
    return named
