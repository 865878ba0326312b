"""The five seed recipes: the canonical ways to checkpoint in JAX and Flax, solved exactly."""
