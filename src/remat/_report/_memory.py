"""`remat.memory`: the compiled step's memory along XLA's schedule, and what fills its peak.

The step is the one `remat.measure` compiles (`remat._measure._step.lower_step`), compiled
once with XLA's dump written to a temporary folder, and read by
`remat._measure._memory.read_memory`. Lives in the report stage because it takes a
`remat.Plan` as well as a strategy (`remat._plan._apply.apply`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._errors import brief
from .._measure._measure import _check_args, _check_scalar
from .._measure._memory import (
    GRADIENT,
    INPUT,
    OPTIMIZER,
    OUTPUT,
    PARAMETER,
    MemoryView,
    read_memory,
)
from .._measure._peak import compiled_memory
from .._measure._residuals import saved_residuals
from .._measure._step import ANALYSIS_OPTIONS, Step, as_step, loss_of, lower_step
from .._measure._xla_dump import compile_with_dump
from .._shard._sharding import num_devices

_TAG = re.compile(r"^remat_s\d+_e\d+(_\d+)?$")
_NOT_CALLABLE = "`remat.memory` got fn={got}, which is not callable; pass the loss function."
_BOTH = (
    "`remat.memory` got strategy={strategy!r} and a plan; pass one of them: the strategy "
    "to compile, or the plan (a `remat.Plan` or its JSON file)."
)


def _inputs(lowered: Any, step: Step) -> dict[int, tuple[str, str]]:
    """``entry parameter number -> (kind, label)`` of the lowered step's arguments."""
    leaves = jax.tree_util.tree_flatten_with_path(lowered.args_info[0])[0]
    kept = lowered._lowering.compile_args.get("kept_var_idx")
    kept = sorted(kept) if kept is not None else range(len(leaves))
    argnums = (step.argnums,) if isinstance(step.argnums, int) else tuple(step.argnums)
    inputs = {}
    for number, index in enumerate(kept):
        path = leaves[index][0]
        position = path[0].idx
        rest = jax.tree_util.keystr(path[1:])
        if step.optimizer is None:
            kind = PARAMETER if position in argnums else INPUT
            label = f"args[{position}]{rest}"
        elif position == 0:
            kind, label = PARAMETER, f"args[{step.argnums}]{rest}"
        elif position == 1:
            kind, label = OPTIMIZER, f"opt_state{rest}"
        else:
            original = position - 2 + (position - 2 >= step.argnums)
            kind, label = INPUT, f"args[{original}]{rest}"
        inputs[number] = (kind, label)
    return inputs


def _outputs(lowered: Any, step: Step) -> dict[int, tuple[str, str]]:
    """``flat output index -> (kind, label)`` of the lowered step's outputs."""
    leaves = jax.tree_util.tree_flatten_with_path(lowered.out_info)[0]
    outputs = {}
    for index, (path, _) in enumerate(leaves):
        position, rest = path[0].idx, jax.tree_util.keystr(path[1:])
        if step.optimizer is None:
            outputs[index] = (OUTPUT, f"loss{rest}") if position == 0 else (GRADIENT, f"grad{rest}")
        elif position == 0:
            outputs[index] = (PARAMETER, f"new params{rest}")
        elif position == 1:
            outputs[index] = (OPTIMIZER, f"new opt_state{rest}")
        else:
            outputs[index] = (OUTPUT, f"loss{rest}")
    return outputs


def _user_names(residuals: Sequence[Any], plan: Any) -> list[Any]:
    """The residuals with the planner's value tags (``remat_s0_e3``) replaced by the
    program's own `checkpoint_name` for the value, or by nothing (the primitive names it)."""
    renames: dict[str, str | None] = {}
    if plan is not None:
        from .._plan._json import read_plan
        from .._plan._result import Plan

        plan = plan if isinstance(plan, Plan) else read_plan(plan)
        renames = {v.name: v.user_name for scan in plan.scans for v in scan.saved}
    return [
        dataclasses.replace(r, name=renames.get(r.name)) if r.name and _TAG.match(r.name) else r
        for r in residuals
    ]


def memory(
    fn: Callable[..., Any],
    *args: Any,
    strategy: Any = None,
    plan: Any = None,
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
    override: bool = False,
    label: str | None = None,
) -> MemoryView:
    """Where the compiled step's memory goes: live bytes along XLA's schedule, and what is
    live at the peak, read from XLA's buffer assignment before anything runs.

    The step is the one `remat.measure` compiles (``jax.value_and_grad(fn, argnums)``, or
    the whole training step with ``optimizer=``), compiled once. Each buffer live at the peak
    has its bytes, shape, dtype, kind (parameter, optimizer state, input, gradient, output,
    saved for the backward pass, recomputation, temporary), and where it came from: an
    argument's path, or for a saved value its `checkpoint_name` or primitive, the named scope
    of the scan that saved it and how many steps it stacks. Figures are per device for a
    sharded step.

    Args:
      fn: the loss, as for `remat.measure`.
      *args: its arguments: arrays or `jax.ShapeDtypeStruct` s (nothing is run).
      strategy: compile ``remat.apply(fn, strategy)`` instead of ``fn``.
      plan: a `remat.Plan` or its JSON file: compile ``remat.apply(fn, plan)``.
      argnums, has_aux, optimizer, roll, override: as for `remat.measure`.
      label: the view's label (default: ``"as written"``, the strategy's name or ``"plan"``).

    Returns:
      A `remat.MemoryView`.

    Raises:
      TypeError, ValueError: as `remat.measure` does for bad arguments; ValueError when both
        ``strategy`` and ``plan`` are given.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
      ...     return x.sum()
      >>> view = remat.memory(loss, jnp.ones((4, 16, 16)), jnp.ones((8, 16)))
      >>> [(v.kind, v.shape, v.steps) for v in view.live_at_peak][:3]
      [('parameter', (4, 16, 16), 1), ('gradient', (4, 16, 16), 1), ('saved', (4, 8, 16), 4)]
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    if strategy is not None and plan is not None:
        raise ValueError(_BOTH.format(strategy=strategy))
    argnums_t = _check_args(args, argnums, 0, where="remat.memory")
    argnums = argnums if isinstance(argnums, int) else argnums_t
    spec = as_step(Step(argnums, bool(has_aux), optimizer), "remat.memory")
    chosen = plan if plan is not None else strategy
    plan_given = False
    if chosen is None:
        target, default_label = fn, "as written"
    else:
        from .._core._strategy import as_strategy
        from .._plan._apply import apply, is_plan

        plan_given = is_plan(chosen)
        default_label = "plan" if plan_given else as_strategy(chosen, "remat.memory").name
        target = apply(fn, chosen, has_aux=has_aux, roll=roll, override=override)
    _check_scalar(target, args, spec.has_aux, where="remat.memory")
    lowered = lower_step(target, args, spec)
    compiled, dump = compile_with_dump(lowered, ANALYSIS_OPTIONS)  # read, never run
    residuals = _user_names(
        saved_residuals(loss_of(target, spec), *args, argnums=argnums),
        chosen if plan_given else None,
    )
    return read_memory(
        dump,
        compiled_memory(compiled).peak_bytes,
        inputs=_inputs(lowered, spec),
        outputs=_outputs(lowered, spec),
        residuals=residuals,
        label=label or default_label,
        num_devices=num_devices(compiled),
    )
