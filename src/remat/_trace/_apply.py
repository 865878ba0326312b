"""`remat.apply`: every scan of a program checkpointed by one strategy.

The program's own checkpoints are respected. A scan whose body already checkpoints something
(`jax.checkpoint`, `flax.linen.remat`, `nnx.remat` inside it) keeps the user's choice, and
scans inside a user's checkpoint are left as they are; the strategy applies to the other
scans. Wrapping a checkpointed body in a second checkpoint composes badly: the outer policy
decides again over the inner one's residuals (a linen model with
``nn.remat(policy=save_only_these_names("h1"))``: 56.8 MiB as written, 73.1 MiB under
``"dots"`` on top). ``override=True`` inlines the program's own checkpoints and lets the
strategy decide alone. `apply` does not compile, so it cannot compare peaks; `remat.measure`
and `remat.compare` do, and warn with both figures when a strategy's peak is above the
program's as written.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._core._errors import brief
from .._core._strategy import Strategy, as_strategy, resolve_policy
from .._core._warnings import RematWarning
from ._checkpoints import _is_remat, checkpoint_sites, contains_checkpoint
from ._rewrite import _NOT_CALLABLE, Body, _Interpreter, lax_loop
from ._roll_explain import explain_no_roll
from ._roll_rewrite import roll_unscanned
from ._scan_info import ScanInfo, count, count_eqn, position_of, sub_jaxprs
from ._traced import _rewritten, _Traced

_NO_SCAN = (
    "`remat.apply` found no `scan` in {name}, so strategy {strategy!r} is applied to the whole "
    "function. This rarely saves memory: the backward pass needs the recomputed values all at "
    "once, and on the CPU backend XLA removes a checkpoint outside a loop altogether. Put the "
    "layers in a `jax.lax.scan` (or `flax.linen.scan` / `nnx.scan`) to checkpoint per layer."
)
_NOT_ROLLED = " Nothing could be rolled into a scan: {why}."
_KEPT = (
    "`remat.apply` kept the program's own checkpoints in {name}: {sites}. Strategy "
    "{strategy!r} is not applied to {what}, which {verb} checkpointed as written (a second "
    "checkpoint around the user's composes badly and can raise the peak). Pass "
    "`override=True` to replace the program's checkpoints with the strategy, or compare both "
    "with `remat.compare(fn, *args, strategies=[...])`."
)
_NO_MATCH = (
    "`remat.apply` got Strategy(scans={scans!r}), but {missing!r} matches no scan of {name}. "
    "Its scans are: {listing}. Use `remat.list_scans(fn, *args)` to list them, and select by "
    "position (int) or by name (str): a scan's name, its path or its body's module."
)


def _selector(strategy: Strategy, scans: Sequence[ScanInfo], name: str):
    if strategy.scans is None:
        return lambda info: True
    for s in strategy.scans:
        ok = 0 <= s < len(scans) if isinstance(s, int) else any(s in _names(i) for i in scans)
        if not ok:
            listing = ", ".join(
                f"{i.position}: {i.name or '(no name)'}"
                + (f" (body {i.module})" if i.module and i.module != i.name else "")
                for i in scans
            )
            raise ValueError(
                _NO_MATCH.format(
                    scans=strategy.scans, missing=s, name=name, listing=listing or "none"
                )
            )
    wanted = set(strategy.scans)
    return lambda info: bool({info.position, *_names(info)} & wanted)


def _names(info: ScanInfo) -> set[str]:
    """The names that select a scan: its name, its path and its body's module."""
    return {info.name, "/".join(info.path)} | ({info.module} if info.module else set())


def apply(
    fn: Callable[..., Any] | None = None,
    strategy: Any = None,
    *,
    has_aux: bool = False,
    roll: bool = True,
    override: bool = False,
) -> Callable[..., Any]:
    """Returns ``fn`` with the bodies of its scans checkpointed by ``strategy``.

    ``fn`` is traced to a jaxpr (once per input structure, shapes and dtypes) and every
    ``scan`` in it (or those ``Strategy.scans`` selects, by position or name; see
    `remat.list_scans`) runs its body under ``jax.checkpoint(body, policy=...,
    prevent_cse=False)``: `lax.scan` already keeps XLA from merging the recomputation with
    the forward pass, so the CSE barrier is not needed inside a scan (as `jax.checkpoint`'s
    documentation recommends). A `Strategy` with a schedule other than ``"per_step"`` runs
    the scan with `remat.scan` (``"none"``: a plain `lax.scan`). A program without any scan
    gets the policy on the whole function (``prevent_cse=True``), with a `RematWarning`.

    With ``roll=True`` (the default), layers that repeat outside any scan (a Python loop
    over a list of layers, in linen, nnx, Equinox or plain JAX) are rolled first: each run
    of identical layers becomes a `lax.scan` over the per-layer inputs stacked inside the
    step (see `remat.list_scans` and docs/rolling.md for what stacking costs), and the
    strategy applies to it like to any scan. The program's own scans keep their positions:
    the rolled scans are numbered after them. When nothing can be rolled in a program
    without scans, the warning says why in one line.

    Args:
      fn: the function; pytree arguments, keyword arguments and pytree outputs.
      strategy: a strategy string (``"none"``, ``"full"``, ``"dots"``, ``"dots_no_batch"``,
        ``"everything"``, ``"names:a,b"``, ``"offload:a,b"``), a policy callable, or a
        `remat.Strategy`. ``"none"`` leaves the scans as they are; None means ``"full"``,
        as ``policy=None`` does in `jax.checkpoint`. Without ``fn``,
        ``remat.apply(strategy=...)`` is a decorator. The public `remat.apply` also takes
        a `remat.Plan` or a plan file's path (``"plan.json"``): the plan is applied to
        ``fn``, checked against it when traced (see `remat._plan._apply`); ``has_aux``,
        ``roll`` and ``override`` do not apply to it.
      has_aux: ``fn`` returns ``(loss, aux)``. The rewrite keeps any output structure, so
        this changes nothing: the rewritten function returns what ``fn`` returns, ready for
        ``jax.value_and_grad(..., has_aux=True)``. Accepted for symmetry with `remat.measure`
        and `remat.plan`.
      roll: roll repeated layers outside the program's scans into scans first (see
        above); False checkpoints the program as written.
      override: what to do with the program's own checkpoints (`jax.checkpoint`,
        `flax.linen.remat`, `nnx.remat`). False (the default) keeps them: a scan whose body
        already checkpoints is left as written, and so are scans inside a checkpoint, with
        a `RematWarning` naming them; the strategy applies to the other scans. True
        removes every checkpoint of the program and applies the strategy alone.

    Returns:
      A function with ``fn``'s signature and output structure, whose values and gradients
      equal ``fn``'s; it works under `jax.jit`, `jax.grad` and `jax.vmap`.

    Raises:
      TypeError: if ``fn`` is not callable.
      ValueError: for an unknown strategy, or (when called) a ``Strategy.scans`` entry that
        matches no scan.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
      ...     return x.sum()
      >>> ws, x = jnp.ones((4, 3, 3)) * 0.1, jnp.ones(3)
      >>> g = jax.grad(remat.apply(loss, "full"))(ws, x)
      >>> bool(jnp.allclose(g, jax.grad(loss)(ws, x)))
      True
    """
    for flag, value in (("has_aux", has_aux), ("override", override)):
        if not isinstance(value, bool):
            raise TypeError(f"`remat.apply` got {flag}={value!r}; pass True or False.")
    if fn is None:
        as_strategy(strategy, "remat.apply")  # validate now, not when decorating
        return functools.partial(
            apply, strategy=strategy, has_aux=has_aux, roll=roll, override=override
        )
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(where="remat.apply", got=brief(fn)))
    strategy = as_strategy(strategy, "remat.apply")
    policy = resolve_policy(strategy.policy, "remat.apply")
    schedule = strategy.schedule
    name = f"`{getattr(fn, '__qualname__', repr(fn))}`"
    plain = schedule == "none" or (policy is None and schedule == "per_step")
    if plain and not override:
        return fn  # plain scans, no checkpoint: nothing to rewrite
    mode = "inline" if override else "keep"
    traced_fn = roll_unscanned(fn) if roll else fn

    def transform_for(select):
        def transform(info: ScanInfo, body: Body) -> Body | None:
            if not select(info) or (not override and contains_checkpoint(info.jaxpr.jaxpr)):
                return None
            if plain:  # override: the body as written, its own checkpoints inlined
                return body if contains_checkpoint(info.jaxpr.jaxpr) else None
            if schedule != "per_step":
                return body  # the schedule's loop checkpoints it (see `loop`)
            return jax.checkpoint(body, policy=policy, prevent_cse=False)

        def loop(info, body, consts, init, xs):
            written = not override and contains_checkpoint(info.jaxpr.jaxpr)
            if plain or not select(info) or schedule == "per_step" or written:
                return lax_loop(info, body, consts, init, xs)
            from .._scan._scan import scan  # imported when first needed

            def step(carry, x):
                new, ys = body(consts, carry, x)
                return type(carry)(new), ys  # the same sequence type as handed in

            return scan(
                step,
                list(init),
                list(xs),
                length=info.length,
                reverse=info.reverse,
                schedule=schedule,
                policy=strategy.policy,
            )

        return transform, loop

    counted: list[tuple[int, int]] = []  # see `scans_as_written`

    def evaluator(traced: _Traced):
        closed = traced.jaxpr
        select = _selector(strategy, traced.scans, name)  # raises for a selection of nothing
        sites = () if override else checkpoint_sites(closed.jaxpr)
        selected = [i for i in traced.scans if select(i)]
        kept = _kept(traced, selected) if sites else []
        if sites:
            _warn_kept(traced, kept, sites, name, strategy)
        if traced.scans:
            counted.append((len(selected) - len(kept), len(kept)))
        else:
            counted.append((0, 1) if sites else (1, 0))
        if not traced.scans:
            interp = _Interpreter(lambda info, body: None, lax_loop, {}, mode)

            def whole(*dynamic):
                return interp.eval(closed.jaxpr, closed.consts, dynamic, 0, (), ())

            if plain or policy is None or sites:  # nothing to apply, or the user's stays
                return whole
            # Warned once per input structure, when `fn2` first sees it.
            message = _NO_SCAN.format(name=name, strategy=strategy)
            if roll:
                message += _NOT_ROLLED.format(why=explain_no_roll(closed))
            warnings.warn(message, RematWarning, stacklevel=4)
            return jax.checkpoint(whole, policy=policy, prevent_cse=True)
        transform, loop = transform_for(select)

        def evaluate(*dynamic):
            interp = _Interpreter(transform, loop, {}, mode)
            return interp.eval(closed.jaxpr, closed.consts, dynamic, 0, (), ())

        return evaluate

    rewritten = _rewritten(traced_fn, evaluator)
    rewritten._remat_scans_counted = counted  # type: ignore[attr-defined]
    return rewritten


def scans_as_written(
    fn: Callable[..., Any],
    strategy: Any,
    args: Sequence[Any],
    *,
    roll: bool = True,
    override: bool = False,
) -> tuple[int, int]:
    """``(applied, as_written)``: of the scans ``strategy`` selects in ``fn`` at ``args``, how
    many ``apply(fn, strategy, roll=roll, override=override)`` checkpoints, and how many it
    leaves as the program wrote them (their own checkpoints kept, ``override=False``).

    A program without any scan (after rolling) counts as one: the whole function. A strategy
    that rewrites nothing (``"none"``) gives ``(0, 0)``. The counts are those `apply`'s
    rewrite recorded when it traced ``fn`` (`counted_scans`), so a caller that has already
    traced the rewritten function at ``args`` asks `counted_scans` instead of tracing again.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._trace._apply import scans_as_written
      >>> body = jax.checkpoint(lambda c, w: (jnp.tanh(c @ w), None))
      >>> def loss(ws, x):
      ...     return jax.lax.scan(body, x, ws)[0].sum()
      >>> args = (jnp.ones((4, 3, 3)), jnp.ones(3))
      >>> scans_as_written(loss, "full", args), scans_as_written(loss, "full", args, override=True)
      ((0, 1), (1, 0))
    """
    rewritten = apply(fn, strategy, roll=roll, override=override)
    counts = counted_scans(fn, rewritten)
    if counts is not None:
        return counts
    with warnings.catch_warnings():  # `apply`'s own warnings are for when it is used
        warnings.simplefilter("ignore", RematWarning)
        jax.make_jaxpr(rewritten)(*args)
    return counted_scans(fn, rewritten) or (0, 0)


def counted_scans(fn: Callable[..., Any], rewritten: Callable[..., Any]) -> tuple[int, int] | None:
    """``(applied, as_written)`` that ``rewritten`` (what `apply` returned for ``fn``)
    recorded when it last traced a new input structure, or None before its first trace;
    ``(0, 0)`` when `apply` had nothing to rewrite (it returned ``fn`` itself, which may be
    another rewrite with counts of its own)."""
    if rewritten is fn:
        return (0, 0)
    counted = rewritten._remat_scans_counted  # type: ignore[attr-defined]
    return counted[-1] if counted else None


def _kept(traced: _Traced, scans: Sequence[ScanInfo]) -> list[ScanInfo]:
    """The ``scans`` that keep the program's checkpoints: those whose body checkpoints, and
    those inside one of the program's checkpoints."""
    covered: set[int] = set()
    _covered(traced.jaxpr.jaxpr, 0, False, covered, {})
    return [i for i in scans if i.position in covered or contains_checkpoint(i.jaxpr.jaxpr)]


def _warn_kept(traced: _Traced, kept, sites, name: str, strategy: Strategy) -> None:
    """Warns that the program's own checkpoints were kept, and which scans (``kept``) they
    cover."""
    if kept:
        listed = ", ".join(
            f"{i.position}" + (f" ({i.name})" if i.name else "")
            + (f" at {i.source}" if i.source else "")
            for i in kept
        )  # fmt: skip
        what = f"scan{'s' if len(kept) > 1 else ''} {listed}"
        verb = "are" if len(kept) > 1 else "is"
    elif not traced.scans:
        what, verb = "the function", "is"
    else:
        return  # the checkpoints are outside the selected scans: the strategy applies
    message = _KEPT.format(
        name=name, sites="; ".join(str(s) for s in sites), strategy=strategy.name,
        what=what, verb=verb,
    )  # fmt: skip
    warnings.warn(message, RematWarning, stacklevel=5)


def _covered(jaxpr, base: int, inside: bool, out: set[int], memo) -> None:
    """Adds to ``out`` the positions of the scans inside one of the program's checkpoints."""
    from jax.extend import core as jcore

    for eqn in jaxpr.eqns:
        if eqn.primitive is jcore.primitives.scan_p:
            if inside:
                out.add(position_of(eqn, base))
            _covered(eqn.params["jaxpr"].jaxpr, base + 1, inside, out, memo)
        else:
            b = base
            for sub in sub_jaxprs(eqn):
                _covered(sub, b, inside or _is_remat(eqn), out, memo)
                b += count(sub, memo)
        base += count_eqn(eqn, memo)
