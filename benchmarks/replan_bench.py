"""A re-plan against a fresh plan: the un-checkpointed Llama decoder (`scale_bench.MODELS`,
from shapes, bf16 on float32 weights, Adam) planned at MaxText preset ``--first``'s compiled
peak, then at ``--then``'s in the same process (a re-plan: it starts from what the first plan
learnt, the memory outside the scans included; ``--then a,b,c`` re-plans at each in turn, as
`scale_bench`'s presets row does), then at the last ``--then``'s again after
`remat._plan._memo.forget` (a fresh plan). Prints, per plan, the compiled and predicted peak,
the FLOPs against the preset's, the step and scan-alone compiles and the memory outside the
scans each measured point showed (`_memo.margins`).

Usage:
  PYTHONPATH=src python benchmarks/replan_bench.py [--model Llama-3-8B] [--seq 4096]
      [--first minimal] [--then save_dot_with_context_except_mlp[,save_out_proj,...]]

Timings are wall-clock seconds on a shared machine (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import time

from scale_bench import MODELS, sizes_of

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-3-8B", choices=sorted(MODELS))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--first", default="minimal")
    parser.add_argument("--then", default="save_dot_with_context_except_mlp")
    a = parser.parse_args()

    import optax

    import remat
    from remat._measure._hlo import hlo_flops
    from remat._measure._peak import peak_bytes
    from remat._measure._step import Step, as_step, lower_step
    from remat._models._maxtext import PRESETS, decoder_shapes
    from remat._plan import _memo

    opt = optax.adam(1e-4)
    sizes = sizes_of(MODELS[a.model], a.seq)
    loss, args = decoder_shapes(None, sizes)
    print(f"{a.model}, sequence {a.seq}; load {os.getloadavg()}", flush=True)
    presets = {}
    then = a.then.split(",")
    for name in (a.first, *then):
        ploss, pargs = decoder_shapes(PRESETS[name], sizes)
        compiled = lower_step(ploss, pargs, as_step(Step(0, False, opt))).compile()
        presets[name] = peak_bytes(compiled), hlo_flops(compiled.as_text())
        print(f"preset {name}: peak {presets[name][0]} bytes", flush=True)

    def row(label: str, name: str) -> None:
        peak, flops = presets[name]
        start = time.perf_counter()
        p = remat.plan(loss, *args, budget=peak, optimizer=opt, verbose=False)
        seconds = time.perf_counter() - start
        (know,) = _memo._MEMORY.values()
        margins = getattr(_memo, "margins", lambda *_: [])  # (absent from older versions)
        shown = sorted({round(m / GIB, 3) for m in margins(know.prepared, know)})
        print(
            f"{label:8s} at {name}'s peak {peak / GIB:.2f} GiB: compiled "
            f"{p.measured_peak_bytes / GIB:.2f}, predicted {p.predicted_peak_bytes / GIB:.2f} "
            f"GiB, FLOPs {p.measured.flops / flops:.4f}x the preset's, "
            f"{p.stats.step_compiles} step + {p.stats.scan_compiles} scan compiles, "
            f"{seconds:.1f} s; margins seen {shown} GiB; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )

    _memo.forget()
    row("first", a.first)
    for name in then:
        row("re-plan", name)
    _memo.forget()
    row("fresh", then[-1])


if __name__ == "__main__":
    main()
