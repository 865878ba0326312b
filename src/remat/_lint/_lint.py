"""`remat.lint`: find checkpointing mistakes in a traced program before they cost a day.

Most checkpointing bugs are silent: the program runs, the gradients are right, and memory
does not drop. `lint` traces the function, walks its jaxpr (through checkpoints, scans, jits
and conditionals), reads each checkpoint's policy (`remat._lint._policy_info`) and reports what it
finds as `remat.Finding` records. Codes and examples are in docs/lint.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax._src.ad_checkpoint import saved_residuals  # not re-exported by jax.ad_checkpoint
from jax.extend import core

from .._core._errors import brief
from .._core._offload import compiling_for
from .._shard._target import compile_device, parse_target
from .._trace import _jaxpr_walk as walk
from .._trace._eqx import with_modules_split
from ._findings import Finding
from ._policy_info import (
    NAME_P,
    OFFLOAD,
    SAVE_ANYTHING_EXCEPT_IGNORES_NAMES,
    is_dots_no_batch,
    policy_info,
    policy_label,
    probe,
    same_policy,
)

_NOT_CALLABLE = (
    "`remat.lint` got fn={got}, which is not callable. Pass the function to check "
    "(usually the loss), then its example arguments: `remat.lint(loss_fn, params, batch)`."
)
_BAD_ARG = (
    "`remat.lint` got a {kind} at {path} of its arguments; every leaf must be an array "
    "(jax.Array, numpy array, Python number or jax.ShapeDtypeStruct). Close over other "
    "values with functools.partial(fn, ...) before calling `remat.lint`."
)
_NOT_BOOL_MEASURE = (
    "`remat.lint` got measure={got!r}; pass True (also compile the gradient, for RM005 and "
    "RM009) or False (read the traced program only)."
)
_ARRAY_LEAVES = (jax.Array, jax.ShapeDtypeStruct, int, float, complex, bool)


def _check_args(fn: object, args: tuple) -> None:
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    leaves, _ = jax.tree_util.tree_flatten_with_path(args)
    for path, leaf in leaves:
        if isinstance(leaf, _ARRAY_LEAVES) or hasattr(leaf, "__array__"):
            continue
        where = f"args{jax.tree_util.keystr(path)}"
        raise TypeError(_BAD_ARG.format(kind=type(leaf).__name__, path=where))


def lint(
    fn: Callable[..., Any],
    *args: Any,
    strategy: Any = None,
    measure: bool = True,
    roll: bool = True,
    target: Any = None,
    has_aux: bool = False,
) -> list[Finding]:
    """Traces ``fn(*args)`` and reports checkpointing mistakes in it.

    Reads every `jax.checkpoint` in the traced program (however deep, inside scans, jits
    and conditionals) and reports: policy names that no `checkpoint_name` produces (RM001),
    names both saved and offloaded (RM002), `save_anything_except_these_names` (RM003),
    `dots_with_no_batch_dims_saveable` where every dot is batched (RM004), checkpoints the
    compiler undid (RM005), checkpoints that save no memory (RM006), checkpoints around a
    whole scan (RM007) and nested checkpoints whose inner policy is overridden (RM008).

    Args:
      fn: the function to check, usually the loss; it is traced, not run.
      *args: example arguments (arrays or `jax.ShapeDtypeStruct`s, in pytrees).
      strategy: if given, check ``remat.apply(fn, strategy)`` instead of ``fn``.
      measure: also compile the gradient (with `remat.measure`) to check for checkpoints
        the compiler removed (RM005), when a checkpoint lies outside every loop; needs a
        scalar ``fn``; ``args`` may be `jax.ShapeDtypeStruct` s (the gradient is compiled,
        never run). Other findings need no compilation.
      roll: with a strategy, roll the repeated layers outside the program's scans into scans
        first, as `remat.apply` does; False checks the strategy on the program as written.
      target: compile for this TPU slice (a `remat.Target` or its name, ``"tpu:v5e:2x2"``):
        the arguments are placed on it as `remat.Target.place` places them (the first one
        as the parameters), so RM005 and RM006 read the TPU compiler's program.
      has_aux: ``fn`` returns ``(loss, aux)``, as for ``jax.value_and_grad(fn,
        has_aux=True)``: the gradient compiled for RM005 is the loss's.

    Returns:
      The findings (per check, in program order), without duplicates; an empty list when
      nothing is wrong.

    Raises:
      TypeError: if ``fn`` is not callable or an argument leaf is not an array.
      ValueError: for an unknown ``strategy``.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> from jax.ad_checkpoint import checkpoint_name
      >>> def layer(x):
      ...     return jnp.sin(checkpoint_name(x * 2.0, "hidden"))
      >>> policy = jax.checkpoint_policies.save_only_these_names("hiden")
      >>> loss = lambda x: jnp.sum(jax.checkpoint(layer, policy=policy)(x))
      >>> [f.code for f in remat.lint(loss, jnp.ones(3), measure=False)]
      ['RM001']
    """
    fn, args = with_modules_split(fn, args)  # Equinox modules: arrays traced, the rest static
    _check_args(fn, args)
    if target is not None:
        args = parse_target(target, "remat.lint").place(args, 0, "remat.lint")
    if not isinstance(measure, bool):
        raise ValueError(_NOT_BOOL_MEASURE.format(got=measure))
    if not isinstance(has_aux, bool):
        raise ValueError(f"`remat.lint` got has_aux={has_aux!r}; pass True or False.")
    with compiling_for(compile_device(args)):  # "offload:..." checked against the target
        return _lint_placed(fn, args, strategy, roll, measure, has_aux)


def _lint_placed(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    strategy: Any,
    roll: bool,
    measure: bool,
    has_aux: bool = False,
) -> list[Finding]:
    """`lint` on arguments already checked and placed."""
    if strategy is not None:
        from .._core._strategy import as_strategy
        from .._trace._apply import apply

        fn = apply(fn, as_strategy(strategy, "remat.lint"), roll=roll)
    closed = jax.make_jaxpr(fn)(*args)
    flat_args = jax.tree_util.tree_leaves(args)
    all_sites = walk.sites(closed.jaxpr)
    checkpoints = [s for s in all_sites if s.primitive == walk.CHECKPOINT]
    findings: list[Finding] = []
    for site in checkpoints:
        findings += _check_policy_names(site, all_sites)
        findings += _check_dots_no_batch(site, all_sites)
        findings += _check_whole_scan(site, all_sites)
        findings += _check_nested(site)
    findings += _check_no_memory_saved(closed, flat_args, checkpoints)
    # On every backend checkpoints inside loops survive compilation; compile only when one
    # lies outside every loop (where CPU's CSE can undo it).
    if measure and any(s.loops == 0 for s in checkpoints):
        from ._lint_compiled import check_eliminated

        findings += check_eliminated(fn, args, checkpoints, has_aux)
    return _dedupe(findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


def _names(region: list[walk.Site]) -> dict[str, str | None]:
    """`checkpoint_name` names produced in ``region`` -> where the first one is made."""
    names: dict[str, str | None] = {}
    for site in region:
        if site.eqn.primitive is NAME_P:
            names.setdefault(site.eqn.params["name"], walk.source(site.eqn))
    return names


def _closest(name: str, names: list[str]) -> list[str]:
    ranked = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)
    return ranked + sorted(set(names) - set(ranked))


def _check_policy_names(site: walk.Site, all_sites: list[walk.Site]) -> list[Finding]:
    policy = site.eqn.params["policy"]
    info = policy_info(policy)
    label = policy_label(policy)
    where = walk.source(site.eqn)
    findings = []
    inside = _names(walk.within(all_sites, site))
    everywhere = _names(all_sites)
    for name in sorted(info.names - set(inside)):
        occurring = _closest(name, list(inside))
        here = ", ".join(repr(n) for n in occurring) if occurring else "none"
        elsewhere = (
            f"; {name!r} is produced outside this checkpoint, at {everywhere[name]}"
            if name in everywhere
            else ""
        )
        fix = (
            f"use one of the names that occur ({occurring[0]!r} is closest)"
            if occurring
            else f"name the value inside the checkpointed function with checkpoint_name(x, {name!r})"
        )
        findings.append(
            Finding(
                "RM001",
                f"policy {label} lists {name!r}, but no checkpoint_name inside this checkpoint "
                f"produces it (names here, closest first: {here}){elsewhere}",
                where,
                fix,
            )
        )
    for name in sorted(info.saved_and_offloaded):
        outcome = (
            "offloading wins, so it is silently not kept on the device"
            if probe(policy, name) == OFFLOAD
            else "saving wins, so it is silently not offloaded"
        )
        findings.append(
            Finding(
                "RM002",
                f"policy {label} both saves and offloads {name!r}; {outcome}",
                where,
                f"list {name!r} only in names_which_can_be_offloaded (or only in the saved names)",
            )
        )
    if info.save_anything_except and SAVE_ANYTHING_EXCEPT_IGNORES_NAMES:
        findings.append(
            Finding(
                "RM003",
                f"save_anything_except_these_names saves every value in JAX {jax.__version__} "
                "(its names are ignored), so this checkpoint recomputes nothing",
                where,
                "use save_any_names_but_these(...) to save named values except these, or "
                "save_only_these_names(...) with the names to keep",
            )
        )
    return findings


def _batch_dims(eqn: core.JaxprEqn) -> bool:
    (_, _), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    return bool(lhs_batch or rhs_batch)


def _check_dots_no_batch(site: walk.Site, all_sites: list[walk.Site]) -> list[Finding]:
    policy = site.eqn.params["policy"]
    if not is_dots_no_batch(policy):
        return []
    dots = [s.eqn for s in walk.within(all_sites, site) if s.primitive == "dot_general"]
    if not dots or not all(_batch_dims(d) for d in dots):
        return []
    return [
        Finding(
            "RM004",
            f"{policy_label(policy)} keeps nothing here: every matmul in this checkpoint "
            f"({len(dots)}) has batch dimensions (from vmap or a batched einsum), so it "
            "recomputes everything, like nothing_saveable",
            walk.source(site.eqn),
            "use dots_saveable (saves batched matmuls too), or name the values to keep "
            "with checkpoint_name and use save_only_these_names",
        )
    ]


def _check_whole_scan(site: walk.Site, all_sites: list[walk.Site]) -> list[Finding]:
    if site.loops:
        return []  # a checkpointed block of an outer loop: nested checkpointing, O(sqrt(N))
    findings = []
    for scan in _own_scans(site, all_sites):
        body_checkpointed = any(
            s.primitive == walk.CHECKPOINT for s in walk.within(all_sites, scan)
        )
        if body_checkpointed:
            continue  # a checkpointed scan inside a checkpoint: two-level checkpointing
        if _beside_longer_blocks(site, scan, all_sites):
            continue  # the last, shorter block of a loop of checkpointed blocks (`Nested`)
        findings.append(
            Finding(
                "RM007",
                f"checkpoint around a whole scan of {scan.eqn.params['length']} steps "
                f"(scan at {walk.source(scan.eqn)}) with no checkpoint in its body: its "
                "backward pass rebuilds and holds every step's residuals at once",
                walk.source(site.eqn),
                "checkpoint the scan body instead: jax.lax.scan(jax.checkpoint(body), ...), "
                "remat.apply(fn, 'full') or remat.scan",
            )
        )
    return findings


def _own_scans(site: walk.Site, all_sites: list[walk.Site]) -> list[walk.Site]:
    """The scans of more than one step whose nearest enclosing checkpoint is ``site``: a scan
    inside an inner checkpoint is that checkpoint's to answer for."""
    return [
        s
        for s in walk.within(all_sites, site)
        if s.primitive == "scan" and s.eqn.params["length"] > 1 and s.checkpoint is site
    ]


def _beside_longer_blocks(site: walk.Site, scan: walk.Site, all_sites: list[walk.Site]) -> bool:
    """Whether checkpoint ``site`` sits beside (in the same jaxpr) a loop whose body is a
    checkpoint around a scan at least as long as ``scan``.

    That is how a nested schedule runs steps that do not fill a whole block: one more
    checkpointed block after (or, in reverse, before) the loop over the whole ones. Its
    backward pass holds no more steps' residuals than each block of the loop does.
    """
    length = scan.eqn.params["length"]
    for loop in all_sites:
        if loop.primitive not in walk.LOOPS or loop.steps != site.steps:
            continue
        for block in walk.within(all_sites, loop):
            if block.primitive != walk.CHECKPOINT or block.checkpoint is not site.checkpoint:
                continue
            if any(s.eqn.params["length"] >= length for s in _own_scans(block, all_sites)):
                return True
    return False


def _check_nested(site: walk.Site) -> list[Finding]:
    outer = site.checkpoint
    if outer is None or site.loop_since_checkpoint:
        return []
    inner_policy, outer_policy = site.eqn.params["policy"], outer.eqn.params["policy"]
    if same_policy(inner_policy, outer_policy):
        return []
    inner, outer_label = policy_label(inner_policy), policy_label(outer_policy)
    return [
        Finding(
            "RM008",
            f"checkpoint with policy {inner} is nested in a checkpoint with policy "
            f"{outer_label} (at {walk.source(outer.eqn)}) with no loop between them: JAX "
            f"chooses what the forward pass keeps from inside it with {outer_label}, so "
            f"{inner} only applies while the outer region is recomputed",
            walk.source(site.eqn),
            "give the outer checkpoint the policy you want and drop the inner one, or "
            "checkpoint a scan body inside the outer checkpoint (two-level checkpointing)",
        )
    ]


_NOT_ACTIVATIONS = ("from the argument", "from a literal", "from a constant")


def residual_bytes(closed: core.ClosedJaxpr, flat_args: list) -> int:
    """Bytes of the intermediates a program keeps for its backward pass.

    Arguments, literals and constants are left out: they are held whatever is checkpointed.
    """
    fun = core.jaxpr_as_fun(closed)
    return sum(
        walk.nbytes(aval)
        for aval, where in saved_residuals(fun, *flat_args)
        if not where.startswith(_NOT_ACTIVATIONS)
    )


def _differentiable(flat_args: list) -> bool:
    return any(jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in flat_args)


def _check_no_memory_saved(
    closed: core.ClosedJaxpr, flat_args: list, checkpoints: list[walk.Site]
) -> list[Finding]:
    """RM006: replace each outermost checkpoint's policy by `everything_saveable` (the same
    residuals as no checkpoint) and compare the residuals the program keeps."""
    if not _differentiable(flat_args):
        return []
    outermost = [
        s
        for s in checkpoints
        if s.checkpoint is None
        and not policy_info(s.eqn.params["policy"]).save_anything_except
        # Under a custom derivative (remat.scan's Binomial schedule) the rule chooses the
        # residuals; the checkpoint acts inside its backward pass, which this cannot see.
        and not any(p.primitive.startswith("custom_") for p in s.parents)
    ]
    if not outermost:
        return []
    with_all = residual_bytes(closed, flat_args)
    everything = jax.checkpoint_policies.everything_saveable
    findings = []
    for site in outermost:
        if site.eqn.params["policy"] is everything:
            without = with_all
        else:
            new = walk.replace_eqn(
                closed.jaxpr,
                site,
                lambda e: e.replace(params={**e.params, "policy": everything}),
            )
            without = residual_bytes(closed.replace(jaxpr=new), flat_args)
        if with_all < without:
            continue
        findings.append(
            Finding(
                "RM006",
                f"checkpoint with policy {policy_label(site.eqn.params['policy'])} saves no "
                f"memory: the program keeps {with_all} bytes of residuals with it and "
                f"{without} without it",
                walk.source(site.eqn),
                "remove the checkpoint, or choose a policy that saves less (e.g. "
                "nothing_saveable, or save_only_these_names for the expensive values)",
            )
        )
    return findings
