"""Can a per-layer mix's scan-alone memory be predicted from its two save sets compiled alone?

A per-layer option (`remat._plan._perlayer`) gives ``c`` of a scan's ``L`` layers one save
set and the others another. Were its scan-alone program's memory (its contribution to the
step's peak, `remat._plan._phases.contribution`) linear in ``c`` between the two sets saved in
every layer, the planner could price each mix from the uniform programs it compiles anyway
and compile only the candidate it verifies. This compiles, on the models of
`benchmarks/vs_torch.py`, the scan alone with: each of a few points of the layer's Pareto
front in every layer (as the plain scan and as segments), and mixes of pairs of them at
``c`` = 1, 2, L/2 and L-1; and prints each mix's memory beside the line through its two
endpoints, and beside the larger of the two lines `remat._plan._twolines` prices a mix by
(from the two sets as segments and their bytes saved per layer).

Usage:
  PYTHONPATH=src python benchmarks/perlayer_predict.py [--arch gpt,mlp] [--no-write]
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp

import vs_torch
from bench_common import MIB, arch_arguments, markdown_table, section_start, write_section
from remat._plan._body import scan_memories
from remat._plan._calibrate import prepare
from remat._plan._mixes import completed
from remat._plan._perlayer import pareto_points
from remat._plan._phases import contribution
from remat._plan._twolines import Sets
from remat._trace._tag import ScanChoice

MARKERS = ("<!-- perlayer_predict:start -->", "<!-- perlayer_predict:end -->")
HEAD = ("model", "points mixed (of the front)", "c of L layers saving the first",
        "mix MiB", "line through the plain scans MiB (error)",
        "line through the segments MiB (error)",
        "larger of two lines through the segments MiB (error)")  # fmt: skip


def front(kind: str) -> tuple:
    """``(loss, args, prep, info, length, points, sets)``: the vs_torch model ``kind``, its
    arguments, its `Prepared` (per-layer options completed), its scan's `ScanInfo` and
    length, the layer's Pareto front (`pareto_points`, fewest FLOPs first) and each point's
    save set."""
    sizes = vs_torch.FULL
    loss = vs_torch.make_jax_loss(kind, sizes["heads"])
    args = (
        jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
        jnp.asarray(vs_torch.init_inputs(kind, **sizes)),
    )
    prep = completed(prepare(loss, args, 0, True, per_layer=True))
    cand = next(c for c in prep.cands if c.schedule == "per_step")
    model, info = prep.models[cand.scan], prep.infos[cand.scan]
    points = pareto_points(cand, model.length, prep.stored, prep.slice, prep.weight)
    sets = [tuple(sorted(model.values[i].name for i in p.saved)) for p in points]
    return loss, args, prep, info, model.length, points, sets


def rows_of(kind: str) -> list[list[str]]:
    _, _, prep, info, length, points, sets = front(kind)
    n = len(sets)
    pairs = sorted({(0, n // 2), (n // 2, n - 1), (1, 2), (0, n - 1)} if n > 2 else {(0, 1)})
    requests, labels = [], []
    for i in sorted({i for p in pairs for i in p}):
        requests.append((info, ScanChoice(names=sets[i]), length))
        labels.append(("plain", i))
        requests.append((info, ScanChoice(names=sets[i], pattern=(sets[i],) * length), length))
        labels.append(("segments", i))
    for a, b in pairs:
        both = tuple(sorted(set(sets[a]) | set(sets[b])))
        for c in sorted({1, 2, length // 2, length - 1}):
            pattern = (sets[b],) * (length - c) + (sets[a],) * c
            requests.append((info, ScanChoice(names=both, pattern=pattern), length))
            labels.append(("mix", a, b, c))
    memories = scan_memories(requests, phases=prep.phases is not None)
    got = {k: contribution(m, prep.phases) / MIB for k, m in zip(labels, memories, strict=True)}
    rows = []
    for (form, *rest), mib in got.items():
        if form != "mix":
            continue
        a, b, c = rest
        cells = [kind, f"{a} and {b} (of {n})", f"{c} of {length}", f"{mib:.2f}"]
        for line in ("plain", "segments"):
            end_b, end_a = got[(line, b)], got[(line, a)]
            predicted = end_b + (end_a - end_b) * c / length
            cells.append(f"{predicted:.2f} ({predicted - mib:+.2f})")
        two = Sets(length, {a: points[a].step_bytes / MIB, b: points[b].step_bytes / MIB})
        two.learn((a,) * length, got[("segments", a)])
        two.learn((b,) * length, got[("segments", b)])
        price = two.price((b,) * (length - c) + (a,) * c)
        cells.append("none (a lone last layer)" if price is None
                     else f"{price:.2f} ({price - mib:+.2f})")  # fmt: skip
        rows.append(cells)
        print("  " + " | ".join(cells), flush=True)
    return rows


def section(rows: list[list[str]], wall: float) -> str:
    errors = [abs(_error(c)) for r in rows for c in r[4:6]]
    two = [abs(_error(r[6])) for r in rows if "lone" not in r[6]]
    parts = section_start(
        MARKERS, "Per-layer mixes: predicted from their save sets compiled alone? "
        "(`benchmarks/perlayer_predict.py`)", wall,
        "PYTHONPATH=src python benchmarks/perlayer_predict.py",
    )  # fmt: skip
    parts += [
        "",
        "Each mix's scan-alone memory (what the scan adds to the step's peak) beside the line "
        "through the same two save sets compiled alone in every layer, as the plain scan and "
        "as segments. The memory is not linear in the layers: it is the largest of the "
        "backward pass's phases, and which phase peaks moves with the mix (on the GPT, a mix "
        "can keep less than either of its sets in every layer). The errors of the lines reach "
        f"{max(errors):.2f} MiB, against budgets of 20-80 MiB. The larger of two lines "
        "(`remat._plan._twolines`: the first set's memory less, per layer of the first run, "
        "what a layer of it saves beyond the second; the second's less, per layer of the "
        "last run, what a layer of it saves) is within "
        f"{max(two) * 1024:.0f} KiB of every mix whose last run has two layers or more. A last "
        "run of one layer is a loop XLA inlines, off both: the planner compiles such a mix "
        "alone, and prices the others from what the programs it compiled alone show of each "
        "save set (`_twolines.Sets`), or from two mixes of the same sets "
        "(`_alone.priced_mix`).",
        "",
        markdown_table(HEAD, rows),
        MARKERS[1],
    ]
    return "\n".join(parts)


def _error(cell: str) -> float:
    return float(cell.split("(")[1].rstrip(")"))


def main(argv: list[str] | None = None) -> int:
    args, start = arch_arguments(__doc__, argv), time.perf_counter()
    rows = [r for kind in args.arch.split(",") for r in rows_of(kind)]
    print(f"load average {os.getloadavg()}")
    write_section(MARKERS, section(rows, time.perf_counter() - start), not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
