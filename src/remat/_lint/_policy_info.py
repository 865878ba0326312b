"""What a checkpoint policy does with named values, read from the policy object itself.

`jax.checkpoint_policies` builds its name-based policies in two ways: frozen dataclasses
(`save_only_these_names`, `save_any_names_but_these`: the names are a field) and closures
(`save_and_offload_only_these_names`, `save_from_both_policies`: the names, or the combined
policies, live in the closure cells). User policies are usually closures or
`functools.partial` objects around these. `policy_info` collects every string that a policy
carries (dataclass fields, closure cells, partial arguments, code constants, recursively
through the policies it wraps) and keeps those the policy actually reacts to: a name counts
when the policy's answer for a `checkpoint_name` of that name differs from its answer for a
name it cannot know. So the result describes what the policy *does*, not what it is called.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np

from .._core._complex import RealSaves

# The `name` primitive that `checkpoint_name` binds, read from a trace (it is not public).
NAME_P = jax.make_jaxpr(lambda x: jax.ad_checkpoint.checkpoint_name(x, "n"))(1.0).eqns[0].primitive
_PROBE_AVAL = jax.core.ShapedArray((4,), jnp.float32)
_UNKNOWN_NAME = "\x00remat-lint-probe-name-no-program-uses\x00"
_MAX_DEPTH = 6

SAVE, OFFLOAD, RECOMPUTE = "save", "offload", "recompute"


def probe(policy: Callable[..., Any], name: str) -> str | None:
    """What ``policy`` decides for a `checkpoint_name` called ``name``; None if it raises."""
    try:
        out = policy(NAME_P, _PROBE_AVAL, name=name)
    except Exception:  # a user policy that cannot answer this question
        return None
    if isinstance(out, jax.ad_checkpoint.Offloadable):
        return OFFLOAD
    if out is jax.ad_checkpoint.Recompute:
        return RECOMPUTE
    if out is jax.ad_checkpoint.Saveable:
        return SAVE
    return SAVE if bool(out) else RECOMPUTE


def _jax_policy(policy: object, factory: str) -> bool:
    """Whether ``policy`` was made by the `jax.checkpoint_policies` factory ``factory``."""
    qualname = getattr(policy, "__qualname__", "")
    module = getattr(policy, "__module__", "") or ""
    return qualname.startswith(f"{factory}.<locals>.") and module.startswith("jax")


def is_save_anything_except(policy: object) -> bool:
    """Whether ``policy`` is (or wraps) one made by `save_anything_except_these_names`."""
    return any(_jax_policy(p, "save_anything_except_these_names") for p in components(policy))


# Checked once, at import, against the JAX that is installed: does
# `save_anything_except_these_names(n)` save a value named n? In JAX 0.10 it returns
# `lambda *_, **__: True` and so saves everything, whatever names it is given.
SAVE_ANYTHING_EXCEPT_IGNORES_NAMES: bool = (
    probe(jax.checkpoint_policies.save_anything_except_these_names("remat_probe"), "remat_probe")
    == SAVE
)


def is_dots_no_batch(policy: object) -> bool:
    """Whether ``policy`` keeps only dots without batch dimensions (saved or offloaded)."""
    dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return any(
        same_policy(p, dots) or _jax_policy(p, "offload_dot_with_no_batch_dims")
        for p in components(policy)
    )


def same_policy(a: object, b: object) -> bool:
    """``a is b or a == b``, False where comparing raises (policies are arbitrary objects)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _children(obj: object) -> Iterator[object]:
    """Objects a policy holds: dataclass fields, partial arguments, closure cells, globals."""
    if isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield getattr(obj, field.name, None)
        return
    func = getattr(obj, "__func__", obj)  # bound methods
    code = getattr(func, "__code__", None)
    if code is None:
        if callable(obj) and hasattr(obj, "__dict__"):  # callable class instances
            yield from vars(obj).values()
        return
    for cell in getattr(func, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    yield from _code_constants(code)
    module_globals = getattr(func, "__globals__", {})
    for name in code.co_names:  # policies a user policy calls by global name
        value = module_globals.get(name)
        if callable(value) and not isinstance(value, type | types.ModuleType):
            yield value


def _code_constants(code) -> Iterator[object]:
    for const in code.co_consts:
        if hasattr(const, "co_consts"):  # nested functions and comprehensions
            yield from _code_constants(const)
        else:
            yield const


def _walk(obj: object, depth: int = 0, seen: set[int] | None = None) -> Iterator[object]:
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(obj))
    yield obj
    if isinstance(obj, str | bytes | int | float | type(None) | np.ndarray | jax.Array):
        return
    if isinstance(obj, list | tuple | set | frozenset):
        for item in obj:
            yield from _walk(item, depth + 1, seen)
        return
    if isinstance(obj, dict):
        for item in obj.values():
            yield from _walk(item, depth + 1, seen)
        return
    for child in _children(obj):
        yield from _walk(child, depth + 1, seen)


def components(policy: object) -> list[Callable[..., Any]]:
    """``policy`` and every policy-like callable it wraps (depth first, no duplicates)."""
    return [
        p
        for p in _walk(policy)
        if p is policy or (_policy_shaped(p) and probe(p, _UNKNOWN_NAME) is not None)
    ]


def _policy_shaped(obj: object) -> bool:
    """Whether ``obj`` can be a policy: one of JAX's, or a callable taking ``**params``.

    Only such callables are ever called (probed), so a helper that a user policy happens to
    call (a logger, say) is never run with made-up arguments.
    """
    if not callable(obj) or isinstance(obj, type) or obj is NAME_P:
        return False
    if (getattr(type(obj), "__module__", "") or "").startswith("jax._src.ad_checkpoint"):
        return True  # the dataclass policies
    if isinstance(obj, functools.partial):
        return _policy_shaped(obj.func)
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    if code is None:
        call = inspect.getattr_static(type(obj), "__call__", None)
        code = getattr(call, "__code__", None)
    return code is not None and bool(code.co_flags & inspect.CO_VARKEYWORDS)


def candidate_names(policy: object) -> set[str]:
    """Every string a policy carries, anywhere in what it wraps."""
    return {s for s in _walk(policy) if isinstance(s, str) and s}


@dataclasses.dataclass(frozen=True)
class PolicyInfo:
    """The names a policy reacts to.

    Attributes:
      saved: names whose values it saves although it would not save an arbitrary name.
      offloaded: names whose values it offloads to host memory.
      recomputed: names whose values it recomputes although it saves an arbitrary name
        (an exclusion list, as in `save_any_names_but_these`).
      saved_and_offloaded: names that one part of the policy saves and another offloads
        (what is saved is not offloaded).
      save_anything_except: whether it is or wraps `save_anything_except_these_names`.
    """

    saved: frozenset[str] = frozenset()
    offloaded: frozenset[str] = frozenset()
    recomputed: frozenset[str] = frozenset()
    saved_and_offloaded: frozenset[str] = frozenset()
    save_anything_except: bool = False

    @property
    def names(self) -> frozenset[str]:
        """Every name the policy lists."""
        return self.saved | self.offloaded | self.recomputed | self.saved_and_offloaded


def _closure_sets(policy: object) -> tuple[set[str], set[str]]:
    """Save and offload name sets kept in a `save_and_offload_only_these_names` closure."""
    if not _jax_policy(policy, "save_and_offload_only_these_names"):
        return set(), set()
    cells = dict(
        zip(policy.__code__.co_freevars, (c.cell_contents for c in policy.__closure__), strict=True)
    )
    return set(cells.get("names_which_can_be_saved", ())), set(
        cells.get("names_which_can_be_offloaded", ())
    )


def policy_info(policy: object) -> PolicyInfo:
    """Reads which `checkpoint_name` names ``policy`` saves, offloads and excludes.

    Example:
      >>> import jax
      >>> from remat._lint._policy_info import policy_info
      >>> info = policy_info(jax.checkpoint_policies.save_only_these_names("a", "b"))
      >>> sorted(info.saved)
      ['a', 'b']
    """
    if policy is None or not callable(policy):
        return PolicyInfo()
    parts = components(policy)
    names = candidate_names(policy)
    default = probe(policy, _UNKNOWN_NAME)
    saved, offloaded, recomputed = set(), set(), set()
    for name in names:
        decision = probe(policy, name)
        if decision is None or decision == default:
            continue
        {SAVE: saved, OFFLOAD: offloaded, RECOMPUTE: recomputed}[decision].add(name)
    # A name is in both sets when one part saves it and another offloads it.
    by_part_saved, by_part_offloaded = set(), set()
    for part in parts:
        part_default = probe(part, _UNKNOWN_NAME)
        closure_saved, closure_offloaded = _closure_sets(part)
        by_part_saved |= closure_saved
        by_part_offloaded |= closure_offloaded
        for name in names:
            decision = probe(part, name)
            if decision != part_default and decision == SAVE:
                by_part_saved.add(name)
            elif decision != part_default and decision == OFFLOAD:
                by_part_offloaded.add(name)
    both = by_part_saved & by_part_offloaded
    return PolicyInfo(
        saved=frozenset(saved - both),
        offloaded=frozenset(offloaded - both),
        recomputed=frozenset(recomputed),
        saved_and_offloaded=frozenset(both),
        save_anything_except=is_save_anything_except(policy),
    )


def policy_label(policy: object) -> str:
    """A short readable name for a policy, e.g. ``"save_only_these_names('a')"``.

    Example:
      >>> import jax
      >>> from remat._lint._policy_info import policy_label
      >>> policy_label(jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
      'dots_with_no_batch_dims_saveable'
    """
    if policy is None:
        return "nothing_saveable (the default)"
    if isinstance(policy, RealSaves):
        return policy_label(policy.policy)
    for name, known in vars(jax.checkpoint_policies).items():
        if policy is known or (dataclasses.is_dataclass(known) and same_policy(policy, known)):
            return name
    for field, factory in (
        ("saveable_names", "save_only_these_names"),
        ("names", "save_any_names_but_these"),
    ):
        names = getattr(policy, field, None)
        if dataclasses.is_dataclass(policy) and isinstance(names, frozenset):
            return f"{factory}({', '.join(repr(n) for n in sorted(names))})"
    qualname = getattr(policy, "__qualname__", None)
    module = getattr(policy, "__module__", "") or ""
    if qualname and ".<locals>." in qualname and module.startswith("jax"):
        return qualname.split(".<locals>.")[0]
    return qualname or repr(policy)
