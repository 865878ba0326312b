"""The cheap compiles: one scan on its own.

A scan's contribution to the compiled peak of a gradient step is, to within a few hundred
kilobytes on the stacks measured (demo GPT at 4 and 8 layers, ten save sets each; a bf16
Llama-style decoder at 8 layers, three save sets), the same whether the scan is compiled
inside the step or on its own, at its own length. The loop body is compiled once, so the
scan alone at its own length compiles in about the time of a 2-step one (3.6 against 3.8 s
at 80 layers of d_model 1024), but the program is the scan alone: no embeddings, loss,
optimizer or other scans. So the planner calibrates on scan-alone programs (`_calibrate`),
and checks each candidate the same way before compiling the whole step (`_rounds`).

A scan-alone program is ``jax.vjp`` of the scan over all its floating-point inputs (the
carried values, the per-step inputs and the loop-invariant ones), rewritten as
`remat._trace._tag.rewrite` rewrites it inside the program: a ``per_step`` scan checkpoints
its tagged body with ``save_only_these_names``; a `remat.Nested` or `remat.Binomial` one runs
with `remat.scan`. Its inputs are abstract (`jax.ShapeDtypeStruct`): nothing is allocated.
The forward program of a ``per_step`` scan is traced once, and each save set's is that one with
its policy put into the checkpoint (`_forward`): the same program as traced with the policy.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from .._core._schedule import Binomial
from .._measure._hbm import compile_measured
from .._measure._peak import CompiledMemory, compiled_memory
from .._measure._phases import loop_phases
from .._measure._refusal import refusal_of
from .._shard._scan_shardings import ScanPlacement, on_mesh, stacked
from .._shard._sharding import per_device_bytes
from .._trace import _jaxpr_walk as walk
from .._trace._checkpoints import contains_checkpoint
from .._trace._periodic import periodic_loop
from .._trace._rewrite import ScanInfo
from .._trace._tag import ScanChoice, _eval_inlined, _spec, eval_tagged, flatten
from .._trace._taps import tapping
from .._trace._vjp_order import after
from ._compile import SCAN, compile_each, scan_options
from ._phases import ScanMemory
from ._twolines import lone_last

# `_bodies`' functions per scan, the most recent last: (id(jaxpr), position, carries) ->
# (jaxpr, plain, tagged).
_BODIES: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}
# The most scan bodies `_bodies` keeps.
MOST_BODIES = 8


def _bodies(info: ScanInfo) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(plain, tagged)``: the scan's body ``body(consts, carry, x) -> (carry, ys)`` as it
    is and with its values tagged (`eval_tagged`), the same functions for one body each time
    (a per-layer program's layers are then JAX's cached traces, `_periodic._layer`)."""
    key = (id(info.jaxpr), info.position, info.num_carry)
    hit = _BODIES.pop(key, None)
    if hit is None or hit[0] is not info.jaxpr:
        flat = flatten(info.jaxpr)
        nk = info.num_carry

        def plain(consts, carry, xs):
            outs = _eval_inlined(flat.jaxpr, flat.consts, [*consts, *carry, *xs])
            return list(outs[:nk]), list(outs[nk:])

        def tagged(consts, carry, xs):
            outs = eval_tagged(flat, info.position, [*consts, *carry, *xs])
            return list(outs[:nk]), list(outs[nk:])

        hit = (info.jaxpr, plain, tagged)
    _BODIES[key] = hit
    while len(_BODIES) > MOST_BODIES:
        del _BODIES[next(iter(_BODIES))]
    return hit[1], hit[2]


def scan_program(info: ScanInfo, choice: ScanChoice | None, length: int) -> Callable[..., Any]:
    """``run(consts, init, xs) -> (carry, ys)``: the scan at ``info`` alone, ``length`` steps,
    checkpointed as ``choice`` says (``None``: as it is)."""
    plain, tagged = _bodies(info)
    nk = info.num_carry

    def written(consts, carry, xs):  # the body as the program wrote it, checkpoints kept
        outs = jcore.jaxpr_as_fun(info.jaxpr)(*consts, *carry, *xs)
        return list(outs[:nk]), list(outs[nk:])

    def run(consts, init, xs):
        if choice is not None and choice.pattern:  # per layer: each position its own policy
            return periodic_loop(tagged, choice.pattern, consts, init, xs, length, info.reverse)
        if choice is None:
            # As written: a body with checkpoints of its own keeps them (else the memory
            # outside the scans, the step as written less this, comes out negative); one
            # without runs flattened, its jitted calls inlined as every candidate's are (kept,
            # XLA packs the program otherwise: 0.15-1.0% more FLOPs at Llama-3-8B shapes at
            # the MaxText presets' peaks).
            body = written if contains_checkpoint(info.jaxpr) else plain
        elif choice.names is None:
            body = plain
        elif choice.schedule == "per_step":
            body = jax.checkpoint(tagged, policy=choice.policy(), prevent_cse=False)
        elif isinstance(choice.schedule, Binomial):
            body = plain  # saves everything while reversed (`ScanChoice.policy`)
        else:
            body = tagged

        def step(carry, x):
            new, ys = body(consts, carry, x)
            return type(carry)(new), ys

        if choice is None or choice.names is None or choice.schedule == "per_step":
            return jax.lax.scan(step, list(init), list(xs), length=length, reverse=info.reverse)
        from .._scan._scan import scan

        return scan(
            step, list(init), list(xs), length=length, reverse=info.reverse,
            schedule=choice.schedule, policy=choice.policy(),
        )  # fmt: skip

    return run


def scan_memory(
    info: ScanInfo, choice: ScanChoice | None, length: int, device: Any = None
) -> ScanMemory:
    """The compiled memory of the scan-alone gradient program (one ``"scan"`` compile).

    Its ``temp_bytes`` is what the scan adds to a step's peak at ``length`` steps: the
    program's arguments and outputs (inputs and their gradients) are counted by the step.
    """
    return scan_memories([(info, choice, length)], device)[0]


def scan_memories(
    requests: Sequence[tuple[ScanInfo, ScanChoice | None, int]],
    device: Any = None,
    phases: bool = False,
) -> list[ScanMemory]:
    """`scan_memory` of each ``(info, choice, length)``: each is compiled while the next is
    lowered (`compile_each`), for ``device`` (the step's, `_target.compile_device`; None:
    this machine's default) with its options (`_compile.scan_options`); with ``phases``,
    each with its phases read from XLA's dump (`remat._measure._phases.loop_phases`; see
    `remat._plan._phases`)."""
    where = _platform(device)
    options = scan_options(where)
    if not phases:  # a compiler that knows its device's memory may refuse one (`_Refusable`)
        lowerings = ((lambda r=r: _Refusable(*_lowered(*r, device), where)) for r in requests)
        return [ScanMemory(_memory(c)) for c in compile_each(lowerings, SCAN, options=options)]
    lowerings = ((lambda r=r: lower_scan(*r, device)) for r in requests)
    compiled = compile_each(lowerings, SCAN, read=loop_phases, options=options)
    return [ScanMemory(compiled_memory(c), p) for c, p in compiled]


def lower_scan(info: ScanInfo, choice: ScanChoice | None, length: int, device: Any = None) -> Any:
    """The lowered scan-alone gradient program (see `scan_memory`), for ``device``."""
    return _lowered(info, choice, length, device)[0]


class _Refusable:
    """A lowered scan-alone program whose compile, refused for memory (XLA's TPU compiler
    refuses a program over the chip's HBM), gives the memory the refusal states
    (`_RefusedScan`) instead of raising: the scan is then that much of the step, and a step
    with that save set over the device's memory too (its calibration still holds)."""

    def __init__(self, lowered: Any, io_bytes: tuple[int, int], platform: str) -> None:
        self.lowered, self.io_bytes, self.platform = lowered, io_bytes, platform

    def compile(self, options: Any = None) -> Any:
        try:  # a TPU's program with its HBM read from XLA's buffer assignment
            return compile_measured(self.lowered, options)
        except jax.errors.JaxRuntimeError as err:
            refusal = refusal_of(err)
            if refusal is None or refusal.asked_bytes is None:
                raise
            argument, output = self.io_bytes
            return _RefusedScan(CompiledMemory.from_parts(
                temp=max(refusal.asked_bytes - argument - output, 0), argument=argument,
                output=output, alias=0, platform=self.platform,
            ))  # fmt: skip

    # `_compile.compile_lowered` compiles a program with this method, where it has one: the
    # program measures itself (`compile_measured` on its lowering, whose platform it knows).
    compile_measured = compile


class _RefusedScan:
    """A scan-alone program the compiler refused, with the memory its refusal states (the
    temporaries: that less the program's inputs and its gradients)."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory


def _memory(compiled: Any) -> Any:
    return compiled.memory if isinstance(compiled, _RefusedScan) else compiled_memory(compiled)


def _platform_device(device: Any) -> Any:
    """A device of the platform a scan-alone program compiles for (None: the default)."""
    return device.mesh.devices.flat[0] if isinstance(device, ScanPlacement) else device


def _platform(device: Any) -> str:
    """The platform a scan-alone program compiles for (see `scan_memories`' ``device``)."""
    device = _platform_device(device)
    return jax.default_backend() if device is None else device.platform


def _lowered(info, choice, length, device=None) -> tuple[Any, tuple[int, int]]:
    """`lower_scan`'s program and ``(argument bytes, output bytes)`` per device: its inputs,
    and the gradients of the floating-point ones."""
    invars = info.jaxpr.jaxpr.invars
    nc, nk = info.num_consts, info.num_carry
    specs = [_spec(v.aval) for v in invars]
    consts, init = specs[:nc], specs[nc : nc + nk]
    xs = [jax.ShapeDtypeStruct((length, *s.shape), s.dtype) for s in specs[nc + nk :]]
    flat_in = [*consts, *init, *xs]
    diff = [jnp.issubdtype(s.dtype, jnp.inexact) for s in flat_in]
    d_specs = [s for s, d in zip(flat_in, diff, strict=True) if d]
    o_specs = [s for s, d in zip(flat_in, diff, strict=True) if not d]
    avals = info.jaxpr.out_avals  # the body's: carried values, then one step's outputs
    outs = [_spec(a) for a in avals[:nk]]
    outs += [jax.ShapeDtypeStruct((length, *a.shape), a.dtype) for a in avals[nk:]]
    ct_specs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
    if isinstance(device, ScanPlacement):  # a sharded step: placed as in the step
        d_specs, o_specs, ct_specs = _placed(device, info, flat_in, outs, diff)
    elif device is not None:  # every input on the step's device: the same compiler as the step
        on = jax.sharding.SingleDeviceSharding(device)
        d_specs, o_specs, ct_specs = (
            [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on) for s in specs_]
            for specs_ in (d_specs, o_specs, ct_specs)
        )
    if _derivable(choice):  # the body traced once: only the policy differs between save sets
        forward = _forward(info, length, d_specs, o_specs, diff)
        merged = jcore.jaxpr_as_fun(_with_policy(forward, choice.policy()))
    else:
        run = scan_program(info, choice, length)
        merged = functools.partial(_merged, run, diff, nc, nk)

    # A last layer alone in its run is no loop (XLA removes a loop of one step), and its
    # backward pass could start from the cotangent inputs before the forward loop runs,
    # which the step cannot (its cotangents come from the loss): they are given once the
    # forward pass is done, so that the program's loop phases are read (`loop_phases`).
    tied = choice is not None and lone_last(choice.pattern)

    def program(d_in, o_in, ct):
        ct = [c if jnp.issubdtype(c.dtype, jnp.inexact) else None for c in ct]
        out, vjp = jax.vjp(lambda d: merged(*d, *o_in), d_in)
        if tied:
            ct = after(ct, [c is not None for c in ct], out)
        return vjp([_zero_if_none(c, o) for c, o in zip(ct, outs, strict=True)])

    grads = sum(per_device_bytes(s) for s in d_specs)
    io = (grads + sum(per_device_bytes(s) for s in (*o_specs, *ct_specs)), grads)
    return jax.jit(program).lower(d_specs, o_specs, ct_specs), io


def _merged(run, diff, nc, nk, *ins) -> list[Any]:
    """The scan of ``run`` on its inputs given as the floating-point ones, then the others
    (``diff`` says which each input is): its carried values, then its outputs."""
    n = sum(diff)
    it_d, it_o = iter(ins[:n]), iter(ins[n:])
    full = [next(it_d) if d else next(it_o) for d in diff]
    carry, ys = run(full[:nc], full[nc : nc + nk], full[nc + nk :])
    return [*carry, *ys]


# The policy a scan's body is traced with once (`_forward`): replaced by each save set's.
_PLACEHOLDER = jax.checkpoint_policies.save_only_these_names()
# Scans whose forward program is kept (`_forward`), the most recent last.
_FORWARDS: collections.OrderedDict[Any, tuple[Any, Any]] = collections.OrderedDict()
FORWARDS = 4
_FORWARDS_LOCK = threading.Lock()


class _Placeholder(ScanChoice):
    """A ``per_step`` choice whose checkpoint's policy is `_PLACEHOLDER` (`_forward`)."""

    def policy(self) -> Any:
        return _PLACEHOLDER


def _derivable(choice: ScanChoice | None) -> bool:
    """Whether ``choice``'s scan-alone program is the scan's forward program traced once
    (`_forward`) with its policy in place of the placeholder's: a ``per_step`` scan that
    saves one set of names in every step, traced outside `remat._trace._taps.tapped` (a tap
    changes the body's values)."""
    return (
        not tapping()
        and choice is not None
        and choice.names is not None
        and choice.schedule == "per_step"
        and not choice.pattern
    )


def _forward(info: ScanInfo, length: int, d_specs, o_specs, diff) -> Any:
    """The forward program of the scan at ``info`` alone (`_merged`, ``length`` steps, its
    body checkpointed with `_PLACEHOLDER`) as a `ClosedJaxpr` of ``(*d_specs, *o_specs)``,
    traced once per scan and inputs (the last `FORWARDS` are kept). A save set's program is
    this one with its policy put in (`_with_policy`): tracing the body with each policy
    gives the same program (`tests/_plan/test_body.py` compares them)."""
    key = (id(info.jaxpr), info.position, info.reverse, length, tuple(d_specs), tuple(o_specs))
    with _FORWARDS_LOCK:  # `_mixes` lowers on a thread of its own
        kept = _FORWARDS.get(key)
        if kept is not None and kept[0] is info.jaxpr:
            _FORWARDS.move_to_end(key)
            return kept[1]
    run = scan_program(info, _Placeholder(names=()), length)
    merged = functools.partial(_merged, run, diff, info.num_consts, info.num_carry)
    forward = jax.make_jaxpr(merged)(*d_specs, *o_specs)
    with _FORWARDS_LOCK:
        _FORWARDS[key] = (info.jaxpr, forward)  # the body kept: its id stays its own
        while len(_FORWARDS) > FORWARDS:
            _FORWARDS.popitem(last=False)
    return forward


def _with_policy(closed: Any, policy: Any) -> Any:
    """``closed`` with each checkpoint whose policy is `_PLACEHOLDER` given ``policy``."""
    jaxpr = closed.jaxpr
    placeholders = [
        site
        for site in walk.sites(jaxpr)
        if site.primitive == walk.CHECKPOINT and site.eqn.params["policy"] is _PLACEHOLDER
    ]
    if not placeholders:  # the save set would be lost: its program would save nothing
        raise AssertionError("the scan's forward program has no placeholder checkpoint")
    for site in placeholders:  # replacing an equation leaves every site's path as it was
        jaxpr = walk.replace_eqn(
            jaxpr, site, lambda e: e.replace(params={**e.params, "policy": policy})
        )
    return jcore.ClosedJaxpr(jaxpr, closed.consts)


def _placed(placement, info, flat_in, outs, diff):
    """The scan-alone program's inputs and cotangents placed on the step's mesh as the scan's
    values are in the step (`remat._shard._scan_shardings`)."""
    shardings = placement.of(info.position)
    nc, nk = info.num_consts, info.num_carry
    ins = [s if i < nc + nk else stacked(s) for i, s in enumerate(shardings.inputs)]
    cts = [s if i < nk else stacked(s) for i, s in enumerate(shardings.outputs)]
    placed = [on_mesh(spec, s) for spec, s in zip(flat_in, ins, strict=True)]
    d_specs = [s for s, d in zip(placed, diff, strict=True) if d]
    o_specs = [s for s, d in zip(placed, diff, strict=True) if not d]
    ct_specs = [
        on_mesh(jax.ShapeDtypeStruct(o.shape, o.dtype), s) for o, s in zip(outs, cts, strict=True)
    ]
    return d_specs, o_specs, ct_specs


def _zero_if_none(c: Any, out: Any) -> Any:
    if c is not None:
        return c
    return jnp.zeros(out.shape, jax.dtypes.float0)
