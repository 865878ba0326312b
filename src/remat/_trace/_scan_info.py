"""The scans of a traced program: `ScanInfo`, their positions, names and source lines.

Positions. Scans are numbered 0, 1, ... in depth-first order of appearance: a scan comes
before the scans in its body, which come before the next scan after it. A scan that remat
rolled from layers written in a Python loop (`_roll_rewrite`) is numbered after all of the
program's own scans, so rolling never moves them: its step function is named
``remat_rolled_step_{position}`` (`mark_rolled`), which `rolled_position` reads back, and the
depth-first count (`count`, `count_eqn`) passes over it.

Names. A scan's *name* is the innermost `jax.named_scope` / `jax.named_call` (or `jax.jit`-ed
function's name) opened between the enclosing scan body (or the program itself) and the
scan; without one, the name of the step function the user wrote (``def run(h, block)``
under `nnx.scan`, ``def layer(h, w)`` under `lax.scan`); ``""`` when there is neither (a
``lambda``, or a step made inside JAX or a layer library, as `lax.map`'s). ``path`` is the
full chain of named scopes from the program's root, outermost first. `flax.linen.scan`
scans are named after the module that calls them; ``module`` is the scope the body's
equations all open first, the scanned module's own name (``nn.scan(Block, ...)(name="layers")``
gives ``"layers"``), and selects the scan too (``Strategy(scans=("layers",))``).

Only the sub-programs of ``scan``, ``jit``, ``closed_call``/``call``, ``checkpoint`` and
``cond`` are looked into (`sub_jaxprs`); `_rewrite.py` rewrites exactly those.
"""

from __future__ import annotations

import dataclasses

import jax
from jax._src import source_info_util
from jax.extend import core as jcore

from .._core._scan_params import scan_counts
from ._jaxpr_walk import display_path, library_dirs

_P = jcore.primitives


@dataclasses.dataclass(frozen=True)
class ScanInfo:
    """One ``scan`` equation of a traced program.

    Attributes:
      position: index in depth-first order of appearance (0 is the first scan).
      name: innermost named scope between the enclosing scan body (or the program) and
        this scan; else the user's step function's name; ``""`` if neither.
      path: all named scopes from the program's root to this scan, outermost first.
      length: number of steps.
      reverse: whether the scan runs from the last step to the first.
      unroll: the scan's unroll factor.
      num_consts: number of loop-invariant inputs (closed-over values such as weights).
      num_carry: number of carried values.
      source: ``"file:line"`` of the user code that made the scan, ``""`` if unknown.
      jaxpr: the scan body as a `ClosedJaxpr`; inputs ``consts + carry + xs``, outputs
        ``new_carry + ys``.
      module: the named scope every named equation of the body opens first (a
        `flax.linen.scan`'s scanned module, ``"layers"``), ``""`` when they differ or none is.
      stacked: for a scan rolled from layers written in a Python loop (``roll=True``, named
        ``rolled_{k}_layers``, ``source`` the first layer's line): the shape and dtype, of
        one layer, of each per-layer input stacked for it (weights, dropout keys); None for
        the program's own scans.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     with jax.named_scope("layers"):
      ...         h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
      ...     return h.sum()
      >>> info, = remat.list_scans(loss, jnp.ones((4, 8, 8)), jnp.ones((2, 8)))
      >>> info.position, info.name, info.length, info.num_carry
      (0, 'layers', 4, 1)
    """

    position: int
    name: str
    path: tuple[str, ...]
    length: int
    reverse: bool
    unroll: int
    num_consts: int
    num_carry: int
    source: str
    jaxpr: jcore.ClosedJaxpr = dataclasses.field(repr=False, compare=False)
    module: str = ""
    stacked: tuple[jax.ShapeDtypeStruct, ...] | None = None


def scopes(eqn) -> tuple[str, ...]:
    """The named scopes (not the transformation names) of an equation's own name stack."""
    return tuple(
        s.name for s in eqn.source_info.name_stack.stack if isinstance(s, source_info_util.Scope)
    )


def _frame(eqn):
    """The innermost user frame of ``eqn`` outside flax and equinox (else inside), or None."""
    frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    library = library_dirs(("flax", "equinox"))
    outside = [f for f in frames if not f.file_name.startswith(library)]
    return (outside or frames or [None])[0]


def _source(eqn) -> str:
    """``"file.py:12"``, the file relative to the working directory where it lies below it
    (as everywhere remat shows a source line), ``""`` if unknown."""
    frame = _frame(eqn)
    return "" if frame is None else f"{display_path(frame.file_name)}:{frame.start_line}"


def _step_name(eqn) -> str:
    """The name of the user's step function of a scan (``"run"``), ``""`` for a ``lambda``
    or a function defined in JAX, remat or a layer library."""
    info = eqn.params["jaxpr"].jaxpr.debug_info
    name, _, where = (getattr(info, "func_src_info", None) or "").partition(" at ")
    if not name.isidentifier() or where.startswith(library_dirs() + library_dirs(("jax",))):
        return ""
    return name


def _leading_scopes(jaxpr: jcore.Jaxpr, out: set[str]) -> None:
    """Adds to ``out`` the first named scope of each equation of ``jaxpr`` (an equation
    without one is looked into: a checkpoint or a jit around the body's work); a nested
    scan is left out, its scope names that scan."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is _P.scan_p:
            continue
        own = scopes(eqn)
        if own:
            out.add(own[0])
        else:
            for sub in sub_jaxprs(eqn):
                _leading_scopes(sub, out)


def _body_module(eqn) -> str:
    """The one scope the scan body's equations open first (``"layers"``), else ``""``."""
    leading: set[str] = set()
    _leading_scopes(eqn.params["jaxpr"].jaxpr, leading)
    return next(iter(leading)) if len(leading) == 1 else ""


_ROLLED = "remat_rolled_step_"  # the name of a rolled scan's step function, then its position


def mark_rolled(step, position: int):
    """Names ``step`` (a scan's step function) as the step of the rolled scan at ``position``
    (see the module docstring); returns it."""
    step.__name__ = step.__qualname__ = f"{_ROLLED}{position}"
    return step


def rolled_position(body: jcore.ClosedJaxpr) -> int | None:
    """The position of the rolled scan whose body is ``body`` (`mark_rolled`), None for any
    other scan.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> step = mark_rolled(lambda c, x: (c + x, None), 7)
      >>> eqn, = jax.make_jaxpr(lambda xs: jax.lax.scan(step, 0.0, xs)[0])(jnp.ones(3)).eqns
      >>> rolled_position(eqn.params["jaxpr"]), rolled_position(eqn.params["jaxpr"]) is None
      (7, False)
    """
    info = body.jaxpr.debug_info
    name = (getattr(info, "func_src_info", None) or "").partition(" at ")[0]
    tail = name[len(_ROLLED) :] if name.startswith(_ROLLED) else ""
    return int(tail) if tail.isdigit() else None


def scan_info(eqn, position: int, path: tuple[str, ...], rel: tuple[str, ...]) -> ScanInfo:
    """The `ScanInfo` of the scan ``eqn``, numbered ``position`` unless it is a rolled scan
    (which keeps its own position: see the module docstring)."""
    p = eqn.params
    rolled = rolled_position(p["jaxpr"])
    position = position if rolled is None else rolled
    num_consts, num_carry = scan_counts(p)
    own = rel + scopes(eqn)
    return ScanInfo(
        position=position,
        name=own[-1] if own else _step_name(eqn),
        path=path + scopes(eqn),
        length=int(p["length"]),
        reverse=bool(p["reverse"]),
        unroll=int(p["unroll"]),
        num_consts=num_consts,
        num_carry=num_carry,
        source=_source(eqn),
        jaxpr=p["jaxpr"],
        module=_body_module(eqn),
    )


def sub_jaxprs(eqn) -> list[jcore.Jaxpr]:
    """The sub-programs the interpreter looks into (see the module docstring)."""
    prim, p = eqn.primitive, eqn.params
    if prim is _P.scan_p or prim is _P.jit_p:
        return [p["jaxpr"].jaxpr]
    if prim is _P.closed_call_p:
        return [p["call_jaxpr"].jaxpr]
    if prim is _P.call_p:
        return [p["call_jaxpr"]]
    if prim is _P.remat_p:
        return [p["jaxpr"]]
    if prim is _P.cond_p:
        return [b.jaxpr for b in p["branches"]]
    return []


def count(jaxpr: jcore.Jaxpr, memo: dict) -> int:
    """Number of scans in ``jaxpr`` numbered in depth-first order, nested ones included
    (rolled scans, numbered after them, are not: see the module docstring)."""
    key = id(jaxpr)
    if key not in memo:
        memo[key] = sum(count_eqn(eqn, memo) for eqn in jaxpr.eqns)
    return memo[key]


def holds_scan(jaxpr: jcore.Jaxpr, memo: dict) -> bool:
    """Whether ``jaxpr`` has a scan, rolled or not, in it or in a sub-program."""
    key = ("holds", id(jaxpr))
    if key not in memo:
        memo[key] = any(
            eqn.primitive is _P.scan_p or any(holds_scan(j, memo) for j in sub_jaxprs(eqn))
            for eqn in jaxpr.eqns
        )
    return memo[key]


def scans_of(jaxpr: jcore.Jaxpr) -> list[ScanInfo]:
    """The scans of a program, in order of position: its own in depth-first order, then
    the rolled ones (see the module docstring)."""
    out: list[ScanInfo] = []
    walk(jaxpr, 0, (), (), out, {})
    return sorted(out, key=lambda info: info.position)


def walk(jaxpr, base, path, rel, out: list[ScanInfo], memo) -> None:
    """Appends to ``out`` the scans of ``jaxpr``, numbered from ``base``, depth first."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is _P.scan_p:
            info = scan_info(eqn, base, path, rel)
            out.append(info)
            walk(info.jaxpr.jaxpr, base + 1, info.path, (), out, memo)
        else:
            inner_path, inner_rel = inner_scope(eqn, path, rel)
            b = base
            for sub in sub_jaxprs(eqn):
                walk(sub, b, inner_path, inner_rel, out, memo)
                b += count(sub, memo)
        base += count_eqn(eqn, memo)


def count_eqn(eqn, memo) -> int:
    """Number of scans numbered in depth-first order that an equation is or contains."""
    own = eqn.primitive is _P.scan_p and rolled_position(eqn.params["jaxpr"]) is None
    return own + sum(count(j, memo) for j in sub_jaxprs(eqn))


def position_of(eqn, base: int) -> int:
    """The position of the scan ``eqn`` met at depth-first position ``base``."""
    rolled = rolled_position(eqn.params["jaxpr"])
    return base if rolled is None else rolled


def inner_scope(eqn, path, rel):
    """The scope path inside a non-scan sub-program (a jit adds its function's name)."""
    names = scopes(eqn)
    if eqn.primitive is _P.jit_p:
        names = (*names, eqn.params["name"])
    return path + names, rel + names
