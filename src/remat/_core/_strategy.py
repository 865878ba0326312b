"""Strategies: which values of a scan body are saved, and how the scan is scheduled.

A strategy is given as a string (``"full"``, ``"dots"``, ``"names:a,b"``, ...), a
`jax.checkpoint_policies` policy, or a frozen `Strategy`. `as_strategy` turns any of these into
a `Strategy`; `resolve_policy` turns a strategy's policy into what `jax.checkpoint` takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from ._complex import RealSaves
from ._offload import offload_available as offload_available
from ._offload import offload_unavailable_reason
from ._schedule import Schedule, check_schedule

# Strategy strings and the `jax.checkpoint_policies` policy each one means; those that save
# values recompute complex ones, which `jax.checkpoint` cannot save (see `RealSaves`).
_NAMED_POLICIES: dict[str, Callable[..., Any] | None] = {
    "none": None,  # no checkpointing at all
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": RealSaves(jax.checkpoint_policies.dots_saveable),
    "dots_no_batch": RealSaves(jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    "everything": RealSaves(jax.checkpoint_policies.everything_saveable),
}
STRATEGY_NAMES = (*_NAMED_POLICIES, "names:<a,b,...>", "offload:<a,b,...>")
# The named strategies a plan can be made of (every scan or per scan), besides "names:a,b".
PLANNABLE_NAMES = ("full", "dots", "everything")

_UNKNOWN_STRATEGY = (
    "`{where}` got strategy {got}, which is not a known strategy. Valid strings are "
    "{names}; or pass a `jax.checkpoint_policies` policy, a policy callable, or "
    "`remat.Strategy(policy=...)`."
)
_PLAN_AS_STRATEGY = (
    "`{where}` got a `remat.Plan` as its strategy; a plan is not one `jax.checkpoint` policy "
    "(it may differ per scan and per layer). Pass the planned program instead: `plan.fn` (the "
    "function the plan was made for, rewritten), or `remat.apply(fn, plan)` for your own copy "
    "of that function, with no strategy."
)
_EMPTY_NAMES = (
    "`{where}` got strategy {got!r} with no names; write them after the colon, "
    "e.g. 'names:attn_out,mlp_hidden'."
)
_BAD_SCANS = (
    "`remat.Strategy` got scans={got!r}; expected None (all scans) or a tuple of scan "
    "positions (ints >= 0, in the order the scans appear) and scan names (str), e.g. "
    "scans=(0, 'decoder')."
)


def split_names(spec: str, where: str) -> tuple[str, ...]:
    """The names of a ``"names:a,b"`` or ``"offload:a,b"`` strategy; a ValueError naming
    ``where`` if there are none.

      >>> split_names("names: attn_out, mlp_hidden", "remat.plan")
      ('attn_out', 'mlp_hidden')
    """
    _, _, rest = spec.partition(":")
    names = tuple(n.strip() for n in rest.split(",") if n.strip())
    if not names:
        raise ValueError(_EMPTY_NAMES.format(where=where, got=spec))
    return names


def check_policy(policy: object, where: str) -> object:
    """Validates a strategy's policy (string or callable) and returns it unchanged."""
    if policy is None or callable(policy):
        return policy
    if isinstance(policy, str):
        if policy in _NAMED_POLICIES:
            return policy
        if policy.startswith(("names:", "offload:")):
            split_names(policy, where)
            return policy
    if getattr(type(policy), "__remat_plan__", False):
        raise ValueError(_PLAN_AS_STRATEGY.format(where=where))
    got = repr(policy)
    got = got if len(got) <= 200 else f"{got[:200]}... ({type(policy).__name__})"
    raise ValueError(_UNKNOWN_STRATEGY.format(where=where, got=got, names=STRATEGY_NAMES))


@dataclasses.dataclass(frozen=True)
class Strategy:
    """What to save in each scan body, which scans to touch, and how to schedule them.

    Args:
      policy: a strategy string (``"none"``, ``"full"``, ``"dots"``, ``"dots_no_batch"``,
        ``"everything"``, ``"names:a,b"``, ``"offload:a,b"``), a `jax.checkpoint_policies`
        policy, or any callable policy. ``"none"`` means no checkpointing; ``None`` is
        read as ``"full"`` (recompute everything), as `jax.checkpoint` reads ``policy=None``.
      scans: which scans to rewrite: ``None`` for all, or a tuple of positions (ints, in
        the order the scans appear in the traced program, depth first) and/or scan names
        (strings; the name of a `jax.named_scope`/`jax.named_call` around the scan).
      schedule: ``"per_step"`` (default), ``"none"``, `remat.Nested` or `remat.Binomial`.

    Example:
      >>> import remat
      >>> remat.Strategy("dots")
      Strategy(policy='dots', scans=None, schedule='per_step')
      >>> remat.Strategy("full", schedule=remat.Binomial(4))
      Strategy(policy='full', scans=None, schedule=Binomial(snapshots=4))
    """

    policy: Any = "full"
    scans: tuple[int | str, ...] | None = None
    schedule: Schedule = "per_step"

    def __post_init__(self):
        check_policy(self.policy, "remat.Strategy")
        check_schedule(self.schedule, "remat.Strategy")
        if self.scans is not None:
            scans = self.scans
            if isinstance(scans, int | str):
                scans = (scans,)
            elif isinstance(scans, tuple | list | set | frozenset | range):
                scans = tuple(scans)
            if not isinstance(scans, tuple) or any(
                isinstance(s, bool)
                or not isinstance(s, int | str)
                or (isinstance(s, int) and s < 0)
                for s in scans
            ):
                raise ValueError(_BAD_SCANS.format(got=self.scans))
            object.__setattr__(self, "scans", scans)

    @property
    def name(self) -> str:
        """A short human-readable label, used in reports."""
        policy = self.policy
        label = policy if isinstance(policy, str) else getattr(policy, "__name__", repr(policy))
        if self.schedule != "per_step":
            label = f"{label}+{_schedule_label(self.schedule)}"
        return label


def _schedule_label(schedule: Schedule) -> str:
    if isinstance(schedule, str):
        return schedule
    if hasattr(schedule, "snapshots"):
        return f"binomial({schedule.snapshots})"
    return f"nested({schedule.levels})"


def as_strategy(strategy: object, where: str = "remat.apply", device: Any = None) -> Strategy:
    """Turns a strategy string, policy or `Strategy` into a `Strategy`.

    Errors name ``where`` (the public function that was called), an ``"offload:a,b"``
    policy where ``device`` (default: the device compiled for, see
    `remat._core._offload.compile_device_now`) has no host memory to offload to included.
    """
    if strategy is None:
        return Strategy("full")
    if not isinstance(strategy, Strategy):
        check_policy(strategy, where)
        strategy = Strategy(strategy)
    if isinstance(strategy.policy, str) and strategy.policy.startswith("offload:"):
        resolve_policy(strategy.policy, where, device)  # raises where offloading is unavailable
    return strategy


def resolve_policy(
    policy: object, where: str = "remat.apply", device: Any = None
) -> Callable[..., Any] | None:
    """Returns the callable that `jax.checkpoint(policy=...)` takes for a strategy's policy.

    ``"none"`` returns None, meaning: do not checkpoint at all (callers must not wrap).
    ``None`` returns `nothing_saveable` (recompute everything), as in `jax.checkpoint`.
    ``"offload:a,b"`` is checked against ``device`` (default: the device compiled for, a
    `remat.Target`'s chip inside `measure`/`compare`/`lint`/`plan` given one, else this
    machine's): a TPU has host memory to offload to, a CPU host does not.

    Example:
      >>> import jax
      >>> from remat._core._strategy import resolve_policy
      >>> resolve_policy("full") is jax.checkpoint_policies.nothing_saveable
      True
    """
    check_policy(policy, where)
    if policy is None:
        return jax.checkpoint_policies.nothing_saveable
    if callable(policy):
        return policy
    if policy in _NAMED_POLICIES:
        return _NAMED_POLICIES[policy]
    names = split_names(policy, where)
    if policy.startswith("names:"):
        return jax.checkpoint_policies.save_only_these_names(*names)
    reason = offload_unavailable_reason(device)
    if reason is not None:
        raise ValueError(
            f"`{where}` got strategy {policy!r}, but there is no host memory to offload to "
            f"({reason}). Use 'names:{','.join(names)}' to save these values on the device "
            "instead, or compile for a TPU, which has host memory: pass target= (e.g. "
            "target='tpu:v5e:2x2') to `remat.measure`, `remat.compare`, `remat.lint` or "
            "`remat.plan`."
        )
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=list(names),
        offload_src="device",
        offload_dst="pinned_host",
    )
