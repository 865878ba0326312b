"""Checkpoint policies that never save a complex value.

`jax.checkpoint` rounds every intermediate it saves to its own precision with
`reduce_precision` (so that the forward pass and the backward pass agree under XLA's excess
precision), and `reduce_precision` accepts floating-point dtypes only: in JAX 0.10 a policy
that saves a ``complex64`` intermediate fails the gradient with "reduce_precision does not
accept dtype complex64". A layer with a complex recurrence (an LRU or S4 layer, an FFT) under
``"dots"`` or ``"everything"`` hits it at its complex matmuls. `RealSaves` is the policy it
wraps with complex outputs recomputed instead, everything else decided by that policy.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat._core._complex import RealSaves
  >>> policy = RealSaves(jax.checkpoint_policies.dots_saveable)
  >>> def f(x):
  ...     z = x.astype(jnp.complex64) @ jnp.full((4, 4), 0.5 + 0.5j)
  ...     return jnp.real(z * jnp.conj(z)).sum()
  >>> g = jax.grad(jax.checkpoint(f, policy=policy))(jnp.ones((2, 4)))
  >>> bool(jnp.allclose(g, jax.grad(f)(jnp.ones((2, 4)))))
  True
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


def _complex(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating)


def _outputs(prim: Any, avals: tuple[Any, ...], params: dict[str, Any]) -> list[Any]:
    """The output types of ``prim`` applied to ``avals``; the inputs' where JAX cannot say."""
    try:
        out = prim.abstract_eval(*avals, **params)
    except Exception:
        return list(avals)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (set, frozenset)):
        out = out[0]  # (avals, effects)
    return list(jax.tree.leaves(out, is_leaf=lambda a: hasattr(a, "dtype")))


@dataclasses.dataclass(frozen=True)
class RealSaves:
    """``policy``, except that an equation with a complex output is never saved."""

    policy: Any

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> Any:
        saved = self.policy(prim, *avals, **params)
        if saved and any(_complex(a) for a in _outputs(prim, avals, params)):
            return False
        return saved
