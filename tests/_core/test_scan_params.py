"""`scan_counts` reads a scan equation in JAX 0.10's form and in JAX 0.11's (``ft_in``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat._core._scan_params import scan_counts


def _scan_params(n_consts: int, n_carry: int):
    ws = [jnp.full((3, 3), 0.1 * (i + 1)) for i in range(n_consts)]

    def f(carry, xs):
        def body(c, x):
            h = c[0]
            for w in ws:
                h = jnp.tanh(h @ w)
            return (h + x, *(ci + 1.0 for ci in c[1:])), h

        return jax.lax.scan(body, carry, xs)

    carry = tuple(jnp.ones(3) for _ in range(n_carry))
    closed = jax.make_jaxpr(f)(carry, jnp.ones((4, 3)))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    return eqn.params


@pytest.mark.parametrize("n_consts, n_carry", [(0, 1), (2, 1), (1, 3)])
def test_counts_of_a_traced_scan(n_consts, n_carry):
    assert scan_counts(_scan_params(n_consts, n_carry)) == (n_consts, n_carry)


class _Packed:
    """JAX 0.11's ``ft_in``: a flat tree whose ``unpack`` gives (consts, carries, xs)."""

    def __init__(self, *parts):
        self.parts = parts

    def unpack(self):
        return self.parts


def test_counts_of_jax_0_11_form():
    params = {"ft_in": _Packed([None] * 2, [None] * 3, [None]), "length": 4, "jaxpr": None}
    assert scan_counts(params) == (2, 3)


def test_parameters_in_neither_form_are_an_error_naming_them():
    with pytest.raises(ValueError, match=r"parameters \['jaxpr', 'length'\] have neither"):
        scan_counts({"length": 4, "jaxpr": None})
