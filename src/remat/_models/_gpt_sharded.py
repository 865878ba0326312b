"""The demo GPT laid out over a device mesh: batch over ``data``, parameters over ``fsdp``.

Data parallelism splits the batch: every device runs the whole model on ``batch / data``
sequences. FSDP (fully sharded data parallelism, ZeRO-3) also splits every parameter over the
``fsdp`` axis, and XLA gathers a layer's weights just before it is used. With a mesh of shape
``(data=4, fsdp=2)`` on 8 devices, the tokens are cut 4 ways along the batch and each weight 2
ways. The loss function is the unchanged `remat._models._gpt.make_gpt` one: JAX's SPMD partitioner
(GSPMD) propagates the argument shardings through it, so `remat.measure`, `remat.apply` and
`remat.plan` see an ordinary function whose arguments happen to be sharded.

Which dimension of a parameter is split: the largest one that the ``fsdp`` axis divides
(the last such, on ties), never the leading ``layers`` axis of the scanned blocks' stacked
weights, since the layer scan slices that axis one layer at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ._gpt import make_gpt

_TOO_FEW_DEVICES = (
    "`remat._models._gpt_sharded.make_mesh` got shape {shape}, which needs {need} devices, but JAX "
    "has {have}. On CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={need} before "
    "importing jax (or `jax.config.update('jax_num_cpu_devices', {need})`)."
)
_BATCH_NOT_DIVISIBLE = (
    "`remat._models._gpt_sharded.make_sharded_gpt` got batch={batch}, which the {axis!r} mesh axis "
    "(size {size}) does not divide; use a batch that is a multiple of {size}."
)


def make_mesh(shape: Sequence[int] = (4, 2), axis_names: Sequence[str] = ("data", "fsdp")) -> Mesh:
    """A mesh over the first ``prod(shape)`` devices, with automatic (GSPMD) axes.

    Example:
      >>> from remat._models._gpt_sharded import make_mesh
      >>> dict(make_mesh((1,), ("data",)).shape)
      {'data': 1}
    """
    need = int(np.prod(shape))
    devices = jax.devices()
    if len(devices) < need:
        raise ValueError(_TOO_FEW_DEVICES.format(shape=tuple(shape), need=need, have=len(devices)))
    grid = np.array(devices[:need]).reshape(tuple(shape))
    return Mesh(grid, tuple(axis_names))


def fsdp_spec(shape: Sequence[int], size: int, axis: str = "fsdp", *, stacked: bool = False) -> P:
    """The `PartitionSpec` that splits the largest dimension ``size`` divides over ``axis``.

    Args:
      shape: the parameter's shape.
      size: the size of the mesh axis.
      axis: the mesh axis name.
      stacked: whether dimension 0 is a stacked ``layers`` axis, which is never split.

    Returns:
      A spec with ``axis`` at one dimension, or the replicated ``P()`` when none divides.

    Example:
      >>> from remat._models._gpt_sharded import fsdp_spec
      >>> fsdp_spec((4, 16, 48), 2, stacked=True)
      P(None, None, 'fsdp')
      >>> fsdp_spec((3,), 2)
      P()
    """
    first = 1 if stacked else 0
    best = None
    for dim in range(first, len(shape)):
        if shape[dim] % size == 0 and (best is None or shape[dim] >= shape[best]):
            best = dim
    if best is None or size == 1:
        return P()
    return P(*([None] * best), axis)


def shard_params(params: Any, mesh: Mesh, axis: str = "fsdp", stacked: str = "blocks") -> Any:
    """Places every leaf of ``params`` on ``mesh``, split over ``axis`` by `fsdp_spec`.

    Leaves under the top-level key ``stacked`` have a leading layers axis, which stays whole.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._models._gpt_sharded import make_mesh, shard_params
      >>> placed = shard_params({"w": jnp.ones((4, 2))}, make_mesh((1,), ("fsdp",)))
      >>> placed["w"].sharding.spec
      P()
    """
    size = mesh.shape[axis]

    def place(path, leaf):
        top = path[0].key if path and hasattr(path[0], "key") else None
        spec = fsdp_spec(leaf.shape, size, axis, stacked=top == stacked)
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(place, params)


def make_sharded_gpt(
    mesh: Mesh, *, data_axis: str = "data", fsdp_axis: str = "fsdp", **gpt_kwargs: Any
) -> tuple[Callable[..., jax.Array], tuple[Any, jax.Array]]:
    """`remat._models._gpt.make_gpt`, with the tokens split over ``data_axis`` and parameters over
    ``fsdp_axis`` of ``mesh``.

    Args:
      mesh: a mesh with axes ``data_axis`` and ``fsdp_axis`` (see `make_mesh`).
      data_axis: the mesh axis the batch is split over.
      fsdp_axis: the mesh axis the parameters are split over.
      **gpt_kwargs: passed to `remat._models._gpt.make_gpt` (``layers``, ``d_model``, ``seq``,
        ``batch``, ...); ``batch`` must be a multiple of the ``data_axis`` size.

    Returns:
      ``(loss_fn, (params, tokens))`` as `make_gpt` returns them, with the arrays placed on
      ``mesh``. Differentiate with respect to argument 0.

    Raises:
      ValueError: the batch is not a multiple of the ``data_axis`` size.

    Example:
      >>> from remat._models._gpt_sharded import make_mesh, make_sharded_gpt
      >>> mesh = make_mesh((1, 1))
      >>> loss_fn, (params, tokens) = make_sharded_gpt(mesh, layers=1, d_model=8, seq=4,
      ...                                              batch=2, heads=2)
      >>> tokens.sharding.spec
      P('data',)
    """
    loss_fn, (params, tokens) = make_gpt(**gpt_kwargs)
    size = mesh.shape[data_axis]
    if tokens.shape[0] % size:
        raise ValueError(
            _BATCH_NOT_DIVISIBLE.format(batch=tokens.shape[0], axis=data_axis, size=size)
        )
    tokens = jax.device_put(tokens, NamedSharding(mesh, P(data_axis)))
    return loss_fn, (shard_params(params, mesh, fsdp_axis), tokens)


_CHILD = "REMAT_SHARDED_CHILD"


def rerun_with_devices(n: int, argv: Sequence[str]) -> int | None:
    """Runs ``python -m remat *argv`` with ``n`` CPU devices unless this process has ``n``.

    JAX fixes the number of CPU devices when it starts, so a process with fewer devices
    starts a child with ``XLA_FLAGS=--xla_force_host_platform_device_count=n``.

    Returns:
      None when this process already has ``n`` devices (go on here), else the child's exit
      status.

    Raises:
      RuntimeError: when the child itself has fewer than ``n`` devices (the flag was ignored).
    """
    if jax.device_count() >= n:
        return None
    if os.environ.get(_CHILD):
        raise RuntimeError(
            f"`remat demo --sharded` needs {n} devices but JAX has {jax.device_count()} even "
            f"with XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}."
        )
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env[_CHILD] = "1"
    return subprocess.run([sys.executable, "-m", "remat", *argv], env=env).returncode


def demo_argv(args: Any, sizes: Mapping[str, int]) -> list[str]:
    """The ``remat demo --sharded ...`` command line that repeats ``args``."""
    argv = ["demo", "--sharded", "--repeats", str(args.repeats), "--out", str(args.out)]
    for name in sizes:
        argv += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return argv
