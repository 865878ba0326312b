"""What XLA's memory analysis says of a TPU program against the HBM its buffer assignment holds.

The TPU compiler checks a program against the chip's HBM on its buffer assignment (the
allocations in memory space 0). Its memory analysis gives ``temp + argument + output -
alias`` (remat's TPU rule before it read the buffer assignment) and ``peak_memory_in_bytes``;
this script compiles Llama-3-8B steps of a few layers with FSDP on a v5e-16, as
`benchmarks/tpu_bench.py` compiles the full 32 (same widths, one sequence of 4096 tokens per
chip), and prints the three figures per chip (docs/tpu.md quotes them).

Usage (needs libtpu: ``pip install 'remat[tpu]'``):
  PYTHONPATH=src python benchmarks/tpu_hbm.py [--layers 2 4] [--presets save_qkv_proj]
"""

from __future__ import annotations

import argparse
import os
import time

import remat
from remat._measure._hbm import compile_measured
from remat._measure._peak import compiled_memory
from remat._measure._step import lower_step
from remat._models._maxtext import PRESETS
from tpu_bench import LLAMA_8B, placed

GIB = 2.0**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--presets", nargs="+", default=["save_qkv_proj"])
    opts = parser.parse_args()
    target = remat.parse_target("tpu:v5e-16")
    print("layers, preset: temp + argument + output - alias | peak_memory_in_bytes | "
          "HBM of the buffer assignment (GiB per chip), compile s", flush=True)  # fmt: skip
    for layers in opts.layers:
        for preset in opts.presets:
            sizes = {**LLAMA_8B, "layers": layers, "batch": 16, "seq": 4096}
            loss, args = placed(PRESETS[preset], sizes, target, "fsdp")
            start = time.perf_counter()
            compiled = compile_measured(lower_step(loss, args, 0))
            seconds = time.perf_counter() - start
            m = compiled_memory(compiled)
            parts = m.temp_bytes + m.argument_bytes + m.output_bytes - m.alias_bytes
            backend = compiled.memory_analysis().peak_memory_in_bytes
            print(f"{layers:3d}, {preset}: {parts / GIB:.3f} | {backend / GIB:.3f} | "
                  f"{m.peak_bytes / GIB:.3f} ({m.peak_source}), {seconds:.0f} s", flush=True)  # fmt: skip
    print("load average (1/5/15 min): " + " / ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
