"""A linear function with a custom transpose, visible to every JAX transformation.

`remat.scan`'s `Binomial` schedule needs its tangent map ``t -> J t`` to run one way under
forward mode (a forward tangent scan, nothing stored) and another way when reverse mode
transposes it (Revolve's backward sweep, a few stored carries). That is what
`jax.custom_derivatives.linear_call` does, but a `linear_call` cannot be batched nor
differentiated with respect to its residuals, so it would break `vmap`, `jax.hessian` and
`grad` of `grad`. The primitive here adds those rules:

- transpose: the same primitive with ``fun`` and ``transpose`` swapped;
- JVP: linear in the linear inputs; with respect to the residuals, the JVP of a
  differentiable twin of ``fun`` (``fun_diff``: the same function, written so that reverse
  mode can run through it with little memory);
- batching: the same primitive over `jax.vmap` of the four functions.

The functions take and return flat lists of arrays: ``fun(res, lin) -> out`` and
``transpose(res, ct_out) -> ct_lin``; a cotangent that is symbolically zero reaches
``transpose`` as None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive, jaxpr_as_fun
from jax.interpreters import ad, batching, mlir


@dataclasses.dataclass(frozen=True, eq=False)
class _Funs:
    """The four functions of one linear map; hashed by identity, as JAX hashes params."""

    fun: Callable
    transpose: Callable
    fun_diff: Callable
    transpose_diff: Callable

    def swapped(self) -> _Funs:
        return _Funs(self.transpose, self.fun, self.transpose_diff, self.fun_diff)


def linear_call(
    fun: Callable,
    transpose: Callable,
    res: list,
    lin: list,
    *,
    fun_diff: Callable | None = None,
    transpose_diff: Callable | None = None,
) -> list:
    """``fun(res, lin)``, linear in ``lin``, whose transpose is ``transpose(res, ct)``."""
    funs = _Funs(fun, transpose, fun_diff or fun, transpose_diff or transpose)
    return _bind(funs, list(res), list(lin))


def _bind(funs: _Funs, res: list, lin: list) -> list:
    res_avals = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in res]
    lin_avals = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in lin]
    closed = jax.make_jaxpr(lambda r, t: funs.fun(r, t))(res_avals, lin_avals)
    return linear_p.bind(*res, *lin, callee=closed, funs=funs, num_res=len(res))


def _impl(*args, callee, funs, num_res):
    del funs, num_res
    return jaxpr_as_fun(callee)(*args)


def _abstract_eval(*args, callee, funs, num_res):
    del args, funs, num_res
    return callee.out_avals, callee.effects


def _transpose(cts, *args, callee, funs, num_res):
    del callee
    res, lin = args[:num_res], args[num_res:]
    assert not any(ad.is_undefined_primal(a) for a in res)
    # ``fun`` is linear in all of ``lin`` together, so a known linear input only adds a
    # constant to the output: only the others' cotangents are computed.
    undefined = [ad.is_undefined_primal(a) for a in lin]
    nonzero = [type(ct) is not ad.Zero for ct in cts]
    transposed = _only(_only(funs, undefined).swapped(), nonzero)
    ct_lin = iter(
        _bind(transposed, list(res), [ct for ct, nz in zip(cts, nonzero, strict=False) if nz])
    )
    return [None] * num_res + [next(ct_lin) if u else None for u in undefined]


def _only(funs: _Funs, wanted: list[bool]) -> _Funs:
    """``funs`` restricted to the ``wanted`` linear inputs (the others reach ``fun`` as None,
    a zero, so that it can skip the work they would take) and to their cotangents."""
    if all(wanted):
        return funs

    def fill(t):
        it = iter(t)
        return [next(it) if w else None for w in wanted]

    def keep(out):
        return [o for o, w in zip(out, wanted, strict=True) if w]

    return _Funs(
        lambda r, t: funs.fun(r, fill(t)),
        lambda r, c: keep(funs.transpose(r, c)),
        lambda r, t: funs.fun_diff(r, fill(t)),
        lambda r, c: keep(funs.transpose_diff(r, c)),
    )


def _jvp(primals, tangents, *, callee, funs, num_res):
    del callee
    res, lin = list(primals[:num_res]), list(primals[num_res:])
    dres, dlin = tangents[:num_res], tangents[num_res:]
    out = _bind(funs, res, lin)
    if all(type(t) is ad.Zero for t in dlin):
        tan = [jnp.zeros_like(o) for o in out]
    else:
        tan = _bind(funs, res, [ad.instantiate_zeros(t) for t in dlin])
    if not all(type(t) is ad.Zero for t in dres):
        dres = [ad.instantiate_zeros(t) for t in dres]
        _, extra = jax.jvp(lambda r: funs.fun_diff(r, lin), (res,), (dres,))
        tan = [a + b for a, b in zip(tan, extra, strict=True)]
    return out, tan


def _batch(args, dims, *, callee, funs, num_res):
    del callee
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims, strict=True)]
    res = moved[:num_res]
    res_axes = [None if d is None else 0 for d in dims[:num_res]]
    lin = [
        a if d is not None else jnp.broadcast_to(a, (size, *a.shape))
        for a, d in zip(moved[num_res:], dims[num_res:], strict=True)
    ]

    def batched(g):
        return lambda r, t: jax.vmap(g, in_axes=(res_axes, [0] * len(t)), out_axes=0)(r, t)

    funs_b = _Funs(
        *(batched(g) for g in (funs.fun, funs.transpose, funs.fun_diff, funs.transpose_diff))
    )
    out = _bind(funs_b, res, lin)
    return out, [0] * len(out)


linear_p = Primitive("remat_scan_linear")
linear_p.multiple_results = True
linear_p.def_impl(_impl)
linear_p.def_effectful_abstract_eval(_abstract_eval)
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch
mlir.register_lowering(linear_p, mlir.lower_fun(_impl, multiple_results=True))
