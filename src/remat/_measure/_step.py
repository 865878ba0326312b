"""The step that `remat.measure`, `remat.compare` and `remat.plan` compile: `Step`.

By default the step is ``jax.value_and_grad(fn, argnums, has_aux=has_aux, allow_int=True)``:
gradients are taken with respect to the floating-point leaves of ``args[argnums]``; integer
leaves and PRNG keys (raw ``uint32`` `jax.random.PRNGKey` and typed `jax.random.key`) in them
are constants and get ``float0`` gradients, which take no memory. With ``has_aux=True`` the
loss returns ``(loss, aux)``, as in `jax.value_and_grad`.

With an ``optimizer`` (an optax ``GradientTransformation``) the step is the whole training
step as a training loop runs it (`train_step`): the value and gradient, ``tx.update`` and
``optax.apply_updates``, compiled with the parameters and the optimizer state donated, so
that the measured peak is the peak of the step a budget must hold (Adam's two moments and the
update included).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from remat._measure._step import grad_step
  >>> def loss(p, x):
  ...     return jnp.sum(p["w"] * x) * jax.random.uniform(p["key"]), {"n": 3}
  >>> (value, aux), grads = grad_step(loss, 0, has_aux=True)(
  ...     {"w": jnp.ones(2), "key": jax.random.key(0)}, jnp.ones(2))
  >>> aux, grads["w"].shape
  ({'n': 3}, (2,))
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._measurement import Timing

_BAD_OPT_ARGNUMS = (
    "`{where}` got optimizer=... with argnums={argnums!r}; the optimizer updates one argument, "
    "the parameters: pass argnums as a single int (the position of the parameters)."
)
_NOT_OPTIMIZER = (
    "`{where}` got optimizer={got!r}, which is not an optax GradientTransformation (an object "
    "with `init` and `update`); pass e.g. `optax.adam(1e-3)`."
)


@dataclasses.dataclass(frozen=True)
class Step:
    """What is compiled around a loss: which arguments are differentiated, whether the loss
    returns aux, and the optimizer that applies the gradients (None: the gradient step)."""

    argnums: int | tuple[int, ...] = 0
    has_aux: bool = False
    optimizer: Any = None


def as_step(spec: Any, where: str = "remat.measure") -> Step:
    """A `Step` from ``argnums`` (an int or a tuple of ints) or a `Step`."""
    step = spec if isinstance(spec, Step) else Step(spec)
    if step.optimizer is not None:
        if not (hasattr(step.optimizer, "init") and hasattr(step.optimizer, "update")):
            raise TypeError(_NOT_OPTIMIZER.format(where=where, got=step.optimizer))
        if isinstance(step.argnums, bool) or not isinstance(step.argnums, int):
            raise ValueError(_BAD_OPT_ARGNUMS.format(where=where, argnums=step.argnums))
    return step


def argnums_of(spec: Any) -> Any:
    """The ``argnums`` of a `Step` (or ``spec`` itself)."""
    return spec.argnums if isinstance(spec, Step) else spec


def grad_step(fn: Callable[..., Any], spec: Any, has_aux: bool = False) -> Callable[..., Any]:
    """``jax.value_and_grad(fn, argnums, has_aux=has_aux)``, with non-float leaves constant."""
    step = as_step(spec)
    return jax.value_and_grad(fn, step.argnums, has_aux=has_aux or step.has_aux, allow_int=True)


def loss_of(fn: Callable[..., Any], spec: Step | bool) -> Callable[..., Any]:
    """``fn`` returning its loss only: ``fn(*args)[0]`` when it also returns aux."""
    if not (spec.has_aux if isinstance(spec, Step) else spec):
        return fn

    def loss(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)[0]

    return loss


def floating(tree: Any) -> Any:
    """``tree`` with its floating-point leaves only (others ``None``): what the optimizer
    updates. Integer leaves and PRNG keys stay as they are, as ``eqx.apply_updates`` leaves
    them; for a tree of floating-point arrays, the tree itself.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._measure._step import floating
      >>> floating({"w": jnp.ones(2), "step": jnp.zeros((), jnp.int32)})["step"] is None
      True
    """
    from .._core._dtypes import is_float

    def keep(x: Any) -> Any:
        dtype = getattr(x, "dtype", None)
        return x if dtype is not None and is_float(dtype) else None

    return jax.tree_util.tree_map(keep, tree)


def train_step(
    fn: Callable[..., Any], optimizer: Any, argnums: int = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``step(params, opt_state, *rest) -> (params, opt_state, value)``: one optax step.

    ``params`` is ``fn``'s argument ``argnums``; ``rest`` are its other arguments, in order.
    ``value`` is the loss (``(loss, aux)`` with ``has_aux``), as `jax.value_and_grad` returns
    it. Equal to optax's own step: ``tx.update(grads, opt_state, params)`` then
    ``optax.apply_updates``, on the floating-point leaves of ``params`` (`floating`;
    ``opt_state`` is ``tx.init(floating(params))``, which is ``tx.init(params)`` when every
    leaf is floating point); integer leaves and keys pass through unchanged.
    """
    import optax

    def step(params: Any, opt_state: Any, *rest: Any) -> tuple[Any, Any, Any]:
        args = list(rest)
        args.insert(argnums, params)
        value, grads = grad_step(fn, argnums, has_aux)(*args)
        trained = floating(params)
        updates, opt_state = optimizer.update(floating(grads), opt_state, trained)
        trained = optax.apply_updates(trained, updates)
        params = jax.tree_util.tree_map(
            lambda p, t: p if t is None else t, params, trained, is_leaf=lambda x: x is None
        )
        return params, opt_state, value

    return step


class _Static:
    """The non-array leaves of Equinox-module arguments (`eqx.partition`'s static half),
    hashable by their tree structure and leaves, as `jax.jit`'s static arguments must be (a
    module with a list field is not hashable itself)."""

    def __init__(self, tree: Any):
        self.leaves, self.treedef = jax.tree_util.tree_flatten(tree)

    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self.treedef, self.leaves)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Static)
            and self.treedef == other.treedef
            and len(self.leaves) == len(other.leaves)
            and all(a is b or a == b for a, b in zip(self.leaves, other.leaves, strict=True))
        )

    def __hash__(self) -> int:
        return hash((self.treedef, tuple(self.leaves)))


def jitted_train_step(
    fn: Callable[..., Any], optimizer: Any, argnums: int = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """`train_step` under `jax.jit`, with ``params`` and ``opt_state`` donated.

    Arguments that hold Equinox modules are split as ``eqx.filter_jit`` splits them: arrays
    traced, every other leaf (a dropout's ``inference`` bool, its rate, activation functions)
    static. ``opt_state`` is the one Equinox's own loops make,
    ``tx.init(eqx.filter(model, eqx.is_inexact_array))`` (``eqx.is_array`` gives the same
    state for a model whose arrays are all floating point); the module comes back whole.
    """
    plain = jax.jit(train_step(fn, optimizer, argnums, has_aux), donate_argnums=(0, 1))

    def on_arrays(params: Any, opt_state: Any, rest: Any, static: _Static) -> Any:
        import equinox as eqx

        p_static, r_static = static.tree()

        def loss(*args: Any) -> Any:
            args = list(args)
            args[argnums] = eqx.combine(args[argnums], p_static)
            return fn(*args)

        rest = eqx.combine(rest, r_static)
        return train_step(loss, optimizer, argnums, has_aux)(params, opt_state, *rest)

    split = jax.jit(on_arrays, static_argnums=(3,), donate_argnums=(0, 1))

    def step(params: Any, opt_state: Any, *rest: Any) -> tuple[Any, Any, Any]:
        from .._trace._eqx import has_modules

        if not has_modules((params, rest)):
            return plain(params, opt_state, *rest)
        import equinox as eqx

        arrays, p_static = eqx.partition(params, eqx.is_array)
        r_arrays, r_static = eqx.partition(rest, eqx.is_array)
        static = _Static((p_static, r_static))
        arrays, opt_state, value = split(arrays, opt_state, r_arrays, static)
        return eqx.combine(arrays, p_static), opt_state, value

    return step


_OTHER_STATE = (
    "`{where}` got an opt_state that is not the state of the optimizer the plan was made "
    "for: its structure is {got}, where the plan's optimizer.init(params) gives {want}. Make "
    "it with that optimizer: `opt_state = plan.optimizer.init(params)` (for an Equinox model, "
    "`plan.optimizer.init(eqx.filter(model, eqx.is_inexact_array))`), or plan again with "
    "`optimizer=` the optimizer whose state you pass."
)


def check_opt_state(optimizer: Any, params: Any, opt_state: Any, where: str) -> None:
    """Raises a ValueError naming ``where`` if ``opt_state`` is not shaped as
    ``optimizer.init`` shapes the state of ``params`` (another optimizer's state).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> params = {"w": jnp.ones(3)}
      >>> check_opt_state(optax.sgd(0.1), params, optax.sgd(0.1).init(params), "Plan.step")
      >>> try:
      ...     check_opt_state(optax.adam(0.1), params, optax.sgd(0.1).init(params), "Plan.step")
      ... except ValueError as e:
      ...     print(str(e)[:60])
      `Plan.step` got an opt_state that is not the state of the op
    """
    from .._trace._eqx import has_modules

    if has_modules(params):
        import equinox as eqx

        trained = eqx.filter(params, eqx.is_inexact_array)
    else:
        trained = floating(params)
    want = jax.tree.structure(jax.eval_shape(optimizer.init, trained))
    got = jax.tree.structure(opt_state)
    if got != want:

        def brief(tree: Any) -> str:
            text = str(tree)
            return text if len(text) <= 200 else text[:200] + "..."

        raise ValueError(_OTHER_STATE.format(where=where, got=brief(got), want=brief(want)))


def checked_step(step: Callable[..., Any], optimizer: Any, where: str) -> Callable[..., Any]:
    """``step(params, opt_state, *rest)`` that, where it fails, says so if ``opt_state`` is
    another optimizer's (`check_opt_state`); the optimizer's own error otherwise."""

    @functools.wraps(step)
    def checked(params: Any, opt_state: Any, *rest: Any) -> Any:
        try:
            return step(params, opt_state, *rest)
        except (AttributeError, TypeError, ValueError):
            check_opt_state(optimizer, params, opt_state, where)
            raise

    return checked


def _train_args(args: Sequence[Any], step: Step, concrete: bool) -> tuple[Any, ...]:
    params = args[step.argnums]
    init = step.optimizer.init
    trained = floating(params)
    opt_state = init(trained) if concrete else jax.eval_shape(init, trained)
    rest = [a for i, a in enumerate(args) if i != step.argnums]
    return (params, opt_state, *rest)


# Options for a compile that is read but never run (its memory analysis and optimised HLO):
# LLVM's optimisation level changes only the machine code, not XLA's HLO passes, buffer
# assignment or memory analysis: the same peak and the same HLO (so the same FLOPs), measured
# on the demo GPT, a MaxText decoder and the tests' stacks (`tests/_plan/test_compiles.py`),
# in about 40% of the time (demo GPT: 5.3 s instead of 12.5 s). That holds on the CPU and the
# TPU; a GPU's compiler reads the option in its own passes, so a GPU compile leaves it out
# (`remat._measure._read_options`).
ANALYSIS_OPTIONS = {"xla_backend_optimization_level": 0}


def lower_step(fn: Callable[..., Any], args: Sequence[Any], spec: Any) -> Any:
    """``jax.jit(step).lower(...)`` for the step ``spec`` describes (see the module docstring).

    On sharded arguments each gradient comes out sharded as its argument is (`sharded_like`),
    as a training loop keeps them; left to XLA, the gradients of FSDP-sharded parameters come
    out whole on every device (a training step's updated parameters are sharded already: they
    are donated into the arguments' buffers).
    """
    step = as_step(spec)
    if step.optimizer is None:
        grad = grad_step(fn, step)
        wrt = args[step.argnums] if isinstance(step.argnums, int) else (
            tuple(args[i] for i in step.argnums))  # fmt: skip

        def sharded_step(*call_args: Any) -> Any:
            value, grads = grad(*call_args)
            return value, sharded_like(grads, wrt)

        return jax.jit(sharded_step).lower(*args)
    train = train_step(fn, step.optimizer, step.argnums, step.has_aux)
    return jax.jit(train, donate_argnums=(0, 1)).lower(*_train_args(args, step, False))


def sharded_like(tree: Any, like: Any) -> Any:
    """``tree`` with each leaf constrained to the sharding of its leaf in ``like`` where that
    sharding spans several devices (a mesh's, a `remat.Target`'s); other leaves, ``float0``
    gradients among them, as they are.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._measure._step import sharded_like
      >>> sharded_like({"w": jnp.ones(2)}, {"w": jnp.zeros(2)})["w"].shape
      (2,)
    """

    def keep(leaf: Any, model: Any) -> Any:
        sharding = getattr(model, "sharding", None)
        if (
            not isinstance(sharding, jax.sharding.Sharding)
            or len(sharding.device_set) < 2
            or getattr(leaf, "dtype", None) == jax.dtypes.float0
        ):
            return leaf
        return jax.lax.with_sharding_constraint(leaf, sharding)

    if jax.tree_util.tree_structure(tree) != jax.tree_util.tree_structure(like):
        return tree
    return jax.tree_util.tree_map(keep, tree, like)


def time_step(compiled: Any, args: Sequence[Any], spec: Any, repeats: int) -> Timing:
    """Seconds of ``repeats`` runs after a warm-up; a training step is run as a loop runs it,
    on copies of the parameters (they are donated), each step on the last one's outputs."""
    step = as_step(spec)
    if step.optimizer is None:
        state, rest = (), tuple(args)
    else:
        params, opt_state, *others = _train_args(args, step, True)
        state, rest = (jax.tree_util.tree_map(jnp.copy, params), opt_state), tuple(others)

    def run(state):
        out = jax.block_until_ready(compiled(*state, *rest))
        return out[:2] if step.optimizer is not None else state

    state = run(state)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state = run(state)
        times.append(time.perf_counter() - start)
    return Timing(median=statistics.median(times), min=min(times), max=max(times), repeats=repeats)
