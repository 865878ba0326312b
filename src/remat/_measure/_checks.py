"""The argument checks shared by `remat.measure` and the stages built on it: arguments are
pytrees of arrays (or `jax.ShapeDtypeStruct` s when nothing is run), ``argnums`` name
floating-point arguments once each, and the loss is a floating-point scalar (bfloat16 and
float16 included, as `jax.grad` takes them). Messages name ``where`` (the public function).

A loss that closes over arrays (``lambda x: loss(params, x)``) gets them compiled into the
program as constants: XLA's memory analysis, and so every peak remat reads, leaves them out
(unless the program copies them: a scan of length one does), and they are not
differentiated. Where they are large (`_CLOSED_OVER_MIN_BYTES`, and a
twentieth of the arguments), a `RematWarning` says how many bytes the peak leaves out.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._core._dtypes import dtype_of, is_float, is_key
from .._core._errors import renamed
from .._core._warnings import RematWarning
from ._step import argnums_of

_NOT_ARRAY = (
    "`remat.measure` got an argument leaf of type {kind} at {path}; every argument must be a "
    "pytree of arrays (jax.Array, numpy arrays or Python numbers). Close over other values "
    "with `functools.partial` or a lambda."
)
_NOT_FLOAT = (
    "`remat.measure` differentiates argument(s) argnums={argnums}, but they have no "
    "floating-point leaf (the leaf at {path} has dtype {dtype}); gradients need "
    "floating-point inputs. Pass the parameters in `argnums`; integer leaves and PRNG keys "
    "are treated as constants."
)
_NOT_SCALAR = (
    "`remat.measure` needs a scalar-valued (loss) function, but fn returned {got}. Reduce the "
    "output to a scalar, e.g. `lambda *a: fn(*a).sum()`."
)
_AUX_HINT = (
    " It looks like (loss, aux): pass has_aux=True (on the command line: --has-aux), as for "
    "`jax.value_and_grad(..., has_aux=True)`."
)
_NOT_PAIR = (
    "`remat.measure` got has_aux=True, so fn must return a pair (loss, aux), as for "
    "`jax.value_and_grad(..., has_aux=True)`; it returned {got}."
)
_ABSTRACT_TIMED = (
    "`remat.measure` got a `jax.ShapeDtypeStruct` at {path} with repeats={repeats}; abstract "
    "arguments can be compiled and measured but not run. Pass repeats=0, or real arrays."
)
_BAD_ARGNUMS = (
    "`remat.measure` got argnums={argnums!r} for {n} positional argument(s); pass an int or a "
    "tuple of ints in range(0, {n}), as for `jax.grad`."
)
_REPEATED_ARGNUMS = (
    "`remat.measure` got argnums={argnums!r}, which names argument {dup} more than once; each "
    "argument is differentiated once. Pass each position once, e.g. argnums={fix!r}."
)
_CLOSED_OVER = (
    "`{where}`: fn closes over {n} array(s) of {mib:.2f} MiB in all (the largest {largest}), "
    "which are compiled into the program as constants, outside the arguments and temporaries "
    "that XLA's memory analysis counts: the measured peak may leave them out, and they are "
    "not differentiated. Pass them as arguments (the parameters in `argnums`) "
    "to count them, e.g. `{where}(loss, params, x)` rather than "
    "`{where}(lambda x: loss(params, x), x)`."
)
_LONGEST = 200  # characters of an output's shapes quoted whole in a message
_CLOSED_OVER_MIN_BYTES = 1 << 20  # constants below this (masks, tables) are not worth a word
_SCALARS = (int, float, complex, bool, np.generic, np.ndarray, jax.Array)


def _dtype(leaf: Any) -> Any:
    return dtype_of(leaf)


def _check_args(
    args: Sequence[Any], argnums: Any, repeats: int, where: str = "remat.measure"
) -> tuple[int, ...]:
    try:
        return _check_args_of(args, argnums, repeats)
    except (TypeError, ValueError) as err:
        raise renamed(err, "`remat.measure`", f"`{where}`")  # noqa: B904 (`renamed` chains)


def _check_args_of(args: Sequence[Any], argnums: Any, repeats: int) -> tuple[int, ...]:
    argnums = argnums_of(argnums)
    n = len(args)
    argnums_t = (argnums,) if isinstance(argnums, int) else argnums
    if (
        not isinstance(argnums_t, tuple | list)
        or not argnums_t
        or any(isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < n for a in argnums_t)
    ):
        raise ValueError(_BAD_ARGNUMS.format(argnums=argnums, n=n))
    repeated = [a for i, a in enumerate(argnums_t) if a in argnums_t[:i]]
    if repeated:
        fix = tuple(dict.fromkeys(argnums_t))
        fix = fix[0] if len(fix) == 1 else fix
        raise ValueError(_REPEATED_ARGNUMS.format(argnums=argnums, dup=repeated[0], fix=fix))
    for path, leaf in jax.tree_util.tree_leaves_with_path(args):
        where = "args" + jax.tree_util.keystr(path)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            if repeats:
                raise TypeError(_ABSTRACT_TIMED.format(path=where, repeats=repeats))
        elif not isinstance(leaf, _SCALARS):
            raise TypeError(_NOT_ARRAY.format(kind=type(leaf).__name__, path=where))
    # Only floating-point leaves are differentiated (see `_step.grad_step`); integer leaves
    # and PRNG keys are constants. Differentiating nothing at all is a mistake.
    diff = [
        (f"args[{i}]" + jax.tree_util.keystr(path), _dtype(leaf))
        for i in argnums_t
        for path, leaf in jax.tree_util.tree_leaves_with_path(args[i])
    ]
    if diff and not any(is_float(dtype) for _, dtype in diff):
        where, dtype = diff[0]
        raise TypeError(_NOT_FLOAT.format(argnums=argnums, path=where, dtype=dtype))
    return tuple(argnums_t)


def _check_scalar(
    fn: Callable[..., Any], args: Sequence[Any], has_aux: bool = False, where: str = "remat.measure"
) -> Any:
    """Checks that ``fn`` at ``args`` returns a float scalar (or ``(loss, aux)``), and warns
    of large arrays it closes over; returns its closed jaxpr (the trace the check made)."""
    try:
        closed = _check_scalar_of(fn, args, has_aux)
    except ValueError as err:
        raise renamed(err, "`remat.measure`", f"`{where}`")  # noqa: B904 (`renamed` chains)
    _warn_closed_over(list(closed.consts), args, where)
    return closed


def _nbytes(x: Any) -> int:
    dtype = dtype_of(x)
    if is_key(dtype):
        return 0
    return int(np.prod(getattr(x, "shape", ()), dtype=np.int64)) * np.dtype(dtype).itemsize


def _warn_closed_over(consts: Sequence[Any], args: Sequence[Any], where: str) -> None:
    arrays = [c for c in consts if hasattr(c, "shape") and hasattr(c, "dtype")]
    total = sum(_nbytes(c) for c in arrays)
    argument_bytes = sum(_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(args))
    if total < _CLOSED_OVER_MIN_BYTES or 20 * total < argument_bytes:
        return
    big = max(arrays, key=_nbytes)
    largest = f"{big.dtype}{list(big.shape)}"
    message = _CLOSED_OVER.format(where=where, n=len(arrays), mib=total / 2**20, largest=largest)
    warnings.warn(message, RematWarning, stacklevel=4)


_FLAG_AS_SHAPE = (
    "remat: the arguments hold {n} `bool[]` shape(s) (`jax.ShapeDtypeStruct`), where the "
    "model may expect a Python bool (a flag such as Equinox's `Dropout(inference=...)`): "
    "`jax.eval_shape` makes every leaf a shape. Make abstract arguments with "
    "`eqx.filter_eval_shape` (Equinox keeps its flags), or pass flags outside the arguments."
)


_FLAG_TRACED = (
    "remat: {where} a Python bool, which is traced as a `bool[]` array like every argument "
    "leaf (`jax.jit` would need `static_argnums`): a flag such as `train` cannot steer Python "
    "control flow there. Close over it instead: `functools.partial(loss, train=True)` or "
    "`lambda params, x: loss(params, x, True)`."
)


def _note_flags_as_shapes(err: Exception, args: Sequence[Any]) -> None:
    """Adds `_FLAG_AS_SHAPE` to a failed trace's error where scalar bool shapes may be flags,
    and `_FLAG_TRACED` where the arguments hold Python bools."""
    leaves = jax.tree_util.tree_leaves_with_path(args)
    flags = [
        leaf
        for _, leaf in leaves
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.shape == () and leaf.dtype == bool
    ]
    if flags:
        err.add_note(_FLAG_AS_SHAPE.format(n=len(flags)))
    bools = [f"args{jax.tree_util.keystr(path)}" for path, leaf in leaves if isinstance(leaf, bool)]
    if bools:
        where = f"{bools[0]} is" if len(bools) == 1 else f"{', '.join(bools)} are"
        err.add_note(_FLAG_TRACED.format(where=where))


def _check_scalar_of(fn: Callable[..., Any], args: Sequence[Any], has_aux: bool) -> Any:
    """Checks the output; returns ``fn``'s closed jaxpr at ``args``."""
    try:
        closed, out = jax.make_jaxpr(fn, return_shape=True)(*args)
    except jax.errors.ConcretizationTypeError as err:
        _note_flags_as_shapes(err, args)
        raise
    out = _loss_shapes(out, has_aux)
    if not _is_float_scalar(out):
        got = _shapes(out)
        hint = _AUX_HINT if not has_aux and _looks_like_aux(out) else ""
        raise ValueError(_NOT_SCALAR.format(got=got) + hint)
    return closed


def _loss_shapes(out: Any, has_aux: bool) -> Any:
    """The loss's shapes among ``fn``'s output shapes ``out``: ``out`` itself, or with
    ``has_aux`` the first of the pair ``(loss, aux)`` (a ValueError for anything else)."""
    if not has_aux:
        return out
    if not isinstance(out, tuple | list) or len(out) != 2:
        got = jax.tree_util.tree_map(lambda s: f"{s.dtype}{list(s.shape)}", out)
        raise ValueError(_NOT_PAIR.format(got=got))
    return out[0]


def _shapes(out: Any) -> Any:
    """The output's shapes and dtypes; a large aux (a model's batch statistics) in one line."""
    got = jax.tree_util.tree_map(lambda s: f"{s.dtype}{list(s.shape)}", out)
    if len(str(got)) <= _LONGEST:
        return got
    if _looks_like_aux(out):
        return f"({got[0]}, an aux of {len(jax.tree_util.tree_leaves(out[1]))} arrays)"
    leaves = jax.tree_util.tree_leaves(got)
    return f"a pytree of {len(leaves)} arrays, the first {leaves[0]}"


def _is_float_scalar(out: Any) -> bool:
    """True for one floating-point scalar (bfloat16 and float16 included), as `jax.grad` takes."""
    return (
        isinstance(out, jax.ShapeDtypeStruct)
        and out.shape == ()
        and jax.dtypes.issubdtype(out.dtype, np.floating)
    )


def _looks_like_aux(out: Any) -> bool:
    """True for a pair whose first element is a floating-point scalar: ``(loss, aux)``."""
    return isinstance(out, tuple | list) and len(out) == 2 and _is_float_scalar(out[0])
