"""The `flax.nnx` recipe: a stack of `nnx.Linear` layers whose forward is wrapped with `nnx.remat`.

`nnx.remat` is the lifted `jax.checkpoint`: it splits the module into a graph definition and
state, checkpoints the pure function of the state, and merges the module back. The forward
output is the eager one; under `jax.grad` the layers' activations are recomputed.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.typing import ArrayLike

from ._checks import as_array, as_int, at_least

_WHERE = "checkpoint_forward"
_X_SHAPE = (
    "`remat.recipes.checkpoint_forward` expects `x` of shape (features,) = ({features},), "
    "because every layer is `nnx.Linear(features, features)`; got shape {shape}. "
    "Pass `features={got}` or an input of length {features}."
)


class MLP(nnx.Module):
    """``num_layers`` layers of ``relu(Linear(features, features)(x))``, applied in sequence."""

    def __init__(self, num_layers: int, features: int, *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List(
            [nnx.Linear(features, features, rngs=rngs) for _ in range(num_layers)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


@nnx.remat
def remat_forward(model: MLP, x: jax.Array) -> jax.Array:
    """``model(x)``, checkpointed: its activations are recomputed under `jax.grad`."""
    return model(x)


def checkpoint_forward(
    seed: int | float, x: ArrayLike, features: int | float, num_layers: int | float
) -> jax.Array:
    """The output of an `nnx` MLP whose forward is wrapped with `nnx.remat`.

    Builds an MLP holding ``nnx.List([nnx.Linear(F, F, rngs=rngs) for _ in range(N)])`` with
    ``rngs = nnx.Rngs(int(seed))``, and applies ``relu(layer(x))`` for each layer in turn
    inside ``nnx.remat``. The output equals the eager ``model(x)``.

    Args:
      seed: the seed of `nnx.Rngs`; a float is cast to int.
      x: one input example, 1-D of shape ``(F,)``.
      features: the width ``F >= 1`` of every layer; a float is cast to int.
      num_layers: the number of layers ``N >= 1``; a float is cast to int.

    Returns:
      The final activation, shape ``(F,)``.

    Raises:
      ValueError: if a float argument is not integral, ``features < 1``, ``num_layers < 1``,
        ``x`` is not 1-D, or ``x`` does not have ``features`` entries.
      TypeError: if ``seed``, ``features`` or ``num_layers`` is not a number.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat.recipes import checkpoint_forward
      >>> checkpoint_forward(0.0, jnp.ones(3), 3.0, 2.0).shape
      (3,)
    """
    seed = as_int(seed, "seed", _WHERE)
    features = at_least(
        as_int(features, "features", _WHERE),
        1,
        "features",
        _WHERE,
        "`features` is the width F of every `nnx.Linear(F, F)` layer.",
    )
    num_layers = at_least(
        as_int(num_layers, "num_layers", _WHERE),
        1,
        "num_layers",
        _WHERE,
        "The MLP needs at least one layer to checkpoint.",
    )
    x = as_array(x, 1, "x", _WHERE, "1-D of shape (F,)", "For a batch, use `jax.vmap` over `x`.")
    if x.shape != (features,):
        raise ValueError(_X_SHAPE.format(features=features, shape=x.shape, got=x.shape[0]))
    model = MLP(num_layers, features, rngs=nnx.Rngs(seed))
    return remat_forward(model, x).reshape(-1)
