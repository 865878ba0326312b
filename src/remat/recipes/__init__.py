"""The five seed recipes: the canonical ways to checkpoint in JAX and Flax, solved exactly.

- `nn_checkpoint_forward`: a `flax.linen` MLP class lifted with `nn.checkpoint`.
- `checkpoint_forward`: a `flax.nnx` MLP whose forward is wrapped with `nnx.remat`.
- `nn_remat_policy`: a linen MLP lifted with `nn.remat` and a saving policy.
- `grad_checkpointed_stack`: a `jax.checkpoint`-ed layer as the body of `lax.scan`.
- `checkpointed_block_grad`: a block wrapped with `jax.checkpoint` inside a model.

Example:
  >>> import jax.numpy as jnp
  >>> from remat import recipes
  >>> recipes.nn_checkpoint_forward(0, jnp.ones(4), 3).shape
  (3,)
"""

from ._block import checkpointed_block_grad as checkpointed_block_grad
from ._linen import nn_checkpoint_forward as nn_checkpoint_forward
from ._linen import nn_remat_policy as nn_remat_policy
from ._nnx import checkpoint_forward as checkpoint_forward
from ._stack import grad_checkpointed_stack as grad_checkpointed_stack

__all__ = [
    "checkpoint_forward",
    "checkpointed_block_grad",
    "grad_checkpointed_stack",
    "nn_checkpoint_forward",
    "nn_remat_policy",
]
