"""`remat.apply` with a plan: ``remat.apply(loss_fn, plan)`` applies a `remat.Plan` (or a
plan file) to the loss inside the user's own training step.

Flax and optax training loops define the loss inside a jitted ``train_step``, closing over
the batch and the dropout key, so the function a plan is applied to is a new closure at
every call, with fewer arguments than the one that was planned. A plan is therefore checked
by its scans (`Plan.scan_fingerprint`): a scan's body takes what it closes over as inputs,
so the scans of the closure are those of the planned loss. A different program is refused
with both fingerprints; the same model at other shapes (another batch size) is refused with
a message saying so.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax

from .._core._errors import brief, renamed
from .._trace._apply import apply as apply_strategy
from .._trace._roll_rewrite import roll_unscanned
from .._trace._tag import planned_scans, rewrite
from ._json import other_jax, read_plan, scan_choices
from ._result import Plan, fingerprint, scan_fingerprints

_OTHER_PROGRAM = (
    "`remat.apply` got a plan for another program: the plan's scans have fingerprint {saved}, "
    "the scans of {name} at these arguments have {now} ({count}). The model, its dtypes or its "
    "structure changed; plan this program with `remat.plan(loss, *args, budget=...)`."
)
_OTHER_SHAPES = (
    "`remat.apply` got a plan that was planned for other shapes: the plan's scans have "
    "fingerprint {saved}, the scans of {name} at these arguments have {now}; the model is the "
    "same (structure {structure}) but its shapes differ (another batch size or sequence "
    "length?). A plan is chosen and measured at its shapes; plan again at these: "
    "`remat.plan(loss, *args, budget=...)`."
)
_IN_SHARD_MAP = (
    " Inside `shard_map` (manual axes {axes}) the loss sees one device's shard of each "
    "argument, and with shard_map's replication checks (`check_vma=True`, its default) its "
    "program has `pvary` equations that a plan made outside lacks: plan the loss with "
    "arguments of the per-device shapes and pass `check_vma=False` to `jax.shard_map`."
)
_NOT_CALLABLE = "`remat.apply` got fn={got}, which is not callable; pass the loss."
_PLAN_OVERRIDE = (
    "`remat.apply` got a plan and override=True: a plan decides what every scan it plans "
    "saves, replacing the program's own checkpoints there already; drop `override`."
)


def is_plan(strategy: Any) -> bool:
    """Whether ``strategy`` is a `remat.Plan` or a plan file's path (``*.json`` or a path)."""
    if isinstance(strategy, Plan | os.PathLike):
        return True
    return isinstance(strategy, str) and (strategy.endswith(".json") or os.path.exists(strategy))


def apply(
    fn: Callable[..., Any] | None = None,
    strategy: Any = None,
    *,
    has_aux: bool = False,
    roll: bool = True,
    override: bool = False,
) -> Callable[..., Any]:
    """`remat._trace._apply.apply`, which also takes a `remat.Plan` or a plan file as the
    strategy (see `apply_plan`); its docstring is this function's."""
    if is_plan(strategy) and override:
        raise ValueError(_PLAN_OVERRIDE)
    if fn is None:
        if is_plan(strategy):
            return functools.partial(apply, strategy=strategy)
        return apply_strategy(None, strategy, has_aux=has_aux, roll=roll, override=override)
    if is_plan(strategy):
        return apply_plan(fn, strategy)
    return apply_strategy(fn, strategy, has_aux=has_aux, roll=roll, override=override)


apply.__doc__ = apply_strategy.__doc__


def apply_plan(fn: Callable[..., Any], plan: Plan | str | os.PathLike) -> Callable[..., Any]:
    """``fn`` checkpointed as ``plan`` says, checked against the plan when it is traced.

    Args:
      fn: the loss, e.g. a closure made inside a jitted ``train_step``.
      plan: a `remat.Plan`, or the path of a file `Plan.to_json` wrote.

    Returns:
      ``fn`` with its planned scans rewritten: the same values and gradients.

    Raises:
      ValueError: (when called) if ``fn``'s scans at these arguments are not those the plan
        was made for: another program, or the same at other shapes (each says which).
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    if not isinstance(plan, Plan):
        try:
            plan = read_plan(plan)
        except ValueError as err:
            raise renamed(err, "`remat.load_plan`", "`remat.apply`")  # noqa: B904 (`renamed` chains)
    if not plan.scans:  # the program fits as written: nothing to apply
        return fn
    target = roll_unscanned(fn) if plan.rolled else fn
    rewritten = rewrite(target, scan_choices(plan))
    name = f"`{getattr(fn, '__qualname__', repr(fn))}`"

    @functools.wraps(fn)
    def planned(*args: Any, **kwargs: Any) -> Any:
        check_program(plan, target, args, kwargs, name)
        return rewritten(*args, **kwargs)

    return planned


def check_program(plan: Plan, fn: Callable[..., Any], args, kwargs, name: str) -> None:
    """Raises ValueError unless ``fn`` at these arguments has the scans ``plan`` is for."""
    if not plan.scan_fingerprint:  # a plan written before scans were fingerprinted
        now = fingerprint(lambda *a: fn(*a, **kwargs), *args)
        if now != plan.fingerprint:
            other = other_jax(plan, "`remat.apply`", f"for {name}", plan.fingerprint, now)
            if other:
                raise ValueError(other)
            raise ValueError(
                _OTHER_PROGRAM.format(
                    saved=plan.fingerprint, now=now, name=name, count="the whole program's"
                )
            )
        return
    scans = planned_scans(fn, *args, **kwargs)
    exact, structure = scan_fingerprints(scans)
    if exact == plan.scan_fingerprint:
        return
    other = other_jax(plan, "`remat.apply`", f"for {name}", plan.scan_fingerprint, exact)
    if other:
        raise ValueError(other)
    if structure == plan.scan_structure:
        raise ValueError(
            _OTHER_SHAPES.format(
                saved=plan.scan_fingerprint, now=exact, name=name, structure=structure
            )
            + _in_shard_map()
        )
    count = f"{len(scans)} scan{'' if len(scans) == 1 else 's'}; the plan is for {len(plan.scans)}"
    raise ValueError(
        _OTHER_PROGRAM.format(saved=plan.scan_fingerprint, now=exact, name=name, count=count)
        + _in_shard_map()
    )


def _in_shard_map() -> str:
    """`_IN_SHARD_MAP` where the loss is traced inside `jax.shard_map`, else nothing."""
    manual = jax.sharding.get_abstract_mesh().manual_axes
    return _IN_SHARD_MAP.format(axes=", ".join(manual)) if manual else ""
