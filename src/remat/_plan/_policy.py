"""`Plan.policy`: a `jax.checkpoint` policy that saves what a plan saves, for the user's own
scan (``jax.checkpoint(body, policy=plan.policy)``, ``nn.remat``, ``nnx.remat``).

The planner names the values of a scan body by position (``remat_s0_e14``, see
`remat._trace._tag`), names the user's code never contains. So the policy matches a saved
value in one of two ways:

- **by name**: a value the program names with `jax.ad_checkpoint.checkpoint_name` is matched
  by the program's own name (``"h1"``); the planner's name is matched too, for a
  ``checkpoint_name`` the user adds where `Plan.explain` says to;
- **by operation**: any other saved value is matched by its primitive and its operands'
  types (``dot_general`` of ``float32[1024, 128]`` and ``float32[128, 512]``). This is exact
  when the body has one equation of that kind, and saves more than the plan otherwise (every
  equation with that primitive and those operand types is saved). Adding the names
  `Plan.explain` suggests, and using ``save_only_these_names`` with them, makes it exact.

Scans the plan runs with a `remat.Nested` or `remat.Binomial` schedule are not described by
a policy (the schedule is the loop, not what a step saves); their values are left out, and
`Plan.explain` says to run such a scan with `remat.scan(..., schedule=...)`. A per-layer plan
(different save sets in different layers of one scan) is not one policy either: `Plan.policy`
raises, and `Plan.position_policy(k)` is the policy of layer ``k`` (of the ``k``-th layer of
each group, for a pattern shorter than the scan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._costmodel import operand_text


@dataclasses.dataclass(frozen=True)
class PlanPolicy:
    """A `jax.checkpoint` policy saving a plan's values (see the module docstring).

    Attributes:
      names: `checkpoint_name` names whose values are saved.
      operations: ``(primitive, operand types)`` whose outputs are saved.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._plan._policy import PlanPolicy
      >>> policy = PlanPolicy(names=frozenset(), operations=frozenset(
      ...     {("dot_general", ("float32[4, 8]", "float32[8, 8]"))}))
      >>> from jax._src.ad_checkpoint import saved_residuals
      >>> f = jax.checkpoint(lambda x, w: jnp.sin(x @ w).sum(), policy=policy)
      >>> [r.shape for r, _ in saved_residuals(f, jnp.ones((4, 8)), jnp.ones((8, 8)))]
      [(4, 8), (8, 8), (4, 8)]
    """

    names: frozenset[str]
    operations: frozenset[tuple[str, tuple[str, ...]]]

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        if prim.name == "name":
            return params.get("name") in self.names
        if not self.operations:
            return False
        return (prim.name, tuple(operand_text(a) for a in avals)) in self.operations


_PER_LAYER = (
    "`Plan.policy` cannot express this plan as one `jax.checkpoint` policy: {scans} a "
    "different set in different layers ({lines}), and a policy saves the same values at every "
    "step. Apply the plan to your own step with `remat.apply(loss_fn, plan)`; or {how}."
)


def how_to_run(scans: Any) -> str:
    """How to run a per-layer plan's scans by hand: a scan per run of layers saving the same
    set (a pattern as long as the scan), or over groups of ``g`` layers (a period ``g``)."""
    patterned = [s for s in scans if getattr(s, "pattern", ())]
    if all(len(s.pattern) == s.length for s in patterned):
        from .._trace._periodic import runs

        spans = "; ".join(
            ", ".join(f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in runs(s.pattern))
            for s in patterned
        )
        return (
            f"run each run of layers saving the same set ({spans}) as a scan of its own over "
            "its layers' indices (index the stacked parameters inside the layer), and "
            "checkpoint layer k with "
            "`jax.checkpoint(layer, policy=plan.position_policy(k), prevent_cse=False)`"
        )
    g = len(patterned[0].pattern)
    return (
        f"run your scan over groups of {g} layers and checkpoint the k-th layer of each group "
        "with `jax.checkpoint(layer, policy=plan.position_policy(k), prevent_cse=False)`"
    )


def plan_policy(scans: Any, position: int | None = None) -> PlanPolicy:
    """The policy saving what the ``per_step`` scans of a plan save; in a per-layer scan,
    what its layers at ``position`` (modulo the period) save.

    Raises:
      ValueError: for a per-layer plan without ``position``.
    """
    patterned = [s for s in scans if getattr(s, "pattern", ())]
    if patterned and position is None:
        from ._perlayer import describe

        lines = "; ".join(
            line for s in patterned for line in describe(s.pattern, s.length, saved_label(s))
        )
        where = ", ".join(str(s.position) for s in patterned)
        raise ValueError(
            _PER_LAYER.format(scans=f"scan(s) {where} save", lines=lines, how=how_to_run(scans))
        )
    names: set[str] = set()
    operations: set[tuple[str, tuple[str, ...]]] = set()
    for scan in scans:
        if scan.schedule != "per_step":
            continue
        pattern = getattr(scan, "pattern", ())
        kept = set(pattern[position % len(pattern)]) if pattern else None
        for v in scan.saved:
            if v.primitive == "carry" or (kept is not None and v.name not in kept):
                continue  # a scan's carries are its inputs: always there
            names.add(v.name)
            if v.user_name is not None:
                names.add(v.user_name)
            elif v.operands:
                operations.add((v.primitive, tuple(v.operands)))
    return PlanPolicy(frozenset(names), frozenset(operations))


def saved_label(scan: Any) -> Callable[[str], str]:
    """A saved value's name as the user wrote it (its `checkpoint_name`), else the planner's."""
    label = {v.name: v.user_name or v.name for v in scan.saved}
    return lambda name: label.get(name, name)


def unnamed(scans: Any) -> list[tuple[int, Any]]:
    """``(scan position, saved value)`` for each value the policy matches by operation."""
    return [
        (scan.position, v)
        for scan in scans
        if scan.schedule == "per_step"
        for v in scan.saved
        if v.primitive != "carry" and v.user_name is None
    ]
