"""Structural tokens of jaxpr equations, for finding repeated layers (`_roll_detect`).

Every equation gets a *loose* token (primitive, input and output shapes and dtypes) and a
*strict* one that adds its parameters and literal values. Sub-programs in parameters (inner
`jax.jit`, ``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``) are hashed structurally
(their equations, with variables numbered by position) and memoised, so a layer wrapped in
``jax.jit`` or ``nn.remat`` is one equation whose token is the same in every layer; callables
in parameters (custom derivative rules, policies) compare by their code and what it closes
over. Tokens are interned to integers.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import numpy as np
from jax._src import linear_util as lu  # custom_vjp_call's rules are `lu.WrappedFun`s
from jax.extend import core as jcore

_JAX_DIR = os.path.dirname(jax.__file__) + os.sep  # JAX's own code lies below it


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

    def strict_key(
        self, e, loose: tuple | None = None, positions: frozenset = frozenset()
    ) -> tuple:
        """The loose key (``loose``, else `loose_key`) with the parameters, the literal
        values and the effects of ``e``; literals at ``positions`` as `loose_key` reads them."""
        literals = tuple(
            _literal(v) for j, v in enumerate(e.invars) if _is_lit(v) and j not in positions
        )
        params = tuple(sorted((k, self.freeze(x)) for k, x in e.params.items()))
        effects = (id(e),) if e.effects else ()  # effectful equations never repeat
        return (*(loose or self.loose_key(e, positions)), params, literals, effects)

    def carry_key(self, e, positions: frozenset) -> tuple:
        """The strict key of ``e`` with its literal inputs at ``positions`` read as variables
        of their type: the first layer of a run that starts a carried value from a constant
        (``aux = 0.0``, then ``aux = aux + ...`` in every layer), where the later layers
        read the previous layer's variable."""
        return self.strict_key(e, positions=positions)

    @staticmethod
    def loose_key(e, positions: frozenset = frozenset()) -> tuple:
        """Primitive, input and output types of ``e``; a literal input is marked as one,
        except at ``positions``, where it reads as a variable of its (strong) type."""
        ins = tuple(
            _aval(v.aval.update(weak_type=False))
            if j in positions
            else ("lit", _aval(v.aval))
            if _is_lit(v)
            else _aval(v.aval)
            for j, v in enumerate(e.invars)
        )
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
