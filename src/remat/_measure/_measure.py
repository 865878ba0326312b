"""`remat.measure`: what one compiled gradient step keeps and costs, read from the compiled program.

Three things that users of `jax.checkpoint` cannot easily see are measured here:

- memory, from XLA's compiled memory analysis (exact and deterministic);
- FLOPs with loop trip counts, from the optimised HLO (`remat._measure._hlo`), because
  ``compiled.cost_analysis()`` counts a loop body once;
- whether the recomputation a checkpoint asks for survived compilation: XLA may undo it (on the
  CPU backend it expands the optimisation barriers of `jax.checkpoint` before common-subexpression
  elimination, so a checkpoint outside a loop is removed; other backends may merge the
  recomputation with the forward pass by CSE). `measure` compiles the program's plain twin and
  compares matmul FLOPs.
"""

from __future__ import annotations

import collections
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._core._dtypes import dtype_of
from .._core._errors import brief
from .._core._offload import compiling_for
from .._core._strategy import as_strategy
from .._core._warnings import RematWarning
from .._shard._sharding import num_devices
from .._shard._target import as_target, check_repeats, compile_device
from .._trace._checkpoints import (
    checkpoint_in_loop,
    checkpoint_sites,
    recompute_requested,
    strip_checkpoints,
    traced_dot_flops,
)
from .._trace._eqx import with_modules_split
from ._checks import _check_args, _check_scalar
from ._hbm import compile_measured
from ._hlo import hlo_flops
from ._measurement import SAVES_NOTHING_FRACTION, Measurement, Timing
from ._peak import compiled_memory, compiled_platform, peak_bytes
from ._refusal import refusal_of
from ._residuals import saved_residuals
from ._step import ANALYSIS_OPTIONS, Step, as_step, grad_step, loss_of, lower_step, time_step

_NOT_CALLABLE = "`remat.measure` got fn={got}, which is not callable; pass the loss function."
_BAD_REPEATS = "`remat.measure` got repeats={got!r}; pass an int >= 0 (0 skips timing)."
_ELIMINATED = (
    "`remat.measure`: the checkpoints in {name} ask for recomputation, but the compiled program "
    "contains none (its matmul FLOPs, {flops:.4g}, are not above those of the program without "
    "checkpoints, {plain:.4g}), so they save no memory (compiled peak {peak:.2f} MiB, "
    "{plain_peak:.2f} MiB without checkpoints). {cause} Fix: put the layers in a "
    "`jax.lax.scan` (or `flax.linen.scan` / `nnx.scan`) and checkpoint the scan body, e.g. "
    "with `remat.apply(fn, strategy)`; inside a loop, the recomputation survives compilation."
)
_WORSE_THAN_WRITTEN = (
    "`remat.measure`: strategy {strategy!r} raises the compiled peak of {name} from "
    "{written:.2f} MiB as written (the program checkpoints already: {sites}) to {peak:.2f} "
    "MiB. Keep the program as written, or try another strategy or `remat.plan(fn, *args, "
    "budget=...)`, which plans against the program as written."
)
_SAVES_NOTHING = (
    "`remat.measure`: the checkpoints in {name} recompute, but the compiled peak, {peak:.2f} MiB, "
    "is not 2% below the {plain:.2f} MiB of the same program without checkpoints: they add "
    "work and save no memory. {why}"
)
_WHY_OUTSIDE_LOOP = (
    "Outside a loop XLA is free to schedule every recomputation early, so the recomputed values "
    "live as long as the originals. Fix: put the layers in a `jax.lax.scan` (or "
    "`flax.linen.scan` / `nnx.scan`) and checkpoint the scan body, e.g. with "
    "`remat.apply(fn, strategy)`."
)
_WHY_IN_LOOP = (
    "The checkpoints are inside a loop, where the recomputation survives compilation, but what "
    "they keep out of memory is small next to what else is live at the peak (parameters, "
    "gradients, the loss head, the inputs): `remat.memory(fn, *args, strategy=...)` shows "
    "what fills it. Checkpointing pays where the layers' activations are larger (a longer "
    "sequence, a larger batch)."
)
_WHY_TPU = (
    "On TPU the peak is the chip's HBM: the values the checkpoints save from may be kept in "
    "on-chip VMEM (128 MiB on a v5e), which costs no HBM, or be smaller than what else is live "
    "at the peak (see docs/tpu.md). Checkpointing pays on TPU where the saved values are larger "
    "than that: a longer or wider step; `remat.plan` chooses what to save by the compiled peak."
)
_CAUSE_CPU = (
    "Cause: on the CPU backend XLA expands the optimisation barriers of `jax.checkpoint` before "
    "common-subexpression elimination, which then merges the recomputation with the forward "
    "pass wherever the checkpoint is not inside a loop."
)
_CAUSE_OTHER = (
    "Cause: XLA's common-subexpression elimination merged the recomputation with the forward "
    "pass (a checkpoint outside a loop is not protected from it)."
)

# Compiled (FLOPs, peak bytes) of plain gradient steps and FLOPs of forward passes, so that
# measuring several strategies of one function (as `remat.compare` does) compiles the plain twin
# and the forward pass once. Keyed by the function object, what was compiled ("forward" or argnums), the
# backend and the arguments' structure, shapes and dtypes; a few entries.
_FLOPS_MEMO: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
_MEMO_SIZE = 16


def _memo_key(fn: Any, argnums: Any, args: Sequence[Any]) -> tuple[Any, ...] | None:
    leaves, treedef = jax.tree_util.tree_flatten(args)
    # Shardings too: the same shapes compile differently on a mesh, or for a `remat.Target`.
    avals = tuple(
        (tuple(np.shape(x)), str(dtype_of(x)), str(getattr(x, "sharding", None))) for x in leaves
    )
    key = (fn, argnums, jax.default_backend(), treedef, avals)
    try:
        hash(key)
    except TypeError:  # an unhashable callable: not remembered
        return None
    return key


def _remember(key: tuple[Any, ...] | None, flops: Any) -> None:
    if key is None:
        return
    _FLOPS_MEMO[key] = flops
    _FLOPS_MEMO.move_to_end(key)
    while len(_FLOPS_MEMO) > _MEMO_SIZE:
        _FLOPS_MEMO.popitem(last=False)


### Memory


def measure_compiled(compiled: Any) -> dict[str, Any]:
    """Memory of a compiled program, from XLA's compiled memory analysis.

    The figures come from `remat._measure._peak.compiled_memory`, the one peak function every part of
    remat uses; its docstring says which figure each backend's peak is.

    Args:
      compiled: a `jax.stages.Compiled`, e.g. ``jax.jit(f).lower(*args).compile()``.

    Returns:
      A dict with ``peak_bytes``, ``peak_source``, ``temp_bytes``, ``argument_bytes``,
      ``output_bytes`` and ``alias_bytes``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._measure import measure_compiled
      >>> m = measure_compiled(jax.jit(jnp.sin).lower(jnp.ones(256)).compile())
      >>> m["argument_bytes"], m["output_bytes"]
      (1024, 1024)
    """
    return compiled_memory(compiled).as_dict()


def time_compiled(compiled: Callable[..., Any], args: Sequence[Any], repeats: int) -> Timing:
    """Wall-clock seconds of ``repeats`` runs of ``compiled(*args)`` after one warm-up run.

    Every run ends with `jax.block_until_ready`, so asynchronous dispatch is not mistaken
    for speed.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._measure import time_compiled
      >>> t = time_compiled(jax.jit(jnp.sin).lower(1.0).compile(), (1.0,), repeats=3)
      >>> t.repeats, t.min <= t.median <= t.max
      (3, True)
    """
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return Timing(median=statistics.median(times), min=min(times), max=max(times), repeats=repeats)


def build_measurement(
    compiled: Any,
    *,
    residuals: Sequence[Any],
    flops: float,
    forward_flops: float,
    compile_seconds: float,
    strategy: str,
    recompute_requested: bool,
    recompute_eliminated: bool = False,
    seconds: Timing | None = None,
    plain_flops: float | None = None,
    plain_peak_bytes: int | None = None,
    scans: tuple[int, int] = (0, 0),
) -> Measurement:
    """The one place a `remat.Measurement` is made from a compiled step: its memory
    (`measure_compiled`), backend and devices read from ``compiled``, the rest given."""
    return Measurement(
        **measure_compiled(compiled),
        residuals=tuple(residuals),
        residual_bytes=sum(r.total_bytes for r in residuals),
        flops=flops,
        forward_flops=forward_flops,
        recompute_requested=recompute_requested,
        recompute_eliminated=recompute_eliminated,
        compile_seconds=compile_seconds,
        seconds=seconds,
        strategy=strategy,
        backend=compiled_platform(compiled),
        num_devices=num_devices(compiled),
        plain_flops=plain_flops,
        plain_peak_bytes=plain_peak_bytes,
        scans_applied=scans[0],
        scans_as_written=scans[1],
    )


### Main API


def measure(
    fn: Callable[..., Any],
    *args: Any,
    argnums: int | Sequence[int] = 0,
    strategy: Any = None,
    repeats: int | None = None,
    has_aux: bool = False,
    optimizer: Any = None,
    roll: bool = True,
    override: bool = False,
    target: Any = None,
) -> Measurement:
    """Compiles ``jax.value_and_grad(fn, argnums)`` with `jax.jit` and measures it.

    Memory comes from XLA's compiled memory analysis; residuals from the traced program (what
    autodiff keeps for the backward pass, each with its multiplicity: a value kept at every
    step of a scan of length ``N`` counts ``N`` times, nested scans multiply); FLOPs from the
    optimised HLO, counting every matmul (``dot``) and convolution, multiplied by the trip
    counts of the loops around it. **Elementwise work is not counted** in ``flops`` or
    ``forward_flops``. ``forward_flops`` is the same count for ``jax.jit(fn)`` alone (a
    checkpoint changes nothing in a pass without a backward pass).

    ``recompute_requested`` is True when a `jax.checkpoint` in the traced program has a
    policy that does not save everything. ``recompute_eliminated`` is True when, moreover,
    the traced gradient asks to recompute matmuls (it has more matmul FLOPs than the plain
    twin, the program without checkpoints), but the compiled gradient does not have more
    matmul FLOPs than the compiled plain twin: XLA undid the checkpoint, and `measure`
    warns. Recomputation of elementwise work only is not judged.

    Args:
      fn: a function returning a scalar (the loss).
      *args: its arguments: arrays or pytrees of arrays. With ``repeats=0`` they may be
        `jax.ShapeDtypeStruct` s: the step is compiled and measured but never run, so
        programs too large to run here can still be measured.
      argnums: which positional arguments to differentiate, as in `jax.grad`.
      strategy: if not None, measure ``remat.apply(fn, strategy)`` instead of ``fn`` (any
        strategy `remat.apply` takes). None measures ``fn`` as written.
      repeats: timed runs after one warm-up run; 0 skips timing (``seconds=None``).
        Default 5, and 0 with a ``target`` (which is compiled for, never run). With 0 the
        step is compiled as the planner compiles (LLVM's optimisation off: the same memory
        analysis and HLO in less time), so ``compile_seconds`` is that compile's. With an
        ``optimizer`` the timed runs step copies of the parameters (the step donates them,
        and the caller's stay usable): the device holds the parameters once more than the
        step's peak while timing (0.71 GiB on the mid-size decoder of
        ``benchmarks/gpu_bench.py``), so time a model that fills the device in your own loop.
      has_aux: ``fn`` returns ``(loss, aux)``, as in `jax.value_and_grad`; the aux is an
        output of the measured step.
      optimizer: an optax ``GradientTransformation``: measure the whole training step
        (value and gradient, ``optimizer.update``, ``optax.apply_updates``) with the
        parameters ``args[argnums]`` and the optimizer state donated, as a training loop
        runs it (see `remat._measure._step`); ``argnums`` must then be one int. The
        optimizer state is made with ``optimizer.init`` (abstractly unless timed).
      roll: with a strategy, roll the repeated layers outside the program's scans into scans
        first, as `remat.apply` does (False: apply it to the program as written). The
        plain twin that the measurement is compared with is ``fn`` as written.
      override: passed to `remat.apply`: False keeps the program's own checkpoints (a scan
        that checkpoints already is left as written), True replaces them by the strategy.

    Returns:
      A `remat.Measurement`.

    Raises:
      TypeError: if ``fn`` is not callable, an argument is not an array, or a
        differentiated argument is not floating point.
      ValueError: if ``fn`` does not return a real scalar, for bad ``argnums`` or
        ``repeats``, or for an unknown strategy.

    Warns:
      RematWarning: when the compiled program undid the recomputation that the traced
        program asked for (``recompute_eliminated``); and when ``fn`` checkpoints already
        and the strategy's compiled peak is above ``fn``'s as written (both figures given;
        ``fn`` is compiled once more for it, unless it was already).

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(ws, x):
      ...     x, _ = jax.lax.scan(lambda y, w: (jnp.tanh(y @ w), None), x, ws)
      ...     return x.sum()
      >>> ws, x = jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8))
      >>> m = remat.measure(loss, ws, x, strategy="full", repeats=0)
      >>> m.forward_flops, m.flops  # 4 layers * 2*2*8*8; the gradient with recompute is 4x
      (1024.0, 4096.0)
      >>> [(r.shape, r.multiplicity) for r in m.residuals if r.primitive != "argument"]
      [((2, 8), 4)]
    """
    if not callable(fn):
        raise TypeError(_NOT_CALLABLE.format(got=brief(fn)))
    compile_target = as_target(target, "remat.measure")
    repeats = check_repeats(compile_target, repeats, "remat.measure")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 0:
        raise ValueError(_BAD_REPEATS.format(got=repeats))
    fn, args = with_modules_split(fn, args)  # Equinox modules: arrays traced, the rest static
    argnums_t = _check_args(args, argnums, repeats)
    argnums = argnums if isinstance(argnums, int) else argnums_t
    if compile_target is not None:
        args = compile_target.place(args, argnums_t, "remat.measure")
    spec = as_step(Step(argnums, bool(has_aux), optimizer))
    with compiling_for(compile_device(args)):  # "offload:..." checked against the target
        return _measure_step(fn, args, argnums, spec, strategy, roll, override, repeats)


def _measure_step(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    argnums: Any,
    spec: Step,
    strategy: Any,
    roll: bool,
    override: bool,
    repeats: int,
) -> Measurement:
    """`measure` on arguments already placed (and checked): compile, read, warn."""
    scans = (0, 0)
    if strategy is None:
        target, plain, label = fn, None, "none"
    else:
        from .._trace._apply import apply, counted_scans

        strategy_obj = as_strategy(strategy, "remat.measure")
        target = apply(fn, strategy_obj, roll=roll, override=override)
        plain, label = fn, strategy_obj.name
    traced_target = _check_scalar(target, args, spec.has_aux).jaxpr  # `target` at `args`
    if strategy is not None:  # how many of its scans the strategy left as written
        scans = counted_scans(fn, target) or (0, 0)

    step = grad_step(target, spec)
    start = time.perf_counter()
    # Run only when timed: otherwise compiled as the planner compiles (`ANALYSIS_OPTIONS`).
    lowered = lower_step(target, args, spec)
    compiled = compile_measured(lowered, ANALYSIS_OPTIONS if repeats == 0 else None)
    compile_seconds = time.perf_counter() - start
    memory = measure_compiled(compiled)
    flops = hlo_flops(compiled.as_text())
    # Checkpoints change nothing in a pass without a backward pass, so the forward FLOPs of
    # any strategy are those of `fn` itself.
    forward_key = _memo_key(fn, "forward", args)
    forward_flops = _FLOPS_MEMO.get(forward_key) if forward_key is not None else None
    if forward_flops is None:
        lowered = jax.jit(fn).lower(*args)  # a TPU target's: outside the persistent cache
        forward_flops = hlo_flops(compile_measured(lowered, ANALYSIS_OPTIONS).as_text())
        _remember(forward_key, forward_flops)
    residuals = saved_residuals(loss_of(target, spec), *args, argnums=argnums)

    requested = recompute_requested(traced_target)
    eliminated, plain_flops, plain_peak = False, None, None
    if not requested:
        _remember(_memo_key(target, spec, args), (flops, memory["peak_bytes"]))
    else:
        # The same program without any checkpoint: `fn` itself under a strategy, unless `fn`
        # checkpoints already (its own checkpoints, kept or not, are no part of that twin).
        source = target if plain is None else fn
        key = _memo_key(source, spec, args)
        if plain is None or recompute_requested(jax.make_jaxpr(fn)(*args).jaxpr):
            plain, key = strip_checkpoints(source), key and (*key, "stripped")
        plain_step = grad_step(plain, spec)
        remembered = _FLOPS_MEMO.get(key) if key is not None else None
        if remembered is None:
            remembered = _plain_twin(plain, args, spec)
            _remember(key, remembered)
        plain_flops, plain_peak = remembered
        if plain_flops is not None:
            traced = traced_dot_flops(jax.make_jaxpr(step)(*args).jaxpr)
            traced_plain = traced_dot_flops(jax.make_jaxpr(plain_step)(*args).jaxpr)
            eliminated = traced > traced_plain and flops <= plain_flops
    backend = compiled_platform(compiled)
    name = f"`{getattr(fn, '__qualname__', repr(fn))}`"
    if eliminated:
        cause = _CAUSE_CPU if backend == "cpu" else _CAUSE_OTHER
        warnings.warn(
            _ELIMINATED.format(
                name=name,
                flops=flops,
                plain=plain_flops,
                cause=cause,
                peak=memory["peak_bytes"] / 2**20,
                plain_peak=plain_peak / 2**20,
            ),
            RematWarning,
            stacklevel=3,
        )
    elif (
        plain_peak is not None
        and flops > plain_flops
        and memory["peak_bytes"] > SAVES_NOTHING_FRACTION * plain_peak
    ):
        warnings.warn(
            _SAVES_NOTHING.format(
                name=name,
                peak=memory["peak_bytes"] / 2**20,
                plain=plain_peak / 2**20,
                why=_WHY_TPU
                if backend == "tpu"
                else _WHY_IN_LOOP
                if checkpoint_in_loop(traced_target)
                else _WHY_OUTSIDE_LOOP,
            ),
            RematWarning,
            stacklevel=3,
        )

    if strategy is not None:  # `plain_peak` is the peak as written only where `fn` is plain
        written_peak = plain_peak if plain is fn else None
        _warn_if_worse(fn, args, spec, memory["peak_bytes"], written_peak, label, name)
    seconds = time_step(compiled, args, spec, repeats) if repeats > 0 else None
    return build_measurement(
        compiled,
        residuals=residuals,
        flops=flops,
        forward_flops=forward_flops,
        recompute_requested=requested,
        recompute_eliminated=eliminated,
        compile_seconds=compile_seconds,
        seconds=seconds,
        strategy=label,
        plain_flops=plain_flops,
        plain_peak_bytes=plain_peak,
        scans=scans,
    )


def _plain_twin(plain: Any, args: Sequence[Any], spec: Any) -> tuple[float | None, int | None]:
    """(FLOPs, peak) of the program without checkpoints; (None, None) where the compiler
    refuses it for memory (a TPU target: the checkpointed step fits, the plain one does not)."""
    try:
        compiled_plain = compile_measured(lower_step(plain, args, spec), ANALYSIS_OPTIONS)
    except jax.errors.JaxRuntimeError as err:
        if refusal_of(err) is None:
            raise
        return None, None
    return hlo_flops(compiled_plain.as_text()), peak_bytes(compiled_plain)


def _warn_if_worse(fn, args, spec, peak: int, written_peak, label: str, name: str) -> None:
    """Warns when a strategy's peak is above that of a program that checkpoints already."""
    sites = checkpoint_sites(jax.make_jaxpr(fn)(*args).jaxpr)
    if not sites:
        return
    if written_peak is None:
        key = _memo_key(fn, spec, args)
        remembered = _FLOPS_MEMO.get(key) if key is not None else None
        if remembered is None:
            remembered = _plain_twin(fn, args, spec)
            _remember(key, remembered)
        written_peak = remembered[1]
        if written_peak is None:  # refused by the compiler: any peak that compiles is lower
            return
    if peak > written_peak:
        message = _WORSE_THAN_WRITTEN.format(
            strategy=label, name=name, written=written_peak / 2**20, peak=peak / 2**20,
            sites="; ".join(str(s) for s in sites),
        )  # fmt: skip
        warnings.warn(message, RematWarning, stacklevel=4)
