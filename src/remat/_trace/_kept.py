"""Re-running a scan body with the chosen values named and the rest of its jitted calls whole.

The planner names a scan body's values on its flattened form (`remat._trace._tag.flatten`:
every call to a `jax.jit`-ed function inlined, so that each value inside one can be saved).
Re-running that flattened form inlines every call, also those none of whose values is saved,
and XLA packs the resulting program's temporaries differently from the program as written
(Llama-3-8B shapes, MaxText's ``minimal`` save set: 53,952,448 bytes more peak with
``jnp.tril``, ``jnp.where`` and ``nn.silu`` inlined than with them kept as calls; see
`benchmarks/preset_gap.py`), and the other way at Llama-3.2-1B shapes (the 50% plan's save
set: 7.6% more with ``jnp.where`` kept). So this form is chosen by `ScanChoice.kept_calls`,
where the planner compiles it beside the inlined one (`remat._plan._calls`).

`eval_kept` evaluates the body as written instead, and inlines a call only where a chosen
name falls inside it: every other call is bound whole, as the program binds it. The values
outside kept calls are tagged with the same names as on the flattened form
(`remat._trace._tag.value_name`, by their index there), so any save set means the same
values. The flattened form's equations are matched one for one against the walk of the body
(`flat_ranges`); where they differ (tracing dropped or added an equation), the flattened form
is evaluated as before, with every call inlined.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from jax.ad_checkpoint import checkpoint_name

from ._rewrite import ScanInfo
from ._tag import _INLINE, _bind, _inlined, _read, eval_tagged, flatten, is_tagged, value_name

_NAME = re.compile(r"remat_s(\d+)_e(\d+)(?:_\d+)?")


def _inner(eqn: Any) -> Any:
    """The body of an equation `_tag._eval_inlined` inlines (a closed or open jaxpr), or None."""
    key = _INLINE.get(eqn.primitive.name)
    if key is None or key not in eqn.params or (key == "jaxpr" and not _inlined(eqn)):
        return None
    return eqn.params[key]


def _open(inner: Any) -> tuple[Any, Sequence[Any]]:
    consts = inner.consts if hasattr(inner, "consts") else ()
    return (inner.jaxpr if hasattr(inner, "jaxpr") else inner), consts


def flat_ranges(closed: Any, flat: Any) -> dict[int, tuple[int, int]] | None:
    """Per call equation the walk inlines (keyed by ``id``), the range ``[start, stop)`` of
    its equations in ``flat``; None where the walk does not match ``flat`` one for one (the
    same primitive and output types at every index)."""
    ranges: dict[int, tuple[int, int]] = {}
    flat_eqns = flat.jaxpr.eqns
    j = 0

    def walk(jaxpr: Any) -> bool:
        nonlocal j
        for eqn in jaxpr.eqns:
            inner = _inner(eqn)
            if inner is not None:
                start = j
                if not walk(_open(inner)[0]):
                    return False
                ranges[id(eqn)] = (start, j)
                continue
            if j >= len(flat_eqns) or not _same(eqn, flat_eqns[j]):
                return False
            j += 1
        return True

    return ranges if walk(closed.jaxpr) and j == len(flat_eqns) else None


def _same(a: Any, b: Any) -> bool:
    return a.primitive == b.primitive and [v.aval for v in a.outvars] == [v.aval for v in b.outvars]


def chosen_equations(scan: int, names: Iterable[str]) -> set[int] | None:
    """The indices (in the flattened body of scan ``scan``) of the equations whose outputs
    ``names`` name; None if a name is not one of the planner's (`_tag.value_name`)."""
    out = set()
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or int(m.group(1)) != scan:
            return None
        out.add(int(m.group(2)))
    return out


def eval_kept(
    closed: Any,
    ranges: dict,
    chosen: set[int],
    scan: int,
    args: Sequence[Any],
    keep: Collection[str] | None = None,
) -> list[Any]:
    """Evaluates the body ``closed`` as written, inlining only the calls that hold a
    ``chosen`` equation (``ranges``: `flat_ranges`) or whose name is not in ``keep`` (None:
    any name), and tagging every floating-point output outside the kept calls as
    `_tag.eval_tagged` tags the flattened body."""
    j = 0

    def run(jaxpr: Any, consts: Sequence[Any], invals: Sequence[Any]) -> list[Any]:
        nonlocal j
        env: dict = {}
        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, invals, strict=True))
        for eqn in jaxpr.eqns:
            ins = [_read(env, v) for v in eqn.invars]
            inner = _inner(eqn)
            if inner is not None:
                start, stop = ranges[id(eqn)]
                wanted = keep is None or eqn.params.get("name") in keep
                if wanted and chosen.isdisjoint(range(start, stop)):
                    outs, j = _bind(eqn, ins), stop  # kept whole
                else:
                    outs = run(*_open(inner), ins)
            else:
                outs = _bind(eqn, ins)
                n = len(eqn.outvars)
                outs = [
                    checkpoint_name(o, value_name(scan, j, k, n)) if is_tagged(v.aval) else o
                    for k, (v, o) in enumerate(zip(eqn.outvars, outs, strict=True))
                ]
                j += 1
            env.update(zip(eqn.outvars, outs, strict=True))
        return [_read(env, v) for v in jaxpr.outvars]

    return run(closed.jaxpr, closed.consts, args)


def tagged_body(
    info: ScanInfo, names: Iterable[str], keep: Collection[str] | None = None
) -> Callable[..., Any]:
    """``body(consts, carry, xs) -> (carry, ys)``: the body of the scan at ``info`` with its
    values tagged as the planner names them, and its jitted calls that hold none of ``names``
    (and, with ``keep``, are named in it) kept whole (see the module docstring); checkpoint
    it with a policy over ``names``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._tag import planned_scans
      >>> def f(w, x):
      ...     step = lambda c, w: (jax.jit(jnp.sin)(c @ w), None)
      ...     return jax.lax.scan(step, x, w)[0].sum()
      >>> info = planned_scans(f, jnp.ones((2, 3, 3)), jnp.ones(3))[0]
      >>> body = tagged_body(info, ["remat_s0_e0"])  # the matmul saved, the sine kept whole
      >>> [e.primitive.name for e in jax.make_jaxpr(body)([], [jnp.ones(3)], [jnp.ones((3, 3))]).eqns]
      ['dot_general', 'name', 'jit']
    """
    flat = flatten(info.jaxpr)
    ranges = flat_ranges(info.jaxpr, flat)
    chosen = chosen_equations(info.position, names)
    nk = info.num_carry

    def tagged(consts, carry, xs):
        args = [*consts, *carry, *xs]
        if ranges is None or chosen is None:
            outs = eval_tagged(flat, info.position, args)
        else:
            outs = eval_kept(info.jaxpr, ranges, chosen, info.position, args, keep)
        return list(outs[:nk]), list(outs[nk:])

    return tagged


def keeps_a_call(info: ScanInfo, names: Iterable[str]) -> bool:
    """Whether `tagged_body` keeps a jitted call of the scan at ``info`` whole for ``names``
    (it holds none of them), so that the body differs from the flattened one."""
    ranges = flat_ranges(info.jaxpr, flatten(info.jaxpr))
    chosen = chosen_equations(info.position, names)
    if not ranges or chosen is None:
        return False
    return any(chosen.isdisjoint(range(start, stop)) for start, stop in ranges.values())
