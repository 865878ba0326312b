"""A per-layer mix whose last run is one layer: its step against what its scan alone predicts.

On the models of `benchmarks/vs_torch.py`, for pairs of save sets of the layer's Pareto front
(`remat._plan._perlayer.pareto_points`: ``a`` saving more, ``b`` less), each mix of ``L - c``
layers saving ``b`` then ``c`` saving ``a`` (the planner's order), and the same layers the
other way round (``a`` first), for ``c`` of 1, 2 and ``L - 1``: the step's peak as the planner
predicts it before verifying (`remat._plan._alone.check_alone`: the scan compiled alone, with
the memory outside the scans of the un-checkpointed step, `Prepared.margin`) beside the
compiled step's peak (`remat.measure` of the program rewritten with the mix), and the FLOPs.
A run of one layer is no loop (XLA removes a loop of one step); where it is the last run,
its backward pass needs only the cotangents to start, and the scan-alone program (`_body`)
gives them once its forward pass is done, as the step does: without that, XLA started it
before the forward loop, its dump showed no forward loop wholly before a backward one
(`remat._measure._phases.loop_phases`), and the prediction fell back to the program's
temporaries (off the step by -4.72..+1.52 MiB on these models). The last column says
whether the phases were read.
Prints, writes nothing.

Usage:
  PYTHONPATH=src python benchmarks/lone_last.py [--arch gpt,mlp]
"""

from __future__ import annotations

import argparse
import sys

import remat
from bench_common import print_table
from perlayer_predict import front
from remat._plan._body import scan_memories
from remat._plan._compile import peak_of
from remat._plan._phases import contribution
from remat._shard._target import compile_device
from remat._trace._tag import ScanChoice, rewrite

MIB = 2**20
HEAD = ("sets (values saved, a/b)", "pattern", "FLOPs over none", "predicted from the scan alone MiB",
        "compiled step MiB", "step - predicted MiB", "loop phases read")  # fmt: skip


def rows_for(kind: str) -> list[list[str]]:
    loss, args, prep, info, length, _, sets = front(kind)
    pairs = [(sets[0], sets[len(sets) // 2]), (sets[len(sets) // 2], sets[-1])]
    pairs = [(a, b) for a, b in dict.fromkeys(pairs) if a != b]
    base = prep.baseline
    outside = base.argument_bytes + base.output_bytes - base.alias_bytes + (prep.margin or 0.0)
    device = compile_device(args)
    rows = []
    for a, b in pairs:
        for c in (1, 2, length - 1):
            for label, pattern in (("b then a", (b,) * (length - c) + (a,) * c),
                                   ("a then b", (a,) * c + (b,) * (length - c))):  # fmt: skip
                choice = ScanChoice(names=tuple(sorted(set(a) | set(b))), pattern=pattern)
                (alone,) = scan_memories([(info, choice, length)], device,
                                         phases=prep.phases is not None)  # fmt: skip
                predicted = outside + contribution(alone, prep.phases)
                m = remat.measure(rewrite(loss, {info.position: choice}), *args)
                runs = f"{label}, {length - c if label == 'b then a' else c} + "
                runs += f"{c if label == 'b then a' else length - c}"
                rows.append([f"{len(a)}/{len(b)}", runs, f"+{m.flops / base.flops - 1:.2%}",
                             f"{predicted / MIB:.2f}", f"{peak_of(m) / MIB:.2f}",
                             f"{(peak_of(m) - predicted) / MIB:+.2f}",
                             "no" if alone.phases is None else "yes"])  # fmt: skip
                print("  " + " | ".join(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    for kind in parser.parse_args(argv).arch.split(","):
        print(f"== {kind}", flush=True)
        print_table(kind, HEAD, rows_for(kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
