"""Shared test helpers: `tree_allclose` with tolerances that follow the dtype."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from remat._core._budget import MIB
from remat._measure._measurement import Measurement, Timing

jax.config.update("jax_enable_x64", False)

# JAX's persistent compilation cache, in one folder per test run: the suite compiles the same
# small programs in many tests (shared models, the plain twin of every checkpointed one), and a
# program compiled before, by this process or another, is read back instead. The process that
# imports this file first (pytest's, or pytest-xdist's controller, before it starts its workers)
# makes the folder, hands it to the others in REMAT_TEST_XLA_CACHE, and removes it at exit.
# An entry read while another worker still writes it fails to load: JAX warns and compiles
# (`pytest_configure` lets that warning pass). No size limit: JAX's limit scans
# the whole folder at every write.
# Memory analysis, cost analysis and HLO text of a cached executable are those of the compile
# that wrote it. Set REMAT_TEST_COMPILE_CACHE=0 to compile everything afresh.
if os.environ.get("REMAT_TEST_COMPILE_CACHE", "1") != "0":
    _CACHE = os.environ.get("REMAT_TEST_XLA_CACHE")
    if not _CACHE or not os.path.isdir(_CACHE):
        _CACHE = tempfile.mkdtemp(prefix="remat-tests-xla-cache-")
        os.environ["REMAT_TEST_XLA_CACHE"] = _CACHE
        atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config):
    """JAX's warning about a cache entry it could not read passes (above), after the
    configuration's own filters (``error``)."""
    config.addinivalue_line(
        "filterwarnings", "ignore:Error reading persistent compilation cache entry"
    )


# (rtol, atol) per dtype: loose enough for reassociation, tight enough to catch a wrong gradient.
_TOLERANCES = {
    jnp.dtype(jnp.float64): (1e-10, 1e-12),
    jnp.dtype(jnp.float32): (1e-5, 1e-6),
    jnp.dtype(jnp.bfloat16): (2e-2, 2e-2),
    jnp.dtype(jnp.float16): (2e-3, 2e-3),
}


def tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing two computations in ``dtype``."""
    return _TOLERANCES.get(jnp.dtype(dtype), (1e-5, 1e-6))


def tree_allclose(a, b, *, scale: float = 1.0) -> bool:
    """True when two pytrees have the same structure, shapes, dtypes and close values.

    ``scale`` multiplies the dtype's tolerance (for long reductions).
    """
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        rtol, atol = tolerance(x.dtype)
        if not np.allclose(
            np.asarray(x, np.float64),
            np.asarray(y, np.float64),
            rtol=rtol * scale,
            atol=atol * scale,
        ):
            return False
    return True


def assert_tree_allclose(a, b, *, scale: float = 1.0) -> None:
    """Asserts `tree_allclose`, with the largest difference in the message."""
    if tree_allclose(a, b, scale=scale):
        return
    diffs = jax.tree_util.tree_map(
        lambda x, y: (
            float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))))
            if jnp.shape(x) == jnp.shape(y)
            else f"shape {jnp.shape(x)} != {jnp.shape(y)}"
        ),
        a,
        b,
    )
    raise AssertionError(f"trees differ; max abs difference per leaf: {diffs}")


def nnx_stack(layers: int, width: int):
    """A stack of ``layers`` `nnx.Linear` + sin blocks run by `nnx.scan`.

    Returns ``(loss, state)``: ``loss(state, x)`` merges the stacked blocks and scans ``x``
    (``(batch, width)``) through them, summing the squares of the output.
    """
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(width, width, rngs=rngs)

        def __call__(self, h):
            return jnp.sin(self.linear(h))

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return Block(nnx.Rngs(key))

    graphdef, state = nnx.split(make(jax.random.split(jax.random.key(0), layers)))

    def loss(state, x):
        blocks = nnx.merge(graphdef, state)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(h, block):
            return block(h)

        return jnp.sum(run(x, blocks) ** 2)

    return loss, state


### Report rows (hand-made measurements, shared by the report and CLI tests)


def row(peak_mib, gflops, ms=10.0, residuals=(), eliminated=False, timed=True):
    peak = int(peak_mib * MIB)
    return Measurement(
        peak_bytes=peak,
        peak_source="temp+argument+output-alias",
        temp_bytes=peak - 1000,
        argument_bytes=600,
        output_bytes=500,
        alias_bytes=100,
        residuals=tuple(residuals),
        residual_bytes=sum(r.total_bytes for r in residuals),
        flops=gflops * 1e9,
        forward_flops=gflops * 1e9 / 3,
        recompute_requested=True,
        recompute_eliminated=eliminated,
        compile_seconds=0.25,
        seconds=Timing(ms / 1e3, ms / 1e3 * 0.9, ms / 1e3 * 1.3, 3) if timed else None,
        strategy="x",
    )


# peak MiB, GFLOPs: the front (hand-worked) is none/everything (tie), dots, full, binomial.
ROWS = (
    ("none", row(40, 3.0, 20)),
    ("everything", row(40, 3.0, 21)),
    ("full", row(12, 4.0, 27)),
    ("dots", row(22, 3.05, 22)),
    ("dots_no_batch", row(23, 3.3, 23)),  # dominated by dots
    ("names:qkv,attn_out", row(25, 3.5, 24, eliminated=True)),  # dominated by dots
    ("full+binomial(2)", row(8, 5.0, 33)),
    ("worse_than_full", row(12, 4.5, 30)),  # same peak as full, more FLOPs
)


def mlp_stack(layers=8, d=16, batch=128, act=jnp.tanh, seed=0):
    """A scanned stack of two-matmul residual blocks, and its (params, x)."""

    def block(h, w):
        w1, w2 = w
        return h + act(h @ w1) @ w2, None

    def loss(params, x):
        h, _ = jax.lax.scan(block, x, params)
        return jnp.mean(h**2)

    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = (
        jax.random.normal(k1, (layers, d, 4 * d)) / jnp.sqrt(d),
        jax.random.normal(k2, (layers, 4 * d, d)) / jnp.sqrt(4 * d),
    )
    return loss, (params, jax.random.normal(k3, (batch, d)))


def fixed_save_sets(loss, args, saves=(True, False, "unfused")):
    """The one scan of ``loss`` planned alone (`ScanInfo`), its length, and its calibration
    points' save sets (`_options.fixed_choice`: every needed value saved, none, the unfused
    values)."""
    from remat._plan._costmodel import model_scans
    from remat._plan._options import assemble, candidates, fixed_choice
    from remat._trace._tag import planned_scans

    (info,) = infos = planned_scans(loss, *args)
    models = model_scans(infos)
    cands = candidates(models, False)
    _, _, offsets = assemble(cands)
    choices = [
        fixed_choice(cands, offsets, models, [0], save=s).choices[info.position] for s in saves
    ]
    return info, models[0].length, choices
