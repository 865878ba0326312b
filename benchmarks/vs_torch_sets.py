"""What torch keeps at each budget of `benchmarks/vs_torch.py`, layer by layer, beside what
remat can keep: the layer's Pareto front, and the values outside the layers' scan.

On the models of `benchmarks/vs_torch.py` (same sizes, same parameters):

- torch: the saved tensors of its partitioned graphs (as `vs_torch.torch_at_budget` reads
  them) at 50%, 25% and 10%, each assigned to the block whose forward node produced it
  (``nn_module_stack``), or to the code outside the blocks (embedding, final LayerNorm,
  logits, loss); and the matmul FLOPs it recomputes.
- remat: the layer's Pareto front as the planner finds it (`remat._plan._perlayer.pareto_points`
  on the calibrated model): bytes saved per layer and FLOPs recomputed; and what autodiff
  keeps outside the scan (`remat.measure(...).residuals` of one copy, counted as
  `vs_torch.saved_activations` counts them) with the layers at the front's second point,
  for the code after the scan as written and checkpointed (``head_policy`` of
  `vs_torch.make_jax_loss`: saving its matmul outputs, or nothing), and with the layers run
  as segments (the form of a per-layer plan, `remat._trace._ends`): saved bytes, compiled
  peak and FLOPs.

Usage:
  PYTHONPATH=src python benchmarks/vs_torch_sets.py [--arch gpt,mlp] [--no-write]
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import remat
import vs_torch
from bench_common import MIB, compiled_peak, markdown_table, section_start, write_section
from remat._plan._calibrate import prepare
from remat._plan._perlayer import pareto_points
from remat._trace._tag import ScanChoice, rewrite

MARKERS = ("<!-- vs_torch_sets:start -->", "<!-- vs_torch_sets:end -->")
SEGMENTS = "the layers as segments (the planner's form): recomputed before, checkpointed after"
HEADS = {
    "as written": None,
    "checkpointed, saving its matmul outputs": jax.checkpoint_policies.dots_saveable,
    "checkpointed, saving nothing": jax.checkpoint_policies.nothing_saveable,
}


def block_of(node) -> int | None:
    """The block index of a forward node (``blocks.3`` in its module stack), or None; a
    view, transpose or copy the partitioner made has no module stack and belongs to the
    block of the tensor it views."""
    import torch

    for _ in range(8):
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            found = re.search(r"blocks\.(\d+)", path)
            if found:
                return int(found.group(1))
        sources = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if not sources or not re.search(r"view|permute|transpose|expand|clone|\bt\b",
                                         str(node.target)):  # fmt: skip
            return None
        node = sources[0]
    return None


def torch_layers(model, inputs, budget: float, layers: int) -> dict:
    """torch's saved bytes per block and outside them at ``budget``."""
    import torch

    r = vs_torch.torch_at_budget(model, inputs, budget, repeats=1)
    fw = {n.name: n for n in r["graphs"]["fw"].graph.nodes}
    per_layer, outside = [0] * layers, 0
    for node in r["graphs"]["bw"].graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if node.name.startswith(("tangents", "primals")) or not isinstance(val, torch.Tensor):
            continue
        nbytes = val.numel() * val.element_size()
        block = block_of(fw[node.name]) if node.name in fw else None
        if block is None:
            outside += nbytes
        else:
            per_layer[block] += nbytes
    return dict(budget=budget, saved=r["saved"], per_layer=per_layer, outside=outside,
                recomputed=r["recomputed"])  # fmt: skip


def remat_front(loss, args, base_flops: float) -> tuple[list, list[str]]:
    """The layer's Pareto front: (point, names) pairs, fewest FLOPs first."""
    prep = prepare(loss, args, 0, True)
    cand = next(c for c in prep.cands if c.schedule == "per_step")
    model = prep.models[cand.scan]
    points = pareto_points(cand, model.length, prep.stored, prep.slice, prep.weight)
    return [(p, tuple(sorted(model.values[i].name for i in p.saved))) for p in points], model


def outside_bytes(m: remat.Measurement, args) -> int:
    """Saved bytes outside any scan (one copy: multiplicity 1), as `saved_activations`."""
    return vs_torch.saved_activations(m, args) - sum(
        r.total_bytes for r in m.residuals if r.multiplicity > 1 and r.primitive != "argument"
    )


def run(kind: str) -> dict:
    import torch

    sizes = vs_torch.FULL
    layers = sizes["layers"]
    np_params = vs_torch.init_params(kind, **sizes)
    np_inputs = vs_torch.init_inputs(kind, **sizes)
    args = (jax.tree.map(jnp.asarray, np_params), jnp.asarray(np_inputs))
    loss = vs_torch.make_jax_loss(kind, sizes["heads"])
    base = remat.measure(loss, *args)
    print(f"== {kind}", flush=True)

    torch.manual_seed(0)
    model = vs_torch.make_torch_model(kind, np_params, sizes["heads"])
    t_inputs = torch.tensor(np_inputs.astype(np.int64) if kind == "gpt" else np_inputs)
    torch.set_num_threads(1)
    torch_rows = [torch_layers(model, t_inputs, f, layers) for f in vs_torch.FRACTIONS]
    front, scan = remat_front(loss, args, base.flops)

    point, names = front[1]
    heads = []
    for label, policy in HEADS.items():
        fn = rewrite(vs_torch.make_jax_loss(kind, sizes["heads"], policy),
                     {scan.index: ScanChoice(names=names)})  # fmt: skip
        m = remat.measure(fn, *args)
        heads.append(dict(label=label, saved=vs_torch.saved_activations(m, args),
                          outside=outside_bytes(m, args), peak=compiled_peak(m),
                          flops=m.flops))  # fmt: skip
        print(f"  head {label}: {heads[-1]}", flush=True)
    # The same set in every layer run as segments: the code before the scan that makes its
    # carry recomputed, the code after it checkpointed saving its matmul outputs
    # (`remat._trace._ends`).
    pattern = (names,) * layers
    m = remat.measure(rewrite(loss, {scan.index: ScanChoice(names=names, pattern=pattern)}), *args)
    heads.append(dict(label=SEGMENTS, saved=vs_torch.saved_activations(m, args),
                      outside=outside_bytes(m, args), peak=compiled_peak(m), flops=m.flops))  # fmt: skip
    print(f"  {SEGMENTS}: {heads[-1]}", flush=True)
    return dict(kind=kind, torch=torch_rows, front=front, heads=heads, base=base,
                layers=layers, point=point)  # fmt: skip


def section(results: list[dict], wall: float) -> str:
    parts = section_start(MARKERS, "What torch keeps, layer by layer "
                          "(`benchmarks/vs_torch_sets.py`)", wall,
                          "PYTHONPATH=src python benchmarks/vs_torch_sets.py")  # fmt: skip
    parts += [
        "Bytes and FLOPs are exact and repeat.",
        "",
        "The models of the section above. torch: its saved tensors at each budget, assigned "
        "to the block whose forward node made them (the rest: embedding, final LayerNorm, "
        "logits, loss). remat: the layer's Pareto front (what a layer can save, and what it "
        "then recomputes), and what autodiff keeps outside the scan, with the code after the "
        "scan as written and checkpointed (`jax.checkpoint` with a policy), and as a per-layer "
        "plan runs the scan (segments: the code before the scan that makes its carry "
        "recomputed, the code after it checkpointed saving its matmul outputs, "
        "`remat._trace._ends`). In the segments row the scan's stacked carries are one "
        "stack per run, counted outside the scan (`of which outside` then holds 7 of the 8 "
        "layers' inputs).",
    ]
    for r in results:
        base, L = r["base"], r["layers"]
        rows = [
            [f"{t['budget']:.0%}", f"{t['saved'] / MIB:.2f}",
             " ".join(f"{b / MIB:.2f}" for b in t["per_layer"]), f"{t['outside'] / MIB:.2f}",
             f"+{t['recomputed'] / base.flops:.2%}"]
            for t in r["torch"]
        ]  # fmt: skip
        front = [
            [str(k), f"{p.step_bytes / MIB:.2f}", f"{L * p.step_bytes / MIB:.2f}",
             f"+{L * p.flops / base.flops:.2%}", str(len(names))]
            for k, (p, names) in enumerate(r["front"])
        ]  # fmt: skip
        heads = [
            [h["label"], f"{h['saved'] / MIB:.2f}", f"{h['outside'] / MIB:.2f}",
             f"{h['peak'] / MIB:.2f}", f"+{h['flops'] / base.flops - 1:.2%}"]
            for h in r["heads"]
        ]  # fmt: skip
        parts += [
            "", f"### {r['kind']}", "",
            "torch's saved tensors:", "",
            markdown_table(("budget", "saved MiB", f"per block 0..{L - 1}, MiB",
                            "outside the blocks MiB", "FLOPs recomputed"), rows),
            "", "remat: the layer's Pareto front (the planner's model):", "",
            markdown_table(("point", "saved per layer MiB", f"x {L} layers MiB",
                            "FLOPs recomputed", "values saved"), front),
            "", f"remat with every layer at point 1 (+{L * r['point'].flops / base.flops:.2%}),"
            " the code after the scan as written and checkpointed:", "",
            markdown_table(("code after the scan", "saved MiB", "of which outside the scan",
                            "compiled peak MiB", "FLOPs over none"), heads),
        ]  # fmt: skip
    parts.append(MARKERS[1])
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = [run(kind) for kind in args.arch.split(",")]
    write_section(MARKERS, section(results, time.perf_counter() - start), not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
