"""Per-layer constants inside checkpointed layers, made inputs: `lift_layer_constants`.

A linen layer under ``nn.remat`` that draws dropout folds a per-layer constant (a hash of
the module's path) into its key inside the checkpoint, so each layer's checkpoint equation
differs from the next by one literal::

    remat2[jaxpr={ ... random_fold_in key 774880343:u32[] ... }]
    remat2[jaxpr={ ... random_fold_in key 930780530:u32[] ... }]

and `_roll_detect` finds no run. `lift_layer_constants` makes every literal that a
top-level checkpoint's sub-program folds into a key an input of that sub-program, made by a
``convert_element_type`` of the literal just before the checkpoint. That equation reads a
literal only, so the roll hoists it (evaluated for every layer before the scan, its values
stacked: `_roll_dataflow`), and the checkpoints of all layers are the same equation. The
program computes what it computed before: the same key is folded with the same constant.
"""

from __future__ import annotations

from jax import lax
from jax.extend import core as jcore

from ._roll_detect import Run, find_runs
from ._roll_tokens import _is_lit

_FOLD = "random_fold_in"


def _folds_literal(eqn) -> bool:
    return eqn.primitive.name == _FOLD and any(_is_lit(v) for v in eqn.invars)


def _lifts(eqn) -> bool:
    sub = eqn.params.get("jaxpr") if eqn.primitive is jcore.primitives.remat_p else None
    return sub is not None and any(_folds_literal(e) for e in sub.eqns)


def _value(v) -> object:
    val = v.val
    return val.item() if hasattr(val, "item") else val


def lifted_runs(closed_jaxpr: jcore.ClosedJaxpr) -> tuple[jcore.ClosedJaxpr, list[Run]]:
    """The program with its per-layer constants lifted (`lift_layer_constants`) and the runs
    of repeated layers found in it (`find_runs`): rolling reads both from the lifted program.

    Example:
      >>> import jax
      >>> from remat._trace._roll_lift import lifted_runs
      >>> def f(key):
      ...     for i in range(3):
      ...         key = jax.checkpoint(lambda k: jax.random.fold_in(k, 7 + i))(key)
      ...     return key
      >>> closed, runs = lifted_runs(jax.make_jaxpr(f)(jax.random.key(0)))
      >>> [(r.length, r.start) for r in runs]
      [(3, 0)]
    """
    closed_jaxpr = lift_layer_constants(closed_jaxpr)
    return closed_jaxpr, find_runs(closed_jaxpr)


def lift_layer_constants(closed_jaxpr: jcore.ClosedJaxpr) -> jcore.ClosedJaxpr:
    """The program with the literals its top-level checkpoints fold into keys made inputs.

    Args:
      closed_jaxpr: the program, e.g. from `jax.make_jaxpr`.

    Returns:
      ``closed_jaxpr`` itself when no two checkpoints fold different literals into keys (a
      program that rolled before is left exactly as it was); else an equal program in which
      each such literal is an input of its checkpoint, made by a ``convert_element_type``
      equation just before it.

    Example:
      >>> import jax
      >>> from remat._trace._roll_lift import lift_layer_constants
      >>> def f(key):
      ...     for i in range(2):
      ...         key = jax.checkpoint(lambda k: jax.random.fold_in(k, 7 + i))(key)
      ...     return key
      >>> closed = lift_layer_constants(jax.make_jaxpr(f)(jax.random.key(0)))
      >>> [e.primitive.name for e in closed.eqns]
      ['convert_element_type', 'remat2', 'convert_element_type', 'remat2']
    """
    jaxpr = closed_jaxpr.jaxpr
    folded = {
        (str(v.aval), _value(v))
        for e in jaxpr.eqns if _lifts(e)
        for s in e.params["jaxpr"].eqns if _folds_literal(s)
        for v in s.invars if _is_lit(v)
    }  # fmt: skip
    if len(folded) < 2:  # the same constant everywhere: the checkpoints compare equal as they are
        return closed_jaxpr
    eqns = []
    for e in jaxpr.eqns:
        if not _lifts(e):
            eqns.append(e)
            continue
        sub = e.params["jaxpr"]
        inner, outer, sub_eqns = [], [], []
        for s in sub.eqns:
            if _folds_literal(s):
                ins = []
                for v in s.invars:
                    if _is_lit(v):
                        made, taken = jcore.Var(v.aval), jcore.Var(v.aval)
                        params = dict(new_dtype=v.aval.dtype, weak_type=v.aval.weak_type,
                                      sharding=None)  # fmt: skip
                        eqns.append(jcore.new_jaxpr_eqn([v], [made], lax.convert_element_type_p,
                                                        params, set(), e.source_info))  # fmt: skip
                        outer.append(made)
                        inner.append(taken)
                        v = taken
                    ins.append(v)
                s = s.replace(invars=ins)
            sub_eqns.append(s)
        info = sub.debug_info
        if info is not None and info.arg_names is not None:
            names = (*info.arg_names, *(f"layer_constant_{i}" for i in range(len(inner))))
            info = info._replace(arg_names=names)
        sub = sub.replace(invars=[*sub.invars, *inner], eqns=sub_eqns, debug_info=info)
        eqns.append(e.replace(invars=[*e.invars, *outer], params=dict(e.params, jaxpr=sub)))
    return jcore.ClosedJaxpr(jaxpr.replace(eqns=eqns), closed_jaxpr.consts)
