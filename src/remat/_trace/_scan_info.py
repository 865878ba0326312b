"""The scans of a traced program: `ScanInfo`, their positions, names and source lines.

Positions. Scans are numbered 0, 1, ... in depth-first order of appearance: a scan comes
before the scans in its body, which come before the next scan after it.

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


def scan_info(eqn, position: int, path: tuple[str, ...], rel: tuple[str, ...]) -> ScanInfo:
    p = eqn.params
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


def count(jaxpr: jcore.Jaxpr, memo: dict[int, int]) -> int:
    """Number of scans in ``jaxpr``, nested ones included."""
    key = id(jaxpr)
    if key not in memo:
        memo[key] = sum(
            (eqn.primitive is _P.scan_p) + sum(count(j, memo) for j in sub_jaxprs(eqn))
            for eqn in jaxpr.eqns
        )
    return memo[key]


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
    """Number of scans an equation is or contains."""
    return (eqn.primitive is _P.scan_p) + sum(count(j, memo) for j in sub_jaxprs(eqn))


def inner_scope(eqn, path, rel):
    """The scope path inside a non-scan sub-program (a jit adds its function's name)."""
    names = scopes(eqn)
    if eqn.primitive is _P.jit_p:
        names = (*names, eqn.params["name"])
    return path + names, rel + names
