"""Per-layer save sets that nest, in one loop each way: one forward and one backward body.

`remat._trace._periodic.segments` runs each run of layers saving the same set as a loop of
its own: a plan mixing two sets has two forward and two backward loop bodies, each a copy of
the layer, and XLA compiles each (on the models of `benchmarks/vs_torch.py` such a plan's
step compiles in 1.5-1.7x the CPU time of the uniform plan's). When the sets nest
(``S_1 ⊂ ... ⊂ S_k``, as the points of a layer's Pareto front the planner mixes do), every
layer can run the same code:

- forward: one loop over all layers, each checkpointed to save the largest set ``S_k``;
  each saved value goes into one buffer with a slot per layer whose set holds it (a scatter
  that drops the write of the other layers), so each layer keeps only its own set;
- backward: one loop over all layers, all differentiated by one VJP, that of the layer
  saving ``S_k`` and the values of `_given`. A `jax.lax.switch` on the layer's set first
  computes, from its input and the values it kept (its forward pass with those given,
  `remat._trace._taps`; XLA keeps only what leads to the values asked for), the values of
  ``S_k`` it did not keep, written into the slot of a layer whose backward pass is done,
  and the values of `_given`: those made by a matmul or a reduction that the branches
  compute on their way to ``S_k`` and that the VJP of ``S_k`` would compute again. So no
  layer recomputes more than its own set's VJP does (the same FLOPs as `segments`,
  `tests/_trace/test_periodic.py`; without `_given`, +22.22% over the un-checkpointed step
  against +13.45% on the vs_torch GPT at 25%). The branches are tagged with how often each
  runs (`remat._core._flop_tags.branch_scope`), so `remat.measure` counts them exactly.

It compiles in less time than `segments` (one copy of the layer's forward pass, one of its
transposed backward pass, and a recomputing forward pass per set: 1.3-1.4x the uniform
plan's CPU time on the vs_torch GPT's plans where segments take 1.45-1.6x;
`benchmarks/perlayer_compile.py`), but it peaks higher, so the planner does not use it
(`remat._trace._periodic.ONE_LOOP` is False; set it to compile a nesting pattern this way).
A loop holds its buffers whole until it ends, so a layer saving less recomputes while every
other layer's values are still held, where segments free each run's values when its loop
ends (the vs_torch MLP at 25%: 32.78 MiB against 31.77); the switch computes the values it
gives the VJP all at once, before the VJP's backward pass begins, where the VJP of
`segments` computes each when XLA's schedule needs it (the GPT at 25%, whose layers saving
less recompute the attention: 48.18 MiB against 44.68; at 40%, 82.39 against 81.69). XLA
writes a `switch`'s outputs into buffers of their own (a buffer passed through it is
copied whole), so the recomputed values cannot go into the slots directly.

`one_loop` runs a pattern so when its sets nest (two or more), each value the VJPs save is
named by `remat._trace._tag.eval_tagged` (a saved value is found by name in the forward
pass's jaxpr: ``reduce_precision`` of a ``name`` equation) and each layer that recomputes
has a slot free by then (a layer after it keeps the value: the sets saving less come first,
as the planner orders them); otherwise `segments` runs it. The carries, the parameter
gradients and the order of the backward pass are kept as `segments` keeps them.
Reverse-mode only, as `segments`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from .._core._flop_tags import branch_scope
from ._taps import tapped
from ._traced import _spec, zeros_varying
from ._vjp_order import after as _after
from ._vjp_order import cotangents, custom_loop
from ._vjp_order import floating as _floating
from ._vjp_order import tie_one as _tie_one


def chain(pattern: Sequence[Sequence[str]]) -> list[tuple[str, ...]] | None:
    """The distinct sets of ``pattern``, smallest first, if each holds the one before it;
    else None.

    Example:
      >>> from remat._trace._one_loop import chain
      >>> chain([("a",), ("a", "b"), ("a",)]), chain([("a",), ("b",)])
      ([('a',), ('a', 'b')], None)
    """
    sets = sorted({tuple(sorted(p)) for p in pattern}, key=len)
    for small, large in itertools.pairwise(sets):
        if not set(small) <= set(large):
            return None
    return sets


def _saved_names(layer: Callable[..., Any], carry, consts, x) -> tuple[list, list, list]:
    """``(origin, names, specs)`` of the leaves of the layer's VJP: where each leaf comes
    from (``("const"|"x"|"carry", k)`` or ``("saved", None)``), and for each saved one the
    name of the value it is (None where it is no named value: read from the jaxpr of the
    forward pass, where a saved value is ``reduce_precision`` of a ``name`` equation) and
    its shape."""
    origin: list = []

    def leaves(carry, consts, x):
        _, vjp = jax.vjp(layer, carry, consts, x)
        flat = jax.tree.leaves(vjp)
        where = {id(v): ("const", k) for k, v in enumerate(consts)}
        where.update({id(v): ("x", k) for k, v in enumerate(x)})
        where.update({id(v): ("carry", k) for k, v in enumerate(carry)})
        origin[:] = [where.get(id(v), ("saved", None)) for v in flat]
        return [v for v, o in zip(flat, origin, strict=True) if o[0] == "saved"]

    closed = jax.make_jaxpr(leaves)(carry, consts, x)
    producer = {id(v): e for e in closed.jaxpr.eqns for v in e.outvars}
    names = []
    for var in closed.jaxpr.outvars:
        name = None
        for _ in range(4):
            eqn = producer.get(id(var))
            if eqn is None:
                break
            if eqn.primitive.name == "name":
                name = eqn.params["name"]
                break
            if eqn.primitive.name != "reduce_precision":
                break
            var = eqn.invars[0]
        names.append(name)
    return origin, names, [v.aval for v in closed.jaxpr.outvars]


def one_loop(
    body: Callable[..., Any],
    pattern: Sequence[Sequence[str]],
    consts: Sequence[Any],
    init: Sequence[Any],
    xs: Sequence[Any],
    reverse: bool = False,
    head: Callable[..., Sequence[Any]] | None = None,
) -> tuple[list[Any], list[Any]] | None:
    """`remat._trace._periodic.segments` for a pattern whose sets nest, in one loop each
    way (see the module docstring); None where it cannot run so (the caller runs
    `segments`).

    Args:
      body: ``body(consts, carry, x) -> (new_carry, ys)``, its values named by
        `remat._trace._tag.eval_tagged`.
      pattern: the names each layer saves, one entry per layer.
      consts, init, xs, reverse, head: as `segments` takes them.
    """
    sets = chain(pattern)
    if sets is None or len(sets) == 1:
        return None
    length = len(pattern)
    level = np.array([sets.index(tuple(sorted(p))) for p in pattern], np.int32)
    policy = jax.checkpoint_policies.save_only_these_names(*sets[-1])
    layer = jax.checkpoint(lambda carry, consts, x: body(consts, carry, x), policy=policy,
                           prevent_cse=False)  # fmt: skip
    specs = [_spec(a[0]) for a in xs]
    carry_specs = list(jax.eval_shape(lambda *a: list(head(*a)), *init) if head is not None
                       else [_spec(c) for c in init])  # fmt: skip
    const_specs = [_spec(c) for c in consts]
    origin, names, saved_specs = _saved_names(layer, carry_specs, const_specs, specs)
    seen: dict[str, Any] = {}
    with tapped({}, seen):
        jax.eval_shape(lambda c, k, x: body(k, c, x), carry_specs, const_specs, specs)
    if any(n not in seen for n in names):
        return None  # a saved value the taps cannot give (not named by `eval_tagged`)
    index = np.arange(length)
    done_before = (index[None, :] > index[:, None]) != reverse  # [i, j]: j's backward first
    lowest = [next(lv for lv, s in enumerate(sets) if n in s) for n in names]
    keeps = [level >= lv for lv in lowest]
    slots = [np.where(k, np.cumsum(k) - 1, k.sum()).astype(np.int32) for k in keeps]
    # A layer that did not keep a value recomputes it into the slot of a layer whose
    # backward pass ran before its own (a slot no longer read): the nearest such layer.
    reads = []
    for k, slot in zip(keeps, slots, strict=True):
        read = slot.copy()
        for i in np.flatnonzero(~k):
            free = np.flatnonzero(k & done_before[i])
            if not free.size:
                return None  # no slot free yet: `segments` runs it
            read[i] = slot[free[np.argmin(np.abs(free - i))]]
        reads.append(read)
    # The backward pass differentiates every layer with one VJP: the layer saving ``shared``,
    # the largest set and the values of `_given` (those a branch of the switch below computes
    # that the VJP would compute again), all given by the switch on the layer's set.
    shared = (*sets[-1], *_given(body, carry_specs, const_specs, specs, sets, list(seen)))
    layer_b = jax.checkpoint(lambda carry, consts, x: body(consts, carry, x),
                             policy=jax.checkpoint_policies.save_only_these_names(*shared),
                             prevent_cse=False)  # fmt: skip
    b_origin, b_names, b_specs = _saved_names(layer_b, carry_specs, const_specs, specs)
    if any(n is None or n not in seen for n in b_names):
        return None
    # The carries the layer's backward pass reads: the shared VJP's, and those any set's
    # recomputation starts from (the branches'), kept per layer as `segments` keeps them.
    carried = set()
    for kept in sets:
        layer_lv = jax.checkpoint(lambda carry, consts, x: body(consts, carry, x),
                                  policy=jax.checkpoint_policies.save_only_these_names(*kept),
                                  prevent_cse=False)  # fmt: skip
        o, _, _ = _saved_names(layer_lv, carry_specs, const_specs, specs)
        carried |= {k for kind, k in (*o, *b_origin) if kind == "carry"}
    carried = sorted(carried)
    first = length - 1 if reverse else 0
    held_at = np.where(index == first, 0, index - (0 if reverse else 1)).astype(np.int32)
    counts = [int((level == lv).sum()) for lv in range(len(sets))]

    def forward(consts, init, xs, keep):
        carry = list(head(*init) if head is not None else init)
        indices = jnp.arange(length)
        if not keep:

            def plain(carry, i):
                x = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs]
                new, ys = layer(list(carry), list(consts), x)
                return list(new), list(ys)

            carry, ys = jax.lax.scan(plain, carry, indices, reverse=reverse)
            return (list(carry), list(ys)), None
        bufs = [zeros_varying((int(k.sum()), *s.shape), s.dtype, s)
                for k, s in zip(keeps, saved_specs, strict=True)]  # fmt: skip
        held = [zeros_varying((length - 1, *carry[k].shape), carry[k].dtype,
                              jax.typeof(carry[k])) for k in carried]  # fmt: skip
        tables = [jnp.asarray(s) for s in slots]
        at = jnp.asarray(held_at)

        def step(state, i):
            carry, bufs, held = state
            x = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs]
            (new, ys), vjp = jax.vjp(layer, list(carry), list(consts), x)
            flat = jax.tree.leaves(vjp)
            saved = [v for v, o in zip(flat, origin, strict=True) if o[0] == "saved"]
            bufs = [b.at[t[i]].set(v, mode="drop")
                    for b, t, v in zip(bufs, tables, saved, strict=True)]  # fmt: skip
            held = [jax.lax.dynamic_update_index_in_dim(h, carry[k], at[i], 0)
                    for h, k in zip(held, carried, strict=True)]  # fmt: skip
            return (list(new), bufs, held), list(ys)

        carry_in = None if head is not None else list(carry)
        (carry, bufs, held), ys = jax.lax.scan(step, (carry, bufs, held), indices,
                                                reverse=reverse)  # fmt: skip
        return (list(carry), list(ys)), (bufs, held, carry_in)

    # Where each saved leaf of the shared VJP comes from: a buffer (``j``), or the switch.
    in_buf = [names.index(n) if n in names else None for n in b_names]
    outs = [n for n, j in zip(b_names, in_buf, strict=True) if j is None]
    missing = [j for j, low in enumerate(lowest) if low > 0]  # some layer recomputes these

    def bwd(residuals, ct):
        consts, init, xs, (bufs, held, carry_in) = residuals
        ct_carry, ct_ys = ct
        head_vjp = None
        if carry_in is None:  # the initial carry: recomputed once the cotangent is here
            carry_in, head_vjp = jax.vjp(lambda *a: list(head(*a)),
                                         *_tie_one(list(init), ct_carry))  # fmt: skip
        tree = jax.tree.structure(jax.eval_shape(
            lambda c, k, x: jax.vjp(layer_b, c, k, x)[1], carry_specs, const_specs, specs))  # fmt: skip
        tables = [jnp.asarray(s) for s in slots]
        at = jnp.asarray(held_at)
        levels = jnp.asarray(level)
        grads = [jnp.zeros_like(c) if _floating(c) else None for c in consts]
        xgrads = [jnp.zeros_like(x) if _floating(x) else None for x in xs]

        def recompute(lv):
            """Branch ``lv``: for a layer of set ``lv``, the values of the largest set it did
            not keep (written into the buffers where it reads them) and those of `_given`,
            computed from its input and what it kept."""

            def branch(bufs, i, carry, x):
                read = {names[j]: jax.lax.dynamic_index_in_dim(bufs[j], tables[j][i],
                                                                keepdims=False)
                        for j in range(len(names)) if lowest[j] <= lv}  # fmt: skip
                got: dict[str, Any] = {}
                with tapped(read, got):
                    body(list(consts), list(carry), list(x))
                spec = dict(zip(b_names, b_specs, strict=True))
                return ([got[names[j]].astype(bufs[j].dtype) for j in missing],
                        [got[n].astype(spec[n].dtype) for n in outs])  # fmt: skip

            return branch

        branches = [recompute(lv) for lv in range(len(sets))]
        read_at = [jnp.asarray(r) for r in reads]

        def back(state, inp):
            ct_c, bufs, grads, xgrads = state
            i, ct_y = inp
            x = [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs]
            carry = list(carry_in)
            for h, k in zip(held, carried, strict=True):
                kept = jax.lax.dynamic_index_in_dim(h, at[i], keepdims=False)
                carry[k] = jnp.where(i == first, carry_in[k], kept)
            # Recompute once ``ct`` is here: the input carry is what the recomputation starts
            # from (without it XLA ran it before the next layer's backward pass was done).
            tied = _after([carry[k] for k in carried], [True] * len(carried), ct_c)
            for k, v in zip(carried, tied, strict=True):
                carry[k] = v
            bufs = list(bufs)
            with jax.named_scope(branch_scope(counts, length)):  # exact FLOPs
                part, values = jax.lax.switch(levels[i], branches, bufs, i, carry, x)
            # Written where the layer reads them: its own slot, or a free one (see `reads`).
            for j, v in zip(missing, part, strict=True):
                bufs[j] = jax.lax.dynamic_update_index_in_dim(bufs[j], v, read_at[j][i], 0)
            got = iter(values)
            saved = iter([next(got) if j is None else
                          jax.lax.dynamic_index_in_dim(bufs[j], read_at[j][i], keepdims=False)
                          for j in in_buf])  # fmt: skip
            sources = dict(const=consts, x=x, carry=carry)
            leaves = [next(saved) if kind == "saved" else sources[kind][k]
                      for kind, k in b_origin]  # fmt: skip
            d_c, d_consts, d_x = jax.tree.unflatten(tree, leaves)((list(ct_c), list(ct_y)))
            grads = [g if g is None else g + d for g, d in zip(grads, d_consts, strict=True)]
            xgrads = [g if g is None else jax.lax.dynamic_update_index_in_dim(g, d, i, 0)
                      for g, d in zip(xgrads, d_x, strict=True)]  # fmt: skip
            return (list(d_c), bufs, grads, xgrads), None

        (ct_carry, _, grads, xgrads), _ = jax.lax.scan(
            back, (list(ct_carry), list(bufs), grads, xgrads), (jnp.arange(length), list(ct_ys)),
            reverse=not reverse,
        )  # fmt: skip
        return cotangents(consts, grads, ct_carry, head_vjp, xs, xgrads)

    return custom_loop(forward, bwd, head, consts, init, xs)


def _given(body, carry_specs, const_specs, specs, sets, every) -> tuple[str, ...]:
    """The named values the switch gives the shared VJP beside the largest set.

    Those made by an equation other than an elementwise one (a matmul, a reduction) that a
    branch computes, on its way from the values its set keeps to those of the largest set it
    did not keep, and that the VJP of the layer saving the largest set would compute again to
    get the values its backward pass reads (the saved values of the VJP saving ``every``
    name), added until it computes none of them again. Elementwise equations are left to
    the VJP: XLA fuses them into what reads them.
    """
    everything = jax.checkpoint(lambda carry, consts, x: body(consts, carry, x),
                                policy=jax.checkpoint_policies.save_only_these_names(*every),
                                prevent_cse=False)  # fmt: skip
    needed = [n for n in _saved_names(everything, carry_specs, const_specs, specs)[1] if n]
    closed = jax.make_jaxpr(lambda c, k, x: body(k, c, x))(carry_specs, const_specs, specs)
    producer = {v: e for e in closed.jaxpr.eqns for v in e.outvars}
    named = {}  # var -> name, for the outputs of ``name`` equations
    raw_name = {}  # the var a ``name`` equation names -> its name
    for e in closed.jaxpr.eqns:
        if e.primitive.name == "name":
            named[e.outvars[0]] = e.params["name"]
            if not isinstance(e.invars[0], jcore.Literal):
                raw_name[e.invars[0]] = e.params["name"]
    by_name = {n: v for v, n in named.items()}

    def walk(starts, stop, cut=None):
        """The equations computing ``starts`` from the values named in ``stop`` and the
        inputs; with ``cut``, the names of the expensive ones in it, not walked past."""
        seen, eqns, hit = set(), set(), []
        stack = [by_name[n] for n in starts if n in by_name]
        while stack:
            v = stack.pop()
            if isinstance(v, jcore.Literal) or v in seen:
                continue
            seen.add(v)
            e = producer.get(v)
            if named.get(v) in stop or e is None:
                continue
            if cut is not None and id(e) in cut and raw_name.get(v) not in (None, *stop):
                hit.append(raw_name[v])
                continue
            eqns.add(id(e))
            stack.extend(e.invars)
        return eqns, hit

    largest = set(sets[-1])
    branch = set()  # the expensive equations some branch computes
    for kept in sets[:-1]:
        eqns, _ = walk(sorted(largest - set(kept)), set(kept))
        branch |= eqns
    expensive = {
        id(e)
        for e in closed.jaxpr.eqns
        if e.primitive.name not in _ELEMENTWISE and e.primitive.name != "name"
    }
    cut = branch & expensive
    saved, extra = set(largest), []
    while True:
        _, hit = walk([n for n in needed if n not in saved], saved, cut)
        hit = [n for n in dict.fromkeys(hit) if n not in saved]
        if not hit:
            return tuple(extra)
        saved.update(hit)
        extra += hit


_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "tanh", "logistic",
    "sin", "cos", "sqrt", "rsqrt", "pow", "integer_pow", "max", "min", "abs", "sign",
    "select_n", "convert_element_type", "erf", "erf_inv", "square", "expm1", "reshape",
    "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "copy", "reduce_precision",
    "stop_gradient", "clamp", "ne", "eq", "lt", "le", "gt", "ge", "and", "or", "not",
})  # fmt: skip
