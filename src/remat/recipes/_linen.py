"""The two `flax.linen` recipes: a Module class lifted with `nn.checkpoint` / `nn.remat`.

Lifting the *class* (not an instance) makes every call of the module a `jax.checkpoint`: its
parameters are the same as the plain module's and its forward output is identical; what
changes is what `jax.grad` keeps between the forward and the backward pass. With no policy
nothing inside the module is saved and everything is recomputed; with
`jax.checkpoint_policies.dots_with_no_batch_dims_saveable` the matmul outputs are saved and only
the cheap element-wise ops (here the ReLUs) are recomputed.

Note that on the CPU backend XLA undoes a checkpoint that is not inside a loop, so the memory
saving of these two recipes shows on accelerators, or when the module is the body of a scan.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.typing import ArrayLike

from ._checks import as_array, as_int, at_least

_X_FIX = "Pass one example of shape (D,); for a batch, use `jax.vmap` over this function."
_FEATURES_FIX = "`features` is the width F of each Dense layer and of the output."


class MLP(nn.Module):
    """``Dense(features) → relu → Dense(features)``: the module `nn_checkpoint_forward` lifts."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(self.features)(x)
        x = nn.relu(x)
        x = nn.Dense(self.features)(x)
        return x


class DeepMLP(nn.Module):
    """``Dense → relu → Dense → relu → Dense``: the module `nn_remat_policy` lifts."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.features)(x))
        x = nn.relu(nn.Dense(self.features)(x))
        x = nn.Dense(self.features)(x)
        return x


# The lifted classes: every call of an instance is a `jax.checkpoint` of `__call__`.
CheckpointMLP = nn.checkpoint(MLP)
PolicyRematMLP = nn.remat(DeepMLP, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


def _check(where: str, seed: object, x: ArrayLike, features: object) -> tuple[int, jax.Array, int]:
    seed = as_int(seed, "seed", where)
    features = at_least(as_int(features, "features", where), 1, "features", where, _FEATURES_FIX)
    x = as_array(x, 1, "x", where, "1-D of shape (D,)", _X_FIX)
    return seed, x, features


def _init_apply(module: nn.Module, seed: int, x: jax.Array) -> jax.Array:
    variables = module.init(jax.random.PRNGKey(seed), x)
    return module.apply(variables, x).reshape(-1)


def nn_checkpoint_forward(seed: int, x: ArrayLike, features: int) -> jax.Array:
    """The output of an MLP lifted with `nn.checkpoint`, initialised from ``seed``.

    Builds ``MLP(features)`` (``Dense(features) → relu → Dense(features)``), lifts the class
    with ``nn.checkpoint(MLP)``, initialises it with ``jax.random.PRNGKey(seed)`` and ``x`` and
    applies it. The output equals the un-lifted MLP's; only gradients taken through the
    module recompute its activations instead of saving them.

    Args:
      seed: the integer seed of `jax.random.PRNGKey` (an integral float is accepted).
      x: one input example, 1-D of shape ``(D,)``.
      features: the width ``F >= 1`` of both Dense layers.

    Returns:
      The flattened output, shape ``(F,)``.

    Raises:
      ValueError: if ``x`` is not 1-D, ``features < 1``, or an integer argument has a
        fractional part.
      TypeError: if ``seed`` or ``features`` is not a number.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat.recipes import nn_checkpoint_forward
      >>> nn_checkpoint_forward(0, jnp.ones(4), 3).shape
      (3,)
    """
    seed, x, features = _check("nn_checkpoint_forward", seed, x, features)
    return _init_apply(CheckpointMLP(features=features), seed, x)


def nn_remat_policy(seed: int, x: ArrayLike, features: int) -> jax.Array:
    """The output of a 3-layer MLP lifted with `nn.remat` and a saving policy.

    Builds ``Dense → relu → Dense → relu → Dense`` (each Dense of width ``features``), lifts
    the class with ``nn.remat(MLP, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)``,
    initialises it with ``jax.random.PRNGKey(seed)`` and ``x`` and applies it. The output
    equals the un-lifted MLP's; under `jax.grad` the matmul outputs are saved and the ReLUs
    are recomputed.

    Args:
      seed: the integer seed of `jax.random.PRNGKey` (an integral float is accepted).
      x: one input example, 1-D of shape ``(D,)``.
      features: the width ``F >= 1`` of the three Dense layers.

    Returns:
      The flattened output, shape ``(F,)``.

    Raises:
      ValueError: if ``x`` is not 1-D, ``features < 1``, or an integer argument has a
        fractional part.
      TypeError: if ``seed`` or ``features`` is not a number.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat.recipes import nn_remat_policy
      >>> nn_remat_policy(0, jnp.ones(4), 3).shape
      (3,)
    """
    seed, x, features = _check("nn_remat_policy", seed, x, features)
    return _init_apply(PolicyRematMLP(features=features), seed, x)
