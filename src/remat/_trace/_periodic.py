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

``g`` divides ``L``. With ``g = L`` there is one group and no loop (XLA would remove a
one-step loop anyway): the layers run one after another, each checkpointed, and `ordered`
keeps each recomputation until its layer is differentiated, so the checkpoints hold without
a loop. Any ``k`` of ``L`` layers can then save one set and the others another (3 of 8, 7 of
8, which no shorter period gives), and the first layer's input is the scan's initial carry
itself, not a copy in a stacked residual. Measured on the MLP stack of
`benchmarks/vs_torch.py` (8 layers, the up-projection saved or not, compiled peaks): every
layer saving it 36.02 MiB as a scan, 35.56 MiB as one group; the first layer recomputing
33.56 MiB, the last one recomputing 37.02 MiB (its recomputation runs first in the backward
pass, while every saved value is live): the positions with less saved come first.

The other forms measured copy or keep more: a remainder scan over the last ``L mod g`` layers
needs the stacked inputs sliced into two arrays (a copy of each parameter stack: 7.8 MiB on
the demo GPT), and choosing the save set inside one scan step with `jax.lax.switch` on the
layer index keeps the residuals of every branch at every step (JAX's ``cond`` saves the union
of its branches' residuals).

The body holds ``g`` copies of the layer, so compile time grows with ``g``: periods stop at
`MAX_PERIOD` (the planner offers the same, `remat._plan._perlayer.PLANNED_PERIOD`); the
step of a one-group form of 8 layers compiled in 5.6-7.2x the time of the uniform scan's
(`benchmarks/perlayer_bench.py`). The
positions' custom VJP (`ordered`) supports reverse-mode differentiation only, as a
checkpointed training step needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._core._dtypes import is_float

# The largest period offered: the group body holds this many copies of the layer.
MAX_PERIOD = 8

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
        floats = [c for c in jax.tree.leaves(ct) if _floating(c) and c.size]
        if floats:
            zero = 0 * jnp.minimum(jnp.abs(floats[0].ravel()[0]), 1)
            leaves = [
                x if param or not _floating(x) else x + zero.astype(x.dtype)
                for x, param in zip(leaves, inputs["params"], strict=True)
            ]
        return jax.tree.unflatten(tree, leaves)(ct)

    run.defvjp(fwd, bwd)
    return run


def _floating(x: Any) -> bool:
    return hasattr(x, "dtype") and is_float(x.dtype)


def periodic_loop(
    body: Body,
    pattern: Sequence[Sequence[str]],
    consts: Sequence[Any],
    init: Sequence[Any],
    xs: Sequence[Any],
    length: int,
    reverse: bool = False,
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

    if g == length:  # one group: no loop (XLA removes a one-step loop)
        carry, ys = group(list(init), list(xs))
        return list(carry), list(ys)
    carry, ys = jax.lax.scan(group, list(init), grouped, length=length // g, reverse=reverse)
    return list(carry), [jnp.reshape(y, (length, *y.shape[2:])) for y in ys]
