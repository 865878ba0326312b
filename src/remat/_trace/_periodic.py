"""Different save sets in different layers of one scan, without slicing its stacked inputs.

A scan of ``L`` steps whose layer ``i`` saves ``pattern[i % g]`` runs as a scan of ``L / g``
groups whose body runs the ``g`` layers of a group one after another, each checkpointed with
its own ``save_only_these_names`` policy. The scanned inputs are reshaped from ``(L, ...)`` to
``(L / g, g, ...)``, and the stacked outputs back: both are bitcasts of contiguous arrays, so
XLA copies nothing. With the same save set at every position the compiled peak exceeds the
uniform scan's by the parameter gradients of ``g - 1`` layers (a position's gradients live
until the group is differentiated), the same at any ``L``: `tests/_trace/test_periodic.py`
checks it. The positions of a group are made to recompute one at a time (`ordered`). This
is torchtitan's "checkpoint every Nth block" generalised to any save set per position.

``g`` divides ``L``. With ``g = L`` (a save set per layer) the layers run as segments
(`segments`): one scan per run of consecutive layers saving the same set, each over its
layers' indices, the stacked inputs passed whole and indexed inside each layer's checkpoint
(so nothing is sliced or copied, and each scan stores only its own layers' values). Any
``k`` of ``L`` layers can then save one set and the others another (3 of 8, 7 of 8, which no
shorter period gives), with one loop body per run, not one per layer: on the GPT of
`benchmarks/vs_torch.py` (8 layers, 5 saving one set and 3 another) the step compiled in
1.68x the plain scan's time, groups of 2 layers in 1.51x (`benchmarks/perlayer_bench.py`
compares the forms, under load). The first layer of each run keeps the run's input carry
itself, the others theirs in a stack per run, so the scan's initial carry is not copied (the
plain scan stacks it with the others): with the same set in every layer the peak is one carry
under the plain scan's, within 4.2 KiB, on the tests' MLP stack, whose initial carry is the
step's argument (`tests/_trace/test_periodic.py`), and on that GPT 0.20 MiB under it with
every layer saving 5 MiB (67.69 against 67.89 MiB) and 0.52 MiB over it with every value
saved (83.68 against 83.16 MiB). Each layer's parameter gradients are written once into one
buffer, not added to what it held, and each layer's recomputation waits for its cotangent
(`_after`; without it, read with `remat.memory`, three recomputed attention scores of 2 MiB
were live at the GPT's peak where the plain scan's has one). The positions saving less come first: their
recomputation runs last in the backward pass, when fewer saved values are live.

The other forms measured copy or keep more: a remainder scan over the last ``L mod g``
layers scanning slices of the stacked inputs needs each parameter stack sliced into two
arrays (a copy of each: 7.8 MiB on the demo GPT; `segments` indexes the whole stack
instead), and choosing the save set inside one scan step with `jax.lax.switch` on the
layer index keeps the residuals of every branch at every step (JAX's ``cond`` saves the
union of its branches' residuals).

A group body of a shorter period holds ``g`` copies of the layer, so its compile time grows
with ``g``: periods stop at `MAX_PERIOD`. The planner offers segments only
(`remat._plan._perlayer`); shorter periods run the patterns a plan file or a user gives. The
positions' custom VJP of a group (`ordered`) supports reverse-mode differentiation only, as
a checkpointed training step needs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._taps import tapping
from ._traced import zeros_varying
from ._vjp_order import after as _after
from ._vjp_order import cotangents, custom_loop
from ._vjp_order import floating as _floating
from ._vjp_order import tie_one as _tie_one

# The largest period offered: the group body holds this many copies of the layer.
MAX_PERIOD = 8
# True: a save set per layer whose sets nest runs in one loop each way
# (`remat._trace._one_loop`: fewer loop bodies to compile, a higher peak); False, the
# planner's form: `segments` (`benchmarks/perlayer_compile.py` compares the two).
ONE_LOOP = False

Body = Callable[[Sequence[Any], Sequence[Any], Sequence[Any]], tuple[list[Any], list[Any]]]


@dataclasses.dataclass(frozen=True)
class Period:
    """The schedule of a per-layer candidate: ``per_step`` with ``g`` save sets, step ``i``
    saving the ``(i % g)``-th (the planner's internal form; a plan's scan records it as
    ``schedule="per_step"`` with a ``pattern``)."""

    g: int


def periods(length: int, most: int = MAX_PERIOD) -> tuple[int, ...]:
    """The periods a scan of ``length`` steps can be given: the divisors 2..``most`` of it
    (``length`` itself: one group, no loop).

    Example:
      >>> from remat._trace._periodic import periods
      >>> periods(8), periods(6), periods(7), periods(16)
      ((2, 4, 8), (2, 3, 6), (7,), (2, 4, 8))
    """
    return tuple(g for g in range(2, most + 1) if length % g == 0)


def policies(pattern: Sequence[Sequence[str]]) -> tuple[Any, ...]:
    """One `jax.checkpoint` policy per position: save exactly that position's names."""
    return tuple(jax.checkpoint_policies.save_only_these_names(*names) for names in pattern)


def ordered(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step(consts, carry, gx)`` with its backward pass held until its cotangent arrives.

    The positions of a group are not loops of their own, so nothing orders their
    recomputations in the group's backward pass, and XLA ran them all first: every
    position's recomputed values live at once (on the demo GPT, a group of 2 layers saving
    the same values as the uniform scan peaked 16 MiB higher, one of 4 layers 49 MiB). Here
    each residual that is not a parameter (``consts``, ``gx``) is made to depend on the
    incoming cotangent (plus zero times a bounded scalar of it, which XLA does not fold), so
    a position recomputes only once the position after it is differentiated.
    """
    inputs: dict[str, tuple[bool, ...]] = {}

    @jax.custom_vjp
    def run(consts, carry, gx):
        return step(consts, carry, gx)

    def fwd(consts, carry, gx):
        out, vjp = jax.vjp(step, consts, carry, gx)
        params = {id(x) for x in jax.tree.leaves((consts, gx))}
        inputs["params"] = tuple(id(x) in params for x in jax.tree.leaves(vjp))
        return out, vjp

    def bwd(vjp, ct):
        leaves, tree = jax.tree.flatten(vjp)
        leaves = _after(leaves, [not param for param in inputs["params"]], ct)
        return jax.tree.unflatten(tree, leaves)(ct)

    run.defvjp(fwd, bwd)
    return run


def periodic_loop(
    body: Body,
    pattern: Sequence[Sequence[str]],
    consts: Sequence[Any],
    init: Sequence[Any],
    xs: Sequence[Any],
    length: int,
    reverse: bool = False,
    head: Callable[..., Sequence[Any]] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Runs ``body`` for ``length`` steps, step ``i`` checkpointed to save ``pattern[i % g]``.

    Args:
      body: ``body(consts, carry, x) -> (new_carry, ys)``, every value it should be able to
        save tagged with `jax.ad_checkpoint.checkpoint_name`.
      pattern: the names each position saves; ``g = len(pattern)`` divides ``length``.
      consts, init, xs: the scan's loop-invariant inputs, initial carry and scanned inputs
        (flat lists of arrays, ``xs`` stacked along their first axis).
      length: the number of steps.
      reverse: run the steps last to first, as `jax.lax.scan` does.
      head: with a save set per layer (``g == length``), ``init`` is this function's inputs
        and it computes the initial carry, again in the backward pass (see `segments`).

    Returns:
      ``(carry, ys)`` as `jax.lax.scan` returns them for the same body.

    Raises:
      ValueError: if ``len(pattern)`` does not divide ``length``.
    """
    g = len(pattern)
    if g < 1 or length % g:
        raise ValueError(
            f"`remat._trace._periodic.periodic_loop` got a pattern of {g} positions for a scan "
            f"of {length} steps; the period must divide the length (one of "
            f"{[d for d in range(1, length + 1) if length % d == 0]})."
        )

    # Each position's checkpoint takes the whole group's inputs and slices its own inside:
    # a slice taken outside would be a residual of the group step, a stacked copy of the
    # parameters, where the group's inputs themselves are the scan's and are not copied.
    def at(k):
        return lambda consts, carry, gx: body(consts, carry, [x[k] for x in gx])

    steps = [
        ordered(jax.checkpoint(at(k), policy=policy, prevent_cse=False))
        for k, policy in enumerate(policies(pattern))
    ]
    grouped = [jnp.reshape(x, (length // g, g, *x.shape[1:])) for x in xs]

    def group(carry, gx):
        carry = list(carry)
        outs: list[Any] = [None] * g
        for k in reversed(range(g)) if reverse else range(g):
            carry, outs[k] = steps[k](consts, carry, gx)
            carry = list(carry)
        ys = [jnp.stack([outs[k][j] for k in range(g)]) for j in range(len(outs[0]))]
        return carry, ys

    if g == length:  # a save set per layer: one loop if the sets nest, else a scan per run
        from ._one_loop import one_loop

        out = one_loop(body, pattern, consts, init, xs, reverse, head) if ONE_LOOP else None
        return segments(body, pattern, consts, init, xs, reverse, head) if out is None else out
    if head is not None:
        init = head(*init)
    carry, ys = jax.lax.scan(group, list(init), grouped, length=length // g, reverse=reverse)
    return list(carry), [jnp.reshape(y, (length, *y.shape[2:])) for y in ys]


# `_layer`'s checkpointed layers, the most recent last: (id(body), names, lone) -> (body, layer).
_LAYERS: dict[tuple[int, tuple[str, ...], bool], tuple[Any, Any]] = {}
# The most layers `_layer` keeps (each holds its body, and JAX's traces of it).
MOST_LAYERS = 32


def _layer(body: Body, names: tuple[str, ...], lone: bool) -> Callable[..., Any]:
    """``body`` as `segments` runs one layer of a run saving ``names`` (``lone``: a run of
    one layer), checkpointed: the same function each time for one body and save set, so that
    JAX's caches of its traces (the layer's jaxpr, its partial evaluation and transpose for
    the policy) serve every program that runs it. The scan-alone programs of a scan's mixes
    (`remat._plan._body.scan_program`, one body per scan) share their save sets: on the
    vs_torch GPT at 25% four mixes of five sets lower in 31% less time. A body evaluated
    tapped (`remat._trace._taps`) gives other values: never kept then.

    Example:
      >>> from remat._trace._periodic import _layer
      >>> body = lambda consts, carry, x: (carry, [])
      >>> _layer(body, ("a",), False) is _layer(body, ("a",), False)
      True
      >>> _layer(body, ("a",), False) is _layer(body, ("b",), False)
      False
    """
    key = (id(body), names, lone)
    hit = _LAYERS.pop(key, None)
    if hit is not None and hit[0] is body and not tapping():
        _LAYERS[key] = hit
        return hit[1]
    layer = jax.checkpoint(
        lambda carry, consts, x: body(consts, carry, x),
        policy=jax.checkpoint_policies.save_only_these_names(*names),
        # XLA removes a loop of one step, and its CSE would then merge the layer's
        # recomputation with its forward pass (saving what the policy does not).
        prevent_cse=lone,
    )
    if not tapping():
        _LAYERS[key] = (body, layer)
        while len(_LAYERS) > MOST_LAYERS:
            del _LAYERS[next(iter(_LAYERS))]
    return layer


def runs(pattern: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of each run of consecutive positions saving the same names.

    Example:
      >>> from remat._trace._periodic import runs
      >>> runs([(), (), ("a",), ("a",), ("a",), ()])
      [(0, 2), (2, 5), (5, 6)]
    """
    out: list[tuple[int, int]] = []
    for i, names in enumerate(pattern):
        if out and tuple(pattern[out[-1][0]]) == tuple(names):
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def segments(
    body: Body,
    pattern: Sequence[Sequence[str]],
    consts,
    init,
    xs,
    reverse: bool = False,
    head: Callable[..., Sequence[Any]] | None = None,
) -> tuple[list[Any], list[Any]]:
    """`periodic_loop` with a save set per layer (as many as the scan's steps): a
    `jax.lax.scan` over the indices of each run of equal sets (`runs`), the layer
    checkpointed to save that run's names.

    Its custom VJP keeps, per run, the stacked values its layers save and their input
    carries; the stacked ``xs`` are kept whole, and each layer's slice of them is taken
    again in the backward pass (a slice kept would be a stacked copy of the parameters).
    The backward loops thread one gradient buffer of ``xs`` through all runs, each layer
    adding its slice in place (differentiating an indexed slice directly gives each loop a
    gradient of the whole stack of its own). Reverse-mode only, as `ordered`.

    Each run's first layer keeps the run's input carry itself; the others keep theirs in one
    stack per run (`_slot`). With ``head``, ``init`` is the inputs of ``head``, which computes
    the scan's initial carry from them: it is recomputed for the first layer's backward pass
    instead of kept (the code before a scan that makes its carry: `remat._trace._ends`).
    """
    spans = runs(pattern)
    layers = [_layer(body, tuple(pattern[start]), stop - start == 1) for start, stop in spans]
    order = list(reversed(range(len(spans)))) if reverse else list(range(len(spans)))
    meta: dict[int, Any] = {}  # per run: the VJP's tree and where each of its leaves comes from

    def forward(consts, init, xs, keep):
        if head is not None:
            init = head(*init)
        carry, parts, kept = list(init), {}, {}
        for r in order:
            start, stop = spans[r]
            first = stop - 1 if reverse else start  # the run's first layer run

            def step(state, i, r=r, start=start, stop=stop, first=first):
                carry, held = state
                x = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs]
                if not keep:
                    new, ys = layers[r](list(carry), consts, x)
                    return (list(new), held), (list(ys), [])
                (new, ys), vjp = jax.vjp(layers[r], list(carry), list(consts), x)
                leaves, tree = jax.tree.flatten(vjp)
                where = {id(v): ("const", k) for k, v in enumerate(consts)}
                where.update({id(v): ("x", k) for k, v in enumerate(x)})
                where.update({id(v): ("carry", k) for k, v in enumerate(carry)})
                origin = [where.get(id(v), ("saved", None)) for v in leaves]
                meta[r] = (tree, origin)
                saved = [v for v, (kind, _) in zip(leaves, origin, strict=True) if kind == "saved"]
                if held is None or stop - start == 1:  # no buffer: see `forward` below
                    return (list(new), held), (list(ys), saved)
                slot = _slot(i, start, first, reverse)
                held = [
                    jax.lax.dynamic_update_index_in_dim(b, carry[k], slot, 0)
                    for b, (_, k) in zip(held, _carried(origin), strict=True)
                ]  # fmt: skip
                return (list(new), held), (list(ys), saved)

            n = stop - start
            indices = jnp.arange(start, stop)
            held = None
            if keep:  # which carries the layer keeps: one abstract trace of a step
                jax.eval_shape(lambda c, i, r=r: step((c, None), i)[0][0], carry, indices[0])
                held = [_zeros((max(n - 1, 0), *carry[k].shape), carry[k])
                        for _, k in _carried(meta[r][1])]  # fmt: skip
            if keep and n == 1:  # a lone layer: no loop (see `layers`), its carry is ``carry``
                (new, _), (ys, saved) = step((carry, held), indices[0])
                if r != order[-1]:  # its backward pass is not next: written out
                    saved = _materialized(saved)
                parts[r] = [y[None] for y in ys]
                carry_in = None if head is not None and r == order[0] else list(carry)
                kept[r] = ([s[None] for s in saved], carry_in, held)
                carry = new
                continue
            carry_in = None if head is not None and r == order[0] else list(carry)
            (carry, held), (parts[r], saved) = jax.lax.scan(
                step, (carry, held), indices, reverse=reverse
            )
            kept[r] = (saved, carry_in, held)
        ys = [
            jnp.concatenate([parts[r][j] for r in range(len(spans))]) for j in range(len(parts[0]))
        ]
        return (list(carry), ys), kept

    def bwd(residuals, ct):
        consts, init, xs, kept = residuals
        ct_carry, ct_ys = ct
        head_vjp = None
        grads = [jnp.zeros_like(c) if _floating(c) else None for c in consts]
        xgrads = [jnp.zeros_like(x) if _floating(x) else None for x in xs]
        for r in reversed(order):
            start, stop = spans[r]
            tree, origin = meta[r]

            def back(state, inp, carry_in, held, r=r, tree=tree, origin=origin, start=start,
                     stop=stop):  # fmt: skip
                ct_c, grads, xgrads = state
                i, saved, ct_y = inp
                x = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs]
                carry = _carry_at(i, start, stop, reverse, carry_in, held, origin)
                it = iter(saved)
                sources = dict(const=consts, x=x, carry=carry)
                leaves = [next(it) if kind == "saved" else sources[kind][k]
                          for kind, k in origin]  # fmt: skip
                # Recompute once ``ct`` is here: with no loop (see `layers`) XLA would merge
                # the recomputation with the forward pass; in a loop, it overlapped the next
                # layer's (three attention scores live at once on the vs_torch GPT). In a
                # loop the input carry is enough to tie (what the recomputation starts from;
                # the same peaks, less code), else every leaf.
                tie = [kind == "carry" for kind, _ in origin]
                if stop - start == 1 or not any(tie):
                    tie = [kind != "const" for kind, _ in origin]
                leaves = _after(leaves, tie, ct_c)
                vjp = jax.tree.unflatten(tree, leaves)
                d_c, d_consts, d_x = vjp((list(ct_c), list(ct_y)))
                grads = [g if g is None else g + d for g, d in zip(grads, d_consts, strict=True)]
                xgrads = [
                    g if g is None else jax.lax.dynamic_update_index_in_dim(g, d, i, 0)
                    for g, d in zip(xgrads, d_x, strict=True)
                ]  # fmt: skip
                return (list(d_c), grads, xgrads), None

            saved, carry_in, held = kept[r]
            if carry_in is None:  # the initial carry: recomputed once the cotangent is here
                args = _tie_one(list(init), ct_carry)
                carry_in, head_vjp = jax.vjp(lambda *a: list(head(*a)), *args)
            back = functools.partial(back, carry_in=carry_in, held=held)
            ct_y = [y[start:stop] for y in ct_ys]
            (ct_carry, grads, xgrads), _ = jax.lax.scan(
                back,
                (list(ct_carry), grads, xgrads),
                (jnp.arange(start, stop), saved, ct_y),
                reverse=not reverse,
            )
        return cotangents(consts, grads, ct_carry, head_vjp, xs, xgrads)

    return custom_loop(forward, bwd, head, consts, init, xs)


def _materialized(values: list[Any]) -> list[Any]:
    """``values`` (a lone layer's saved values), written out as they are for its backward
    pass. With no loop between a lone layer's forward and backward passes, XLA fuses the
    elementwise code that makes a saved value into the backward pass's fusions that read it,
    and keeps that code's inputs alive to the end instead (CPU drops
    `jax.lax.optimization_barrier`): on the vs_torch GPT, 1 layer saving 2 values and 7 saving
    3 kept the embedding's output and a projection's (0.5 MiB each) through the whole
    backward pass for the first layer's residual sum. On CPU they go through a
    `jax.lax.cond` whose predicate is always true but not folded (a float is finite, NaN or
    infinite), and XLA does not fuse across it: that peak falls from 51.40 to 51.18 MiB.
    Elsewhere (GPU, TPU: a conditional there may wait on its predicate) the barrier stays.
    Not for the last run (its backward pass follows its forward pass at once: there, on the
    tests' toy decoder, writing them out raised the peak by one value's bytes)."""
    floats = [v for v in values if jnp.issubdtype(v.dtype, jnp.floating) and v.size]
    if not floats:
        return values
    if jax.default_backend() != "cpu":
        return list(jax.lax.optimization_barrier(list(values)))
    x = jnp.ravel(floats[0])[0]
    always = jnp.isfinite(x) | jnp.isnan(x) | jnp.isinf(x)
    return list(jax.lax.cond(always, lambda v: list(v),
                             lambda v: [_zeros(jnp.shape(x), x) for x in v],
                             list(values)))  # fmt: skip


def _zeros(shape: tuple[int, ...], x: Any) -> Any:
    """Zeros of ``shape`` and ``x``'s dtype, varying over the manual axes ``x`` varies over
    (`zeros_varying`)."""
    return zeros_varying(shape, jnp.result_type(x), jax.typeof(x))


def _carried(origin: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The carries among a layer's VJP leaves (``origin``), in order."""
    return [o for o in origin if o[0] == "carry"]


def _slot(i: Any, start: int, first: int, reverse: bool) -> Any:
    """Where layer ``i`` of a run keeps its input carry: the run's layers after its first in
    order of the forward pass (slots ``0..n-2``; the first layer's carry is the run's input
    carry, kept as it is). The first layer writes slot 0 too, before the second layer
    overwrites it: a write either way, no branch."""
    if reverse:
        return jnp.minimum(i - start, first - start - 1)
    return jnp.maximum(i - start - 1, 0)


def _carry_at(i, start, stop, reverse, carry_in, held, origin) -> list[Any]:
    """The input carries of layer ``i`` of a run that its VJP keeps (by index: ``{k: value}``):
    the run's input carry for its first layer, else the slot `_slot` wrote."""
    first = stop - 1 if reverse else start
    out = {}
    for b, (_, k) in zip(held, _carried(origin), strict=True):
        if stop - start == 1:
            out[k] = carry_in[k]
            continue
        at = jax.lax.dynamic_index_in_dim(b, _slot(i, start, first, reverse), keepdims=False)
        out[k] = jnp.where(i == first, carry_in[k], at)
    return out
