"""``remat demo``: the README's main command (placeholder until the measurement issue lands)."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the built-in demonstration")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import jax.numpy as jnp

    from . import recipes

    x = jnp.linspace(-1.0, 1.0, 4)
    print("nn_checkpoint_forward:", recipes.nn_checkpoint_forward(0, x, 3))
    return 0
