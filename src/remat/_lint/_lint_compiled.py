"""RM005: checkpoints whose recomputation the compiler removed, read from `remat.measure`.

Kept apart from `_lint.py` because it compiles the gradient, while every other check reads
only the traced program.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp

from .._core._dtypes import dtype_of
from .._core._errors import renamed
from .._core._warnings import RematWarning
from .._measure._checks import _is_float_scalar, _loss_shapes, _shapes
from .._trace import _jaxpr_walk as walk
from ._findings import Finding

# Why the recomputation disappeared, per backend.
_WHY = {
    "cpu": (
        "XLA's CPU backend expands the optimization barriers that jax.checkpoint inserts "
        "before common-subexpression elimination, so the recomputed values are merged with "
        "the forward ones: no recomputation, no memory saved"
    ),
}
_WHY_DEFAULT = (
    "XLA merged the recomputed values with the forward ones (common-subexpression "
    "elimination across the checkpoint), so the checkpoint costs nothing and saves nothing"
)
_FIX = {
    "cpu": (
        "checkpoint inside a lax.scan body (remat.apply(fn, strategy) or remat.scan): on CPU "
        "remat is only kept inside loops"
    ),
}
_FIX_DEFAULT = "keep prevent_cse=True on checkpoints outside loops, or checkpoint a scan body"


def check_eliminated(
    fn, args: tuple[Any, ...], checkpoints: list[walk.Site], has_aux: bool = False
) -> list[Finding]:
    """Measures ``fn``'s gradient and reports RM005 if the compiler removed recomputation
    (``has_aux``: ``fn`` returns ``(loss, aux)``, the loss differentiated)."""
    if not args:
        return []  # nothing to differentiate
    try:
        out = _loss_shapes(jax.eval_shape(fn, *args), has_aux)
    except ValueError as err:
        raise renamed(err, "`remat.measure`", "`remat.lint`")  # noqa: B904 (`renamed` chains)
    if not _is_float_scalar(out):  # said, not skipped silently: RM005 needs the gradient
        aux = "" if has_aux else "; if it returns (loss, aux), pass has_aux=True (--has-aux)"
        warnings.warn(
            f"`remat.lint` did not compile the gradient for RM005 (checkpoints the compiler "
            f"removed): the loss fn returns {_shapes(out)}, not a float scalar{aux}.",
            RematWarning,
            stacklevel=4,
        )
        return []
    argnums = tuple(i for i, a in enumerate(args) if _inexact(a))
    if not argnums:
        return []  # nothing to differentiate
    from .._measure._measure import measure  # compiles; only needed here

    with warnings.catch_warnings():  # measure warns about what we report as RM005
        warnings.simplefilter("ignore", RematWarning)
        measurement = measure(fn, *args, argnums=argnums, has_aux=has_aux, repeats=0)
    return findings_from_measurement(measurement, checkpoints)


def _inexact(tree) -> bool:
    leaves = jax.tree_util.tree_leaves(tree)
    return bool(leaves) and all(jnp.issubdtype(dtype_of(x), jnp.inexact) for x in leaves)


def findings_from_measurement(measurement, checkpoints: list[walk.Site]) -> list[Finding]:
    """RM005 or RM009 findings for a `remat.Measurement`, at the checkpoints outside loops."""
    if measurement.saves_nothing and not measurement.recompute_eliminated:
        return _saves_nothing(measurement, checkpoints)
    if not (measurement.recompute_requested and measurement.recompute_eliminated):
        return []
    backend = measurement.backend
    why, fix = _WHY.get(backend, _WHY_DEFAULT), _FIX.get(backend, _FIX_DEFAULT)
    outside_loops = [s for s in checkpoints if s.loops == 0 and s.checkpoint is None]
    where = outside_loops or [s for s in checkpoints if s.checkpoint is None][:1]
    return [
        Finding(
            "RM005",
            f"the compiler removed this checkpoint's recomputation on {backend}: {why}",
            walk.source(site.eqn),
            fix,
        )
        for site in where
    ]


def _saves_nothing(measurement, checkpoints: list[walk.Site]) -> list[Finding]:
    mib = 2**20
    ratio = measurement.flops / measurement.plain_flops if measurement.plain_flops else None
    extra = f"{ratio:.2f}x the FLOPs" if ratio else "extra FLOPs"
    message = (
        f"this checkpoint recomputes ({extra} of the program without checkpoints) but the "
        f"compiled peak is {measurement.peak_bytes / mib:.2f} MiB against "
        f"{measurement.plain_peak_bytes / mib:.2f} MiB without checkpoints: no memory saved"
    )
    fix = (
        "put the layers in a lax.scan (nn.scan / nnx.scan) and checkpoint its body, e.g. "
        "remat.apply(fn, strategy)"
    )
    outside_loops = [s for s in checkpoints if s.loops == 0 and s.checkpoint is None]
    where = outside_loops or [s for s in checkpoints if s.checkpoint is None][:1]
    return [Finding("RM009", message, walk.source(site.eqn), fix) for site in where]
