"""The compiler options of a program that remat compiles to read, per platform.

remat reads what it compiles (XLA's memory analysis, the optimised HLO, the buffer
assignment) and runs only what it times. A program compiled to be read takes
`remat._measure._step.ANALYSIS_OPTIONS` (LLVM's optimisation off): on the CPU and the TPU that
changes only the machine code, in much less time. On a GPU it is not so: XLA's GPU compiler
reads the same option in its own passes, and on an H200 (JAX 0.11.2,
`benchmarks/gpu_options.py`) the mid-size decoder's un-checkpointed Adam step compiled with it
peaked at 18,558,464,396 bytes against 18,251,149,664 with the options ``jax.jit`` uses
(+1.7%), in the same time (8.32 s against 8.35 s). So a GPU program is compiled to be read as
the user's ``jax.jit`` compiles it: the peak remat reports is the one the user's step has.
"""

from __future__ import annotations

from typing import Any

# The platforms whose compiler reads `ANALYSIS_OPTIONS` in its own passes.
GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})
# What a GPU compile to be read leaves out of the options it is given.
GPU_LEAVES_OUT = ("xla_backend_optimization_level",)


def read_options(options: dict[str, Any] | None, platform: str) -> dict[str, Any] | None:
    """``options`` for a compile on ``platform`` that is read, never run: on a GPU, without
    `GPU_LEAVES_OUT` (see the module docstring); elsewhere ``options`` itself.

    Example:
      >>> from remat._measure._read_options import read_options
      >>> read_options({"xla_backend_optimization_level": 0}, "cuda")
      {}
      >>> read_options({"xla_backend_optimization_level": 0}, "cpu")
      {'xla_backend_optimization_level': 0}
    """
    if not options or platform not in GPU_PLATFORMS:
        return options
    return {k: v for k, v in options.items() if k not in GPU_LEAVES_OUT}
