"""How many constants and carries a ``scan`` equation has, in either of JAX's forms of it.

JAX 0.10 gives them as the equation's ``num_consts`` and ``num_carry`` parameters. JAX 0.11
packs the inputs' layout into one parameter, ``ft_in``: a flat tree of three parts (the
constants, the carries, the scanned inputs). Every part of remat that reads a ``scan``
equation asks `scan_counts`, so a program traced by either version is read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_UNKNOWN = (
    "remat cannot read this `scan` equation: its parameters {got} have neither "
    "`num_consts`/`num_carry` (JAX 0.10) nor `ft_in` (JAX 0.11). This JAX is not one remat "
    "supports; install the JAX version that pyproject.toml names."
)


def scan_counts(params: Mapping[str, Any]) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation's parameters.

    Args:
      params: the equation's ``params``.

    Returns:
      The number of loop-invariant inputs (first) and of carried values (next); the scanned
      inputs follow them in the equation's inputs.

    Raises:
      ValueError: the parameters are in neither form.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._core._scan_params import scan_counts
      >>> w = jnp.ones((3, 3))
      >>> f = lambda h, xs: jax.lax.scan(lambda c, x: (jnp.tanh(c @ w) + x, None), h, xs)[0]
      >>> closed = jax.make_jaxpr(f)(jnp.ones(3), jnp.ones((4, 3)))
      >>> scan_counts(closed.jaxpr.eqns[-1].params)
      (1, 1)
    """
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    packed = params.get("ft_in")
    if packed is not None and hasattr(packed, "unpack"):
        consts, carry, _ = packed.unpack()
        return len(consts), len(carry)
    raise ValueError(_UNKNOWN.format(got=sorted(params)))
