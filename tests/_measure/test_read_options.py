"""A program compiled to be read takes the analysis options, except on a GPU."""

import types

import jax
import jax.numpy as jnp

from remat._measure._hbm import compile_measured
from remat._measure._step import ANALYSIS_OPTIONS


class _Lowered:
    """A lowering for ``platform`` that records the options it is compiled with."""

    def __init__(self, platform):
        backend = types.SimpleNamespace(platform=platform)
        self._lowering = types.SimpleNamespace(compile_args={"backend": backend})
        self.seen = []

    def compile(self, options=None):
        self.seen.append(options)
        return "compiled"


def test_a_gpu_program_is_compiled_as_jax_jit_compiles_it():
    for platform in ("cuda", "rocm"):
        lowered = _Lowered(platform)
        assert compile_measured(lowered, ANALYSIS_OPTIONS) == "compiled"
        assert lowered.seen == [{}]
    # other options pass through
    lowered = _Lowered("cuda")
    compile_measured(lowered, {**ANALYSIS_OPTIONS, "xla_gpu_autotune_level": 2})
    assert lowered.seen == [{"xla_gpu_autotune_level": 2}]


def test_a_cpu_program_keeps_the_analysis_options():
    lowered = _Lowered("cpu")
    compile_measured(lowered, ANALYSIS_OPTIONS)
    assert lowered.seen == [ANALYSIS_OPTIONS]
    real = jax.jit(jnp.sin).lower(jnp.ones(4))
    assert compile_measured(real, ANALYSIS_OPTIONS).memory_analysis() is not None
