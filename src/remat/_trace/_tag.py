"""Naming every value of every scan body, and re-running a program with chosen names saved.

The planner identifies the values of a scan body by position: the body is flattened (calls to
`jax.jit`-ed functions inlined) and every floating-point output of its ``j``-th equation in the
``i``-th scan of the program is tagged
``checkpoint_name(x, "remat_s{i}_e{j}")`` (``..._e{j}_{k}`` for the ``k``-th output of an
equation with several), where ``i`` is the scan's position as `remat.list_scans` numbers it.
Only scans that are not inside another scan's body are planned; scans inside them stay as
they are. The rewrite itself is `remat._trace._rewrite.rewrite_scans`. Checkpointing the body with ``save_only_these_names(*chosen)`` then
saves exactly the chosen values: any subset is expressible, not only JAX's named policies.
With ``ScanChoice.kept_calls`` the body's jitted calls that hold no chosen value are bound
whole instead (`tagged_body`: the same values, another program for XLA).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import source_info_util
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore

from .._core._complex import RealSaves
from .._core._schedule import Binomial
from ._ends import TAIL_POLICY, rewrite_ends
from ._periodic import periodic_loop
from ._rewrite import ScanInfo, _count, lax_loop, list_scans, rewrite_scans
from ._taps import tap
from ._traced import aval_spec

# Call primitives whose bodies are inlined, so the values inside them can be named. The
# program's own checkpoints (`jax.checkpoint`, `nn.remat`, `nnx.remat`) are inlined too: the
# planner decides what the whole body saves, against the program as written (its baseline).
_INLINE = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "checkpoint": "jaxpr",
    "remat2": "jaxpr",
}


def value_name(scan: int, eqn: int, out: int, nouts: int) -> str:
    """The checkpoint name of output ``out`` of equation ``eqn`` in scan ``scan``."""
    return f"remat_s{scan}_e{eqn}" if nouts == 1 else f"remat_s{scan}_e{eqn}_{out}"


def _read(env: dict, v: Any) -> Any:
    return v.val if isinstance(v, jcore.Literal) else env[v]


def _bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    params = eqn.primitive.get_bind_params(eqn.params)
    with (
        source_info_util.user_context(
            eqn.source_info.traceback, name_stack=eqn.source_info.name_stack
        ),
        eqn.ctx.manager,
    ):
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _eval_inlined(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    staged: list[Any] | None = None,
    ranges: dict[int, tuple[int, int]] | None = None,
) -> list[Any]:
    """Evaluates ``jaxpr`` with its calls inlined (`_inner`). With ``staged`` and ``ranges``
    (`flat_ranges`), appends each equation evaluated that the trace keeps (not `_folded`) to
    ``staged``, and records per call inlined the range of ``staged`` its equations took."""
    env: dict = {}
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        inner = _inner(eqn)
        if inner is not None:
            start = 0 if staged is None else len(staged)
            outs = _eval_inlined(*_open(inner), invals, staged, ranges)
            if ranges is not None and staged is not None:
                ranges[id(eqn)] = (start, len(staged))
        else:
            outs = _bind(eqn, invals)
            if staged is not None and not _folded(outs):
                staged.append(eqn)
        env.update(zip(eqn.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def _inlined(eqn: Any) -> bool:
    """A call whose ``jaxpr`` parameter is its body: a jit, or a checkpoint (with a policy)."""
    return eqn.primitive.name in ("jit", "pjit") or "policy" in eqn.params


def user_name(eqn: Any) -> str | None:
    """The program's own `checkpoint_name` of an equation's output (a ``name`` equation)."""
    return eqn.params.get("name") if eqn.primitive.name == "name" else None


def _spec(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def flatten(closed: Any) -> Any:
    """A `ClosedJaxpr` equal to ``closed`` with calls to jitted functions inlined."""
    specs = [aval_spec(v.aval) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, a))(*specs)


def is_tagged(aval: Any) -> bool:
    """Whether a value of this type gets a name: real floating-point arrays only (a complex
    value is recomputed: `jax.checkpoint` cannot save one, see `remat._core._complex`)."""
    return hasattr(aval, "dtype") and jnp.issubdtype(aval.dtype, jnp.floating)


def eval_tagged(flat: Any, scan: int, args: Sequence[Any]) -> list[Any]:
    """Evaluates a flattened body, tagging every floating-point equation output."""
    jaxpr = flat.jaxpr
    env: dict = {}
    env.update(zip(jaxpr.constvars, flat.consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for j, eqn in enumerate(jaxpr.eqns):
        outs = _bind(eqn, [_read(env, v) for v in eqn.invars])
        for k, (var, out) in enumerate(zip(eqn.outvars, outs, strict=True)):
            if is_tagged(var.aval):
                name = value_name(scan, j, k, len(eqn.outvars))
                out = checkpoint_name(tap(name, out), name)
            env[var] = out
    return [_read(env, v) for v in jaxpr.outvars]


@dataclasses.dataclass(frozen=True)
class ScanChoice:
    """What to do with one scan: save these names, with this schedule.

    ``names=None`` leaves the scan as it is (no checkpointing). A ``pattern`` of ``g``
    save sets gives step ``i`` the names ``pattern[i % g]`` (``per_step`` only; ``g``
    divides the scan's length, see `remat._trace._periodic`); ``names`` is then their union.
    """

    names: tuple[str, ...] | None
    schedule: Any = "per_step"
    offload: tuple[str, ...] = ()  # names kept in host memory (see `remat._core._offload`)
    pattern: tuple[tuple[str, ...], ...] = ()  # per position: the names it saves
    # The body's jitted calls that hold none of ``names`` bound whole, not inlined
    # (`tagged_body`): the same save set, which XLA may pack differently.
    kept_calls: bool = False

    def policy(self) -> Any:
        """The `jax.checkpoint` policy: save ``names``, offload ``offload`` to the host.

        A `remat.Binomial` step being reversed keeps all its residuals: the planner saves
        every needed value there, and `everything_saveable` on the untagged body (see
        `rewrite`) takes the least memory of the ways to say so (demo GPT, Binomial(2):
        37.9 MiB; on the tagged body, or without a checkpoint: 39.9; the needed values
        named: 41.9).
        """
        if isinstance(self.schedule, Binomial):
            return RealSaves(jax.checkpoint_policies.everything_saveable)
        if not self.offload:
            return jax.checkpoint_policies.save_only_these_names(*(self.names or ()))
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(self.names or ()),
            names_which_can_be_offloaded=list(self.offload),
            offload_src="device",
            offload_dst="pinned_host",
        )


def planned_scans(fn: Callable, *args: Any, **kwargs: Any) -> list[ScanInfo]:
    """The scans the planner plans: those not inside another scan's body."""
    scans = list_scans(fn, *args, roll=False, **kwargs)  # as given: `plan` rolls first
    out, skip_until = [], -1
    for info in scans:
        if info.position <= skip_until:
            continue
        out.append(info)
        skip_until = info.position + _count(info.jaxpr.jaxpr, {})
    return out


def rewrite(fn: Callable, choices: dict[int, ScanChoice]) -> Callable:
    """``fn`` with the scans at the positions in ``choices`` re-run as they say.

    Each chosen scan's body is evaluated with every value tagged (see `eval_tagged`; with
    ``kept_calls``, its jitted calls that hold no chosen value bound whole: `tagged_body`) and
    checkpointed with ``save_only_these_names(*choice.names)`` (with a ``pattern``, each
    position with its own names: `remat._trace._periodic.periodic_loop`); a schedule other than
    ``"per_step"`` runs the scan with `remat.scan` (a `remat.Binomial` step saves all its
    residuals, `everything_saveable`, while it is reversed). Other scans are left as they are.
    """
    choices = dict(choices)

    def chosen(info: ScanInfo) -> ScanChoice | None:
        choice = choices.get(info.position)
        return None if choice is None or choice.names is None else choice

    def transform(info: ScanInfo, body: Any) -> Any:
        choice = chosen(info)
        if choice is None:
            return None
        if choice.kept_calls:
            tagged = tagged_body(info, (*(choice.names or ()), *choice.offload))
        else:
            flat = flatten(info.jaxpr)
            nk = info.num_carry

            def tagged(consts, carry, xs):
                outs = eval_tagged(flat, info.position, [*consts, *carry, *xs])
                return list(outs[:nk]), list(outs[nk:])

        if choice.pattern:
            return tagged  # checkpointed per position by `periodic_loop`
        if choice.schedule == "per_step":
            return jax.checkpoint(tagged, policy=choice.policy(), prevent_cse=False)
        if isinstance(choice.schedule, Binomial):
            return body  # saves everything (`ScanChoice.policy`): no names needed
        return tagged

    def loop(info: ScanInfo, body: Any, consts, init, xs):
        choice = chosen(info)
        if choice is not None and choice.pattern:
            return periodic_loop(body, choice.pattern, consts, init, xs, info.length, info.reverse)
        if choice is None or choice.schedule in ("per_step", "none"):
            return lax_loop(info, body, consts, init, xs)
        from .._scan._scan import scan  # the schedules of `remat.scan`

        def step(carry, x):
            new, ys = body(consts, carry, x)
            return type(carry)(new), ys  # the loop may hand the carry in as a tuple

        policy = choice.policy()
        return scan(
            step, list(init), list(xs), length=info.length, reverse=info.reverse,
            schedule=choice.schedule, policy=policy,
        )  # fmt: skip

    segmented = [p for p, c in choices.items() if c.names is not None and c.pattern]
    if len(segmented) == 1:  # the code around it too (`remat._trace._ends`)
        (at,) = segmented
        return rewrite_ends(fn, at, choices[at].pattern, transform, loop, TAIL_POLICY)
    return rewrite_scans(fn, transform, loop)


### Keeping jitted calls whole (`ScanChoice.kept_calls`)
#
# Re-running a scan body with the chosen values named and the rest of its jitted calls whole.
#
# The planner names a scan body's values on its flattened form (`remat._trace._tag.flatten`:
# every call to a `jax.jit`-ed function inlined, so that each value inside one can be saved).
# Re-running that flattened form inlines every call, also those none of whose values is saved,
# and XLA packs the resulting program's temporaries differently from the program as written
# (Llama-3-8B shapes, MaxText's ``minimal`` save set: 53,952,448 bytes more peak with
# ``jnp.tril``, ``jnp.where`` and ``nn.silu`` inlined than with them kept as calls; see
# `benchmarks/preset_gap.py`), and the other way at Llama-3.2-1B shapes (the 50% plan's save
# set: 7.6% more with ``jnp.where`` kept). So this form is chosen by `ScanChoice.kept_calls`,
# where the planner compiles it beside the inlined one (`remat._plan._calls`).
#
# `eval_kept` evaluates the body as written instead, and inlines a call only where a chosen
# name falls inside it: every other call is bound whole, as the program binds it. The values
# outside kept calls are tagged with the same names as on the flattened form
# (`value_name`, by their index there), so any save set means the same
# values. The flattened form's equations are matched one for one against the walk of the body
# (`flat_ranges`); where they differ (tracing dropped or added an equation), the flattened form
# is evaluated as before, with every call inlined.

_NAME = re.compile(r"remat_s(\d+)_e(\d+)(?:_\d+)?")


def _inner(eqn: Any) -> Any:
    """The body of an equation `_eval_inlined` inlines (a closed or open jaxpr), or None."""
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
    same primitive and output types at every index). The walk is traced as `flatten` traces
    the body (`_eval_inlined`, the same walk), so an equation that tracing computes at once
    (on constants only, such as ``jnp.where``'s conversion of a Python scalar) is left out
    here as it is there (`_folded`)."""
    ranges: dict[int, tuple[int, int]] = {}
    staged: list[Any] = []
    specs = [aval_spec(v.aval) for v in closed.jaxpr.invars]
    jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, a, staged, ranges))(*specs)
    eqns = flat.jaxpr.eqns
    if len(staged) != len(eqns) or not all(map(_same, staged, eqns)):
        return None
    return ranges


def _folded(outs: Sequence[Any]) -> bool:
    """Whether an equation's outputs were folded from constants by the trace (tracers that
    hold their constant), so that the traced program leaves the equation out."""
    return bool(outs) and all(
        isinstance(o, jax.core.Tracer) and getattr(o, "get_const", lambda: None)() is not None
        for o in outs
    )


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
                if _folded(outs):  # computed from constants: not in the flattened body
                    env.update(zip(eqn.outvars, outs, strict=True))
                    continue
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
