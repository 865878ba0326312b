"""Model state through a rewritten program: nnx modules passed as arguments, and in-place
changes to arguments that the rewrite cannot keep.

`remat.apply` traces ``fn`` to a jaxpr and evaluates the jaxpr again. Whatever ``fn`` does to
Python objects while it is traced is a side effect on the objects of that trace, not part of
the jaxpr: an `nnx.Module` argument whose `nnx.BatchNorm` updates its batch statistics, or
whose `nnx.Dropout` advances its `nnx.Rngs` count, would be left as it was, and training would
go on with stale state. So, as `nnx.jit` does, every nnx graph node among the arguments is
split into its graph definition (static) and its state (arrays) before tracing (`lift`); the
traced function merges it again, runs ``fn`` and returns the node's new state beside ``fn``'s
outputs; after the evaluation the caller's node is updated with it (`write_back`). Under
`nnx.value_and_grad` or `nnx.jit` the caller's node is their traced copy, which they
propagate as they do for any function.

Any other in-place change to an argument (a list or dict whose entries ``fn`` replaces) is
refused with an error that names it (`check_unchanged`): nothing is dropped silently.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> from remat._trace._state import lift, merged, write_back
  >>> norm = nnx.BatchNorm(2, rngs=nnx.Rngs(0))
  >>> (lifted, x), _, nodes = lift((norm, jnp.ones((4, 2)) * 3), {})
  >>> out, states = merged(lambda m, x: m(x))(lifted, x)  # the merged copy's statistics move
  >>> write_back(nodes, states)                             # and the caller's follow
  >>> nodes[0][1] is norm, round(float(norm.mean[...][0]), 3)
  (True, 0.03)
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import jax

_CHANGED = (
    "`remat.apply`: {name} changed its argument {path} in place ({what}). `remat.apply` traces "
    "the function and evaluates the traced program again, so such a change would be lost. "
    "Return the new value as an output instead (e.g. `return loss, new_state` with "
    "`has_aux=True`), or pass the state as an `nnx.Module`, whose updates are kept."
)


def _is_node(x: Any) -> bool:
    """An nnx module or object (`nnx.Rngs`, `nnx.Optimizer`, ...); not a lone variable."""
    if "flax.nnx" not in sys.modules:  # no nnx object can exist without it
        return False
    from flax import nnx

    return nnx.graph.is_graph_node(x) and not isinstance(x, nnx.Variable)


def _is_variable(x: Any) -> bool:
    if "flax.nnx" not in sys.modules:
        return False
    from flax import nnx

    return isinstance(x, nnx.Variable)


@jax.tree_util.register_pytree_node_class
class Lifted:
    """An nnx graph node as its graph definition (static) and its state (traced)."""

    def __init__(self, graphdef: Any, state: Any):
        self.graphdef, self.state = graphdef, state

    def tree_flatten(self):
        return (self.state,), self.graphdef

    @classmethod
    def tree_unflatten(cls, graphdef, children):
        return cls(graphdef, children[0])


def has_nodes(tree: Any) -> bool:
    """Whether ``tree`` holds an nnx graph node (a module, `nnx.Rngs`, a variable, ...)."""
    return any(_is_node(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_node))


def lift(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[tuple[Any, Any]]]:
    """``args`` and ``kwargs`` with every nnx graph node replaced by a `Lifted`.

    Returns ``(args, kwargs, nodes)``: ``nodes`` lists ``(path, node)`` for each node, in
    the order `merged` returns their states.
    """
    from flax import nnx

    nodes: list[tuple[Any, Any]] = []

    def one(path, x):
        if not _is_node(x):
            return x
        nodes.append((path, x))
        return Lifted(*nnx.split(x))

    lifted = jax.tree_util.tree_map_with_path(one, (args, kwargs), is_leaf=_is_node)
    return lifted[0], lifted[1], nodes


def merged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking `Lifted` nodes: merges them, calls ``fn``, and returns
    ``(out, states)``: ``fn``'s output and every node's state after the call."""
    from flax import nnx

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        made: list[Any] = []

        def one(x):
            if not isinstance(x, Lifted):
                return x
            made.append(nnx.merge(x.graphdef, x.state))
            return made[-1]

        is_lifted = lambda x: isinstance(x, Lifted)  # noqa: E731
        args, kwargs = jax.tree_util.tree_map(one, (args, kwargs), is_leaf=is_lifted)
        out = fn(*args, **kwargs)
        return out, [nnx.state(m) for m in made]

    return run


def write_back(nodes: list[tuple[Any, Any]], states: list[Any]) -> None:
    """Updates each caller's node with the state its traced copy ended with."""
    from flax import nnx

    for (_, node), state in zip(nodes, states, strict=True):
        nnx.update(node, state)


def check_unchanged(name: str, tree: Any, leaves: list[Any], treedef: Any) -> None:
    """Raises if ``tree`` (the arguments ``fn`` was traced with, after the call) no longer
    flattens to ``leaves``/``treedef``: ``fn`` changed a mutable argument in place.

    nnx variables in a split state are not checked: the loss merges them into a module, and
    the module's changes are the loss's to return (as aux), as they are under `jax.jit`.
    """
    now_leaves, now_def = jax.tree_util.tree_flatten(tree)
    if now_def != treedef:
        raise ValueError(
            _CHANGED.format(name=name, path="structure", what=f"{treedef} became {now_def}")
        )
    paths, checked = [], []
    for path, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_variable)[0]:
        count = len(jax.tree_util.tree_leaves(x)) if _is_variable(x) else 1
        paths += [path] * count
        checked += [not _is_variable(x)] * count
    for path, check, before, after in zip(paths, checked, leaves, now_leaves, strict=True):
        if check and before is not after:
            root = "args" if getattr(path[0], "idx", 0) == 0 else "kwargs"
            where = root + jax.tree_util.keystr(path[1:])
            raise ValueError(_CHANGED.format(name=name, path=where, what="a new value"))
