"""Rolling repeated layers into scans: `roll`, `roll_unscanned`, `roll_jaxpr`, `list_runs`,
`rolled_scans`.

`_roll_detect.find_runs` finds the runs of identical layers of a traced program; here each
run is evaluated as one `lax.scan` over the layer index: the body selects its layer's
per-layer inputs (weights, keys) with `lax.switch` on the index, its carried values are the
scan's carry, and it evaluates the first layer's equations, bound again with their own
parameters and source information.

Selecting rather than stacking: stacking the per-layer inputs with `jnp.stack` inside the
step copies them, and the backward pass computes the stacked gradient before splitting it
into the per-layer gradients: about twice the weights more memory. With `lax.switch` nothing
is copied, and the gradient of each layer's inputs is accumulated in place in the backward
loop (at the cost of adding zeros to the other layers' gradients at every step: ``k`` times
the weights in elementwise additions, no matmul). On a 12-layer transformer the
checkpointed rolled step's peak drops from 0.38 to 0.27 of the program as written (stacked
by hand: 0.26); docs/rolling.md has the figures. Equations that
make per-layer inputs from outside values only (linen's per-layer dropout-key folding) are
evaluated for every layer before the scan and their results stacked; inside a layer under
``nn.remat`` that folding is a literal of the checkpoint's sub-program, which
`_roll_lift.lift_layer_constants` first makes an input made outside it. Everything else is
bound as it was, so values and gradients equal the program as written (up to the
reassociation XLA may do differently in a loop).

Each scan runs under ``jax.named_scope(run.name)`` (``rolled_{k}_layers``, numbered from
``_2`` for a later run of as many layers) and keeps the first layer's
source line, so `remat.list_scans` shows it with a name, a length and a line.

Beside the program's own scans. A program may have scans of its own (a `jax.lax.map`
chunked loss, a `lax.scan` over some layers) and layers in a Python loop too. Its own scans
keep their positions and names: the rolled scans are numbered after them
(`numbered_runs`; `_scan_info.mark_rolled` marks each rolled scan with its position), so a
strategy or a plan that names a scan by position, and `remat.list_scans(fn, roll=False)`,
mean the same scans with and without rolling. Layers that each hold a scan are left as
written (with a warning from `roll_unscanned`): one rolled scan would fold their scans into
one and renumber the program's scans.

`roll_unscanned` is what ``roll=True`` (the default of `remat.apply`, `remat.list_scans`,
`remat.measure`, `remat.compare`, `remat.plan` and `remat.lint`) does.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import source_info_util
from jax.extend import core as jcore

from .._core._errors import brief
from .._core._warnings import RematWarning
from ._roll_detect import Run
from ._roll_explain import holds_scan, nested_not_rolled
from ._roll_lift import lifted_runs
from ._scan_info import ScanInfo, mark_rolled, scans_of
from ._traced import _rewritten, _split_args, _trace

_P = jcore.primitives


def _bind(eqn, invals: Sequence[Any]) -> list[Any]:
    """Binds one equation again, with its own source information and context."""
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with (
        source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    ):
        out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    return out if eqn.primitive.multiple_results else [out]


def _write(env, eqn, outs) -> None:
    for v, x in zip(eqn.outvars, outs, strict=True):
        if not isinstance(v, jcore.DropVar):
            env[v] = x


def _read(env, v):
    return v.val if isinstance(v, jcore.Literal) else env[v]


def _run_scan(run: Run, eqns, env) -> None:
    """Evaluates ``run`` as a `lax.scan`, writing the values used after it into ``env``."""
    plan, s, p, k = run.plan, run.start, run.period, run.length
    for layer in range(k):  # per-layer inputs made from outside values only
        for q in plan.hoisted:
            e = eqns[s + layer * p + q]
            _write(env, e, _bind(e, [_read(env, v) for v in e.invars]))
    per_layer = [[_read(env, v) for v in per] for per in plan.xs]
    # a constant that starts a carried value (``aux = 0.0``) takes the carry's dtype
    init = [jnp.asarray(_read(env, v), c.dtype) for v, c in zip(plan.init, run.carry, strict=True)]
    shared = {v: _read(env, v) for row in plan.sources for kind, v in row if kind == "shared"}
    first = [eqns[s + q] for q in plan.body]

    def select(layer):
        """The per-layer inputs of one layer (see the module docstring)."""
        return [values[layer] for values in per_layer]

    branches = [functools.partial(select, layer) for layer in range(k)]

    def step(carry, index):
        x = lax.switch(index, branches) if per_layer else []
        local: dict[Any, Any] = {}
        for e, row in zip(first, plan.sources, strict=True):
            invals = []
            for kind, ref in row:
                if kind == "local":
                    invals.append(local[ref])
                elif kind == "carry":
                    invals.append(carry[ref])
                elif kind == "xs":
                    invals.append(x[ref])
                elif kind == "shared":
                    invals.append(shared[ref])
                else:
                    invals.append(ref)
            _write(local, e, _bind(e, invals))
        new = [local[ref] if kind == "local" else x[ref] for kind, ref in plan.carry_out]
        return new, [local[eqns[s + q].outvars[o]] for q, o in plan.ys]

    traceback = eqns[s].source_info.traceback
    with source_info_util.user_context(traceback), jax.named_scope(run.name):
        carry, ys = lax.scan(mark_rolled(step, run.position), init, jnp.arange(k), length=k)
    last = s + (k - 1) * p
    for (q, o), value in zip(plan.carry, carry, strict=True):
        env[eqns[last + q].outvars[o]] = value
    for (q, o), stacked in zip(plan.ys, ys, strict=True):
        for layer in range(k):
            v = eqns[s + layer * p + q].outvars[o]
            if not isinstance(v, jcore.DropVar):
                env[v] = stacked[layer]


def _evaluate(jaxpr: jcore.Jaxpr, consts, args, runs: Sequence[Run], path=()) -> list[Any]:
    here = {r.start: r for r in runs if r.path == path}
    inner = {r.path[len(path)] for r in runs if len(r.path) > len(path) and r.path[:-1] == path}
    env: dict[Any, Any] = {}
    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    eqns = jaxpr.eqns
    i = 0
    while i < len(eqns):
        if i in here:
            _run_scan(here[i], eqns, env)
            i = here[i].stop
            continue
        e = eqns[i]
        invals = [_read(env, v) for v in e.invars]
        if i in inner:
            key = "jaxpr" if e.primitive is _P.jit_p else "call_jaxpr"
            sub = e.params[key]
            sub_runs = [r for r in runs if r.path[: len(path) + 1] == (*path, i)]
            new = roll_jaxpr(sub, sub_runs, path=(*path, i))
            e = e.replace(params=dict(e.params, **{key: new}))
        _write(env, e, _bind(e, invals))
        i += 1
    return [_read(env, v) for v in jaxpr.outvars]


def roll_jaxpr(
    closed_jaxpr: jcore.ClosedJaxpr, runs: Sequence[Run] | None = None, *, path=()
) -> jcore.ClosedJaxpr:
    """The program with each run of identical layers evaluated as one `lax.scan`.

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.
      runs: the runs to roll, from `numbered_runs` (the default: those of ``closed_jaxpr``,
        its per-layer constants lifted first, `_roll_lift`).
      path: where ``closed_jaxpr`` sits in the program the runs were found in (used when
        rolling inside a `jax.jit` sub-program).

    Returns:
      A `ClosedJaxpr` with the same inputs and outputs.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import roll_jaxpr
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return x.sum()
      >>> rolled = roll_jaxpr(jax.make_jaxpr(f)([jnp.ones((3, 3))] * 4, jnp.ones(3)))
      >>> [e.primitive.name for e in rolled.eqns]
      ['iota', 'scan', 'reduce_sum']
    """
    if runs is None:
        closed_jaxpr, runs, _ = numbered_runs(closed_jaxpr, len(scans_of(closed_jaxpr.jaxpr)))
    specs = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        for a in closed_jaxpr.in_avals
    ]
    j = closed_jaxpr.jaxpr

    def fn(*args):
        return _evaluate(j, closed_jaxpr.consts, args, runs, path)

    return jax.make_jaxpr(fn)(*specs)


_NOT_CALLABLE = "`remat.roll` got fn={got}, which is not callable; pass the loss function."


def roll(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Returns ``fn`` with every run of identical layers evaluated as one `lax.scan`.

    ``fn`` is traced (once per input structure, shapes and dtypes), its runs are found by
    `find_runs`, and the program is evaluated with each run rolled (see `roll_jaxpr`). The
    result has ``fn``'s signature, values and gradients; `remat.apply` then checkpoints the
    rolled scans like any other. ``fn2.runs(*args, **kwargs)`` lists the runs it rolls.

    Args:
      fn: the function; pytree arguments and outputs.

    Returns:
      A function with ``fn``'s signature and output structure.

    Raises:
      TypeError: if ``fn`` is not callable.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import roll
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return x.sum()
      >>> ws, x = [jnp.eye(3) * 0.5] * 5, jnp.ones(3)
      >>> bool(jnp.allclose(roll(f)(ws, x), f(ws, x)))
      True
      >>> [(r.length, r.period) for r in roll(f).runs(ws, x)]
      [(5, 2)]
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    fn2 = _rolled(fn, warn=False)

    def runs(*args, **kwargs) -> tuple[Run, ...]:
        return tuple(list_runs(fn, *args, **kwargs))

    fn2.runs = runs
    return fn2


def _rolled(fn: Callable[..., Any], warn: bool) -> Callable[..., Any]:
    """``fn`` with the runs `numbered_runs` keeps rolled; ``warn``: say which it leaves."""

    def evaluator(traced):
        closed, runs, left = numbered_runs(traced.jaxpr, len(traced.scans))
        why = nested_not_rolled(left) if warn else None
        if why is not None:
            warnings.warn(why, RematWarning, stacklevel=3)

        def evaluate(*dynamic):
            return _evaluate(closed.jaxpr, closed.consts, dynamic, runs)

        return evaluate

    return _rewritten(fn, evaluator)


def _layers(jaxpr: jcore.Jaxpr, run: Run) -> list[Any]:
    """The equations of ``run``'s layers in ``jaxpr``, the program it was found in."""
    for i in run.path:
        eqn = jaxpr.eqns[i]
        jaxpr = (eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")).jaxpr
    return jaxpr.eqns[run.start : run.stop]


def numbered_runs(
    closed_jaxpr: jcore.ClosedJaxpr, first: int
) -> tuple[jcore.ClosedJaxpr, tuple[Run, ...], list[Run]]:
    """The runs to roll in a program with ``first`` scans of its own, and those left.

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.
      first: the number of scans the program has (`remat.list_scans(fn, roll=False)`):
        the first rolled scan's position.

    Returns:
      ``(program, runs, left)``: the program with its per-layer constants lifted
      (`lifted_runs`), which the runs index; the runs to roll, each with its ``position``
      (from ``first`` on, in depth-first order); and the runs left as written, whose layers
      each hold a scan (see the module docstring).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import numbered_runs
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return jax.lax.map(jnp.sum, x)
      >>> _, runs, left = numbered_runs(jax.make_jaxpr(f)([jnp.eye(3)] * 4, jnp.ones((2, 3))), 1)
      >>> [(r.length, r.position) for r in runs], left
      ([(4, 1)], [])
    """
    closed_jaxpr, runs = lifted_runs(closed_jaxpr)
    jaxpr = closed_jaxpr.jaxpr
    nested = [any(holds_scan(e) for e in _layers(jaxpr, r)) for r in runs]
    order = sorted((k for k, n in enumerate(nested) if not n),
                   key=lambda k: (*runs[k].path, runs[k].start))  # fmt: skip
    position = {k: first + i for i, k in enumerate(order)}
    kept = tuple(dataclasses.replace(r, position=position[k]) for k, r in enumerate(runs)
                 if k in position)  # fmt: skip
    return closed_jaxpr, kept, [r for r, n in zip(runs, nested, strict=True) if n]


def list_runs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Run]:
    """The runs of identical layers `roll` would roll in ``fn`` at these inputs.

    Args:
      fn: the function; it is traced, not run.
      *args: positional arguments: arrays, or `jax.ShapeDtypeStruct` to avoid allocating.
      **kwargs: keyword arguments.

    Returns:
      The runs `numbered_runs` keeps in the traced program.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import list_runs
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = x + jnp.sin(x @ w)
      ...     return x.sum()
      >>> [(r.length, r.source.rsplit(":", 1)[-1]) for r in list_runs(f, [jnp.ones((2, 2))] * 3, jnp.ones(2))]
      [(3, '3')]
    """
    leaves, treedef, _, _ = _split_args(args, kwargs)
    traced = _trace(fn, leaves, treedef)
    return list(numbered_runs(traced.jaxpr, len(traced.scans))[1])


def roll_unscanned(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its layers that run outside any scan rolled: `roll`, which also warns
    about the runs it leaves as written (layers that each hold a scan).

    Args:
      fn: the function; pytree arguments and outputs.

    Returns:
      A function with ``fn``'s signature, values and gradients.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._roll_rewrite import roll_unscanned
      >>> def f(ws, x):
      ...     for w in ws:
      ...         x = jnp.tanh(x @ w)
      ...     return x.sum()
      >>> ws, x = [jnp.eye(3) * 0.5] * 4, jnp.ones(3)
      >>> [e.primitive.name for e in jax.make_jaxpr(roll_unscanned(f))(ws, x).eqns]
      ['iota', 'scan', 'reduce_sum']
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    return _rolled(fn, warn=True)


def rolled_scans(fn: Callable[..., Any], args, kwargs, check: bool = True) -> list[ScanInfo]:
    """The scans of ``roll_unscanned(fn)`` at these inputs, in order of position: the
    program's own, then one per run of layers, named ``rolled_{k}_layers``
    (``rolled_{k}_layers_2``, ... for later runs of as many layers), with the first layer's
    source line and ``stacked`` set to the shapes and dtypes (of one layer) of the
    per-layer inputs stacked for it.
    """
    leaves, treedef, _, _ = _split_args(args, kwargs)
    traced = _trace(fn, leaves, treedef, check=check)
    closed, runs, _ = numbered_runs(traced.jaxpr, len(traced.scans))
    if not runs:
        return list(traced.scans)
    by_position = {r.position: r for r in runs}
    return [
        dataclasses.replace(info, stacked=by_position[info.position].stacked)
        if info.position in by_position
        else info
        for info in scans_of(roll_jaxpr(closed, runs).jaxpr)
    ]
