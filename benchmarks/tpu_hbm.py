"""What XLA's memory analysis says of a TPU program against the HBM its buffer assignment holds.

The TPU compiler checks a program against the chip's HBM on its buffer assignment (the
allocations in memory space 0). Its memory analysis gives ``temp + argument + output -
alias`` (remat's TPU rule before it read the buffer assignment) and ``peak_memory_in_bytes``;
this script compiles Llama-3-8B steps of a few layers with FSDP on a v5e-16, as
`benchmarks/tpu_bench.py` compiles the full 32 (same widths, one sequence of 4096 tokens per
chip), and prints the three figures per chip (docs/tpu.md quotes them). ``--mlp`` compiles
a scanned bf16 MLP (8 layers, 16384 tokens split over a v5e 2x2, 1024 -> 4096) data
parallel and with its weights sharded (FSDP), as written and checkpointed, instead.

``--by-op`` adds each step's matmul FLOPs per chip by the JAX operation they come from (the
HLO's ``op_name``; a matmul the compiler repeats keeps its name). ``--run N`` compiles
`tpu_bench.py`'s run N (its model, slice, batch and placement) instead, ``--slice`` another
slice of as many chips (the same program with more HBM: a v5p's 95 GiB for a v5e's 16), and
``--presets`` takes ``a,b`` for the values named ``a`` and ``b`` too. The TPU compiler logs its
own rematerialization (its limit, 95% of the HBM it gives a program, and the bytes before and
after) to stderr with ``TPU_STDERR_LOG_LEVEL=0 TPU_MIN_LOG_LEVEL=0``.

Usage (needs libtpu: ``pip install 'remat[tpu]'``):
  PYTHONPATH=src python benchmarks/tpu_hbm.py [--layers 2 4] [--presets save_qkv_proj] [--by-op]
  PYTHONPATH=src python benchmarks/tpu_hbm.py --mlp
  PYTHONPATH=src python benchmarks/tpu_hbm.py --run 0 --layers 16 --by-op   # tpu_bench's run 0
  PYTHONPATH=src python benchmarks/tpu_hbm.py --run 0 --layers 16 --slice tpu:v5p-8  # more HBM
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import remat
from remat._measure import _hlo
from remat._measure._hbm import compile_measured
from remat._measure._hlo import hlo_flops
from remat._measure._peak import compiled_memory
from remat._measure._step import lower_step
from remat._models._maxtext import PRESETS
from tpu_bench import LLAMA_8B, RUNS, placed

GIB = 2.0**30
MIB = 2.0**20


def figures(compiled) -> tuple[int, int, int, str]:
    """``(temp + argument + output - alias, peak_memory_in_bytes, remat's peak, its source)``."""
    m = compiled_memory(compiled)
    parts = m.temp_bytes + m.argument_bytes + m.output_bytes - m.alias_bytes
    return parts, compiled.memory_analysis().peak_memory_in_bytes, m.peak_bytes, m.peak_source


def flops_by_op(text: str) -> collections.Counter:
    """Matmul FLOPs of an optimised HLO module per ``op_name``, loop bodies times their trips
    (`remat._measure._hlo`'s count, split by the operation each matmul comes from)."""
    counter = _hlo._Counter(text)
    memo: dict[str, collections.Counter] = {}

    def walk(comp: str) -> collections.Counter:
        if comp in memo:
            return memo[comp]
        out: collections.Counter = collections.Counter()
        shapes = counter.shapes.get(comp, {})
        for ins in counter.comps.get(comp, []):
            name = re.search(r'op_name="([^"]*)"', ins.attrs)
            name = re.sub(r"^jit\([^)]*\)/|/(dot_general|conv[^/]*)$", "", name[1] if name else "?")
            if ins.opcode == "dot" and ins.operands:
                contracting = _hlo._int_list(ins.attrs, "lhs_contracting_dims")
                out[name] += _hlo._dot_flops(
                    ins.shape, shapes.get(ins.operands[0], ""), contracting
                )
            elif ins.opcode == "convolution" and len(ins.operands) >= 2:
                lhs, kernel = (shapes.get(o, "") for o in ins.operands[:2])
                out[name] += _hlo._conv_flops(ins.shape, lhs, kernel, ins.attrs)
            elif ins.opcode == "while":
                trips = counter._trip_count(ins, comp)
                for body in _hlo._called(ins.attrs, "body"):
                    out.update({k: trips * v for k, v in walk(body).items()})
            elif ins.opcode in ("fusion", "call", "custom-call") or ins.opcode.endswith("-start"):
                for key in ("calls", "to_apply", "called_computations"):
                    for called in _hlo._called(ins.attrs, key):
                        out.update(walk(called))
        memo[comp] = out
        return out

    return walk(counter.entry)


def mlp() -> None:
    """The scanned MLP on a v5e 2x2, data parallel and FSDP, as written / `dots` / `full`."""
    mesh = remat.parse_target("tpu:v5e:2x2").mesh()

    def body(h, w):
        return h + jnp.tanh(h @ w[0]) @ w[1], None

    def loss_of(policy):
        step = body if policy is None else jax.checkpoint(body, policy=policy)

        def loss(p, x):
            h, _ = jax.lax.scan(step, x, p)
            return jnp.mean(h.astype(jnp.float32) ** 2)

        return loss

    def on(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))

    policies = {"as written": None, "dots": jax.checkpoint_policies.dots_saveable,
                "full": jax.checkpoint_policies.nothing_saveable}  # fmt: skip
    print("placement, step: temp + argument + output - alias | peak_memory_in_bytes | "
          "HBM of the buffer assignment (MiB per chip)")  # fmt: skip
    x = on((16384, 1024), P("fsdp"))
    for placement in ("data", "fsdp"):
        fsdp = placement == "fsdp"
        ws = (on((8, 1024, 4096), P(None, "fsdp") if fsdp else P()),
              on((8, 4096, 1024), P(None, None, "fsdp") if fsdp else P()))  # fmt: skip
        for name, policy in policies.items():
            parts, backend, peak, source = figures(
                compile_measured(lower_step(loss_of(policy), (ws, x), 0))
            )
            print(f"{placement}, {name}: {parts / MIB:.2f} | {backend / MIB:.2f} | "
                  f"{peak / MIB:.2f} ({source})", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["save_qkv_proj"],
        help="MaxText presets, or names to save (value_proj,out_proj)",
    )
    parser.add_argument("--mlp", action="store_true", help="the scanned MLP on a v5e 2x2")
    parser.add_argument("--by-op", action="store_true", help="FLOPs per JAX operation")
    parser.add_argument("--run", type=int, help="tpu_bench.py's RUNS[N] instead of 8B FSDP")
    parser.add_argument("--slice", help="compile for this slice instead (e.g. tpu:v5p-8)")
    opts = parser.parse_args()
    if opts.mlp:
        mlp()
        print("load average (1/5/15 min): " + " / ".join(f"{x:.1f}" for x in os.getloadavg()))
        return
    model, base, slice_, batch, seq, parallelism = (
        RUNS[opts.run] if opts.run is not None
        else ("Llama-3-8B", LLAMA_8B, "tpu:v5e-16", 16, 4096, "fsdp")
    )  # fmt: skip
    slice_ = opts.slice or slice_
    target = remat.parse_target(slice_)
    print(f"{model} on {slice_}, {parallelism}, {batch} x {seq}", flush=True)
    print("layers, preset: temp + argument + output - alias | peak_memory_in_bytes | "
          "HBM of the buffer assignment (GiB per chip), TFLOP per chip, compile s",
          flush=True)  # fmt: skip
    for layers in opts.layers:
        for preset in opts.presets:
            sizes = {**base, "layers": layers, "batch": batch, "seq": seq}
            names = PRESETS[preset] if preset in PRESETS else tuple(preset.split(","))
            loss, args = placed(names, sizes, target, parallelism)
            start = time.perf_counter()
            compiled = compile_measured(lower_step(loss, args, 0))
            seconds = time.perf_counter() - start
            parts, backend, peak, source = figures(compiled)
            flops = hlo_flops(compiled.as_text())
            print(f"{layers:3d}, {preset}: {parts / GIB:.3f} | {backend / GIB:.3f} | "
                  f"{peak / GIB:.3f} ({source}), {flops / 1e12:.2f}, {seconds:.0f} s",
                  flush=True)  # fmt: skip
            if opts.by_op:
                for name, n in flops_by_op(compiled.as_text()).most_common():
                    print(f"      {n / 1e12:8.3f}  {name}")
    print("load average (1/5/15 min): " + " / ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
