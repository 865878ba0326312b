"""`remat.plan` against MaxText's ``remat_policy`` presets, on a decoder built MaxText's way.

The decoder (flax linen) is written the way MaxText writes its layers: an ``nn.scan`` over
``nn.remat(layer, policy=..., prevent_cse=False)`` (``scan_layers=True``), with the
``checkpoint_name``s MaxText puts on the same values: ``decoder_layer_input``;
``query_proj``, ``key_proj``, ``value_proj`` (after RoPE); ``context`` and
``attention_out`` (the attention's output before the out projection: ``context`` is the name
MaxText's flash-attention kernels give it, so ``minimal_with_context`` has something to
save); ``out_proj``; ``mlpwi_0``, ``mlpwi_1`` (the gated MLP's two input projections, before
the SiLU); ``mlpwo``. Each preset is ``save_only_these_names`` over MaxText's list for it
(``full``: nothing saved; ``none``: no ``nn.remat``).

Each preset is measured with ``remat.measure`` (compiled peak, matmul FLOPs, step time).
Then ``remat.plan`` plans the un-checkpointed decoder (the layer scan without ``nn.remat``,
so the planner decides) at each preset's compiled peak, and halfway between two consecutive
distinct peaks, each from scratch, and is checked against the presets: it must fit, and recompute no more FLOPs
than the cheapest preset that fits the same budget. Per plan it records the whole-step
compiles (``plan.stats``; every ``jax.stages.Lowered.compile`` counted beside), the time
compiling, ``plan.solve_seconds``,
``plan.rounds``, ``plan.predicted_peak_bytes`` and ``plan.measured_peak_bytes``.

Usage:
  PYTHONPATH=src python benchmarks/maxtext_presets.py [--quick] [--no-schedules] [--per-layer]
      [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import remat
from bench_common import (
    BENCH_MD,
    MIB,
    compiled_peak,
    count_compiles,
    machine_line,
    markdown_table,
    print_table,
    replace_section,
    time_jax_step,
)
from remat._models._maxtext import FULL, PRESETS, QUICK, make_decoder
from remat._plan import _memo
from remat._plan._compile import STEP, tally

MARKERS = ("<!-- maxtext:start -->", "<!-- maxtext:end -->")
# The section of a ``--per-layer`` run (kept beside the uniform run's).
PER_LAYER_MARKERS = ("<!-- maxtext_perlayer:start -->", "<!-- maxtext_perlayer:end -->")
# `remat.plan(..., per_layer=...)` for every plan (``--per-layer``).
PER_LAYER = False

### Running


def measure_presets(sizes: dict, repeats: int) -> dict[str, dict]:
    out = {}
    for name, names in PRESETS.items():
        loss, args = make_decoder(names, sizes)
        m = remat.measure(loss, *args, repeats=repeats)
        out[name] = dict(peak=compiled_peak(m), flops=m.flops, m=m,
                         seconds=m.seconds.median if m.seconds else None)  # fmt: skip
        print(f"  {name:34s} peak {out[name]['peak'] / MIB:7.2f} MiB  "
              f"{m.flops / 1e9:.3f} GFLOP", flush=True)  # fmt: skip
    return out


def cheapest_fitting(presets: dict, budget: int) -> tuple[str, dict] | None:
    fitting = [(p["flops"], p["peak"], n) for n, p in presets.items() if p["peak"] <= budget]
    if not fitting:
        return None
    name = min(fitting)[2]
    return name, presets[name]


def budgets(presets: dict, midpoints: bool = True) -> list[tuple[int, str]]:
    """Each distinct preset peak (labelled with its presets) and, with ``midpoints``, the
    midpoints between consecutive distinct peaks, ascending; without ``midpoints`` the
    un-checkpointed peak (where the plan is trivially ``none``) is left out too."""
    peaks: dict[int, list[str]] = {}
    for name, p in presets.items():
        peaks.setdefault(p["peak"], []).append(name)
    ordered = sorted(peaks)
    if not midpoints:
        return [(peak, " = ".join(peaks[peak])) for peak in ordered if "none" not in peaks[peak]]
    out = []
    for i, peak in enumerate(ordered):
        out.append((peak, " = ".join(peaks[peak])))
        if i + 1 < len(ordered):
            nxt = ordered[i + 1]
            out.append(((peak + nxt) // 2, f"halfway {peaks[peak][0]} – {peaks[nxt][0]}"))
    return out


def plan_at(loss, args, budget: int, schedules: bool, repeats: int) -> dict:
    _memo.forget()  # each budget planned from scratch, as a user planning once would
    start = time.perf_counter()
    steps = tally()[0].get(STEP, 0)
    with count_compiles() as log:
        try:
            plan = remat.plan(loss, *args, budget=budget, schedules=schedules,
                              per_layer=PER_LAYER)  # fmt: skip
        except remat.InfeasibleBudget as err:
            return dict(budget=budget, error=err, wall=time.perf_counter() - start,
                        compiles=len(log.seconds), compile_seconds=log.total_seconds,
                        steps=tally()[0].get(STEP, 0) - steps)  # fmt: skip
    wall = time.perf_counter() - start
    seconds = time_jax_step(plan.fn, args, repeats) if repeats else None
    return dict(
        budget=budget,
        plan=plan,
        wall=wall,
        compiles=len(log.seconds),
        compile_seconds=log.total_seconds,
        seconds=seconds,
    )


def run(sizes: dict, repeats: int, schedules: bool, midpoints: bool) -> dict:
    print("== presets", flush=True)
    presets = measure_presets(sizes, repeats)
    loss, args = make_decoder(None, sizes)
    rows = []
    for budget, label in budgets(presets, midpoints):
        cheap = cheapest_fitting(presets, budget)
        r = plan_at(loss, args, budget, schedules, repeats)
        r.update(label=label, cheapest=cheap)
        rows.append(r)
        if "error" in r:
            print(f"  plan at {label} ({budget / MIB:.2f} MiB): infeasible", flush=True)
            continue
        p = r["plan"]
        print(f"  plan at {label} ({budget / MIB:.2f} MiB): peak "
              f"{p.measured_peak_bytes / MIB:.2f} MiB, x{p.flops_ratio:.4f} FLOPs "
              f"(cheapest preset {cheap[0]}: x{cheap[1]['flops'] / p.baseline_flops:.4f}), "
              f"{p.stats.step_compiles} whole-step compiles, {r['wall']:.0f} s", flush=True)  # fmt: skip
    return dict(presets=presets, rows=rows, base=presets["none"])


### Reporting

PRESET_HEAD = ("preset", "saves", "compiled peak MiB (of none)", "FLOPs × none", "ms/step")


def preset_rows(result: dict) -> list[list[str]]:
    base = result["base"]
    out = []
    for name, p in sorted(result["presets"].items(), key=lambda kv: -kv[1]["peak"]):
        names = PRESETS[name]
        saves = "everything" if names is None else ", ".join(n for n in names if n not in
                                                             ("qkv_proj", "kv_proj", "mlpwi"))  # fmt: skip
        out.append([
            name, saves or "nothing (the scan carry)",
            f"{p['peak'] / MIB:.2f} ({p['peak'] / base['peak']:.0%})",
            f"{p['flops'] / base['flops']:.4f}",
            f"{p['seconds'] * 1e3:.1f}" if p["seconds"] else "",
        ])  # fmt: skip
    return out


PLAN_HEAD = (
    "budget",
    "MiB",
    "cheapest preset that fits (FLOPs × none)",
    "plan FLOPs × none",
    "plan ≤ preset",
    "fits",
    "saved per layer",
    "whole-step compiles (all compiles)",
    "compiling s (all)",
    "solve s",
    "rounds",
    "predicted MiB",
    "compiled MiB",
    "plan ms/step",
)


def plan_rows(result: dict) -> list[list[str]]:
    base = result["base"]
    out = []
    for r in result["rows"]:
        cheap = r["cheapest"]
        cheap_text = f"{cheap[0]} ({cheap[1]['flops'] / base['flops']:.4f})" if cheap else "none"
        head = [r["label"], f"{r['budget'] / MIB:.2f}", cheap_text]
        if "error" in r:
            smallest = r["error"].smallest_peak_bytes
            out.append([*head, f"infeasible (smallest peak {smallest / MIB:.2f} MiB)", "no",
                        "no", "", f"{r['steps']} ({r['compiles']})",
                        f"{r['compile_seconds']:.0f}", "", "", "", "", ""])  # fmt: skip
            continue
        p = r["plan"]
        ratio = p.flops_ratio
        ok = cheap is None or p.measured.flops <= cheap[1]["flops"] * (1 + 1e-9)
        schedules = {str(s.schedule) for s in p.scans}
        saved = "; ".join(", ".join(s.names) or "nothing" for s in p.scans)
        if schedules != {"per_step"}:
            saved += f" [{', '.join(sorted(schedules))}]"
        out.append([
            *head, f"{ratio:.4f}", "yes" if ok else "NO",
            "yes" if p.measured_peak_bytes <= r["budget"] else "NO", saved,
            f"{p.stats.step_compiles} ({r['compiles']})",
            f"{r['compile_seconds']:.0f}",
            f"{p.solve_seconds:.2f}", f"{p.rounds}",
            f"{p.predicted_peak_bytes / MIB:.2f} "
            f"({(p.predicted_peak_bytes - p.measured_peak_bytes) / p.measured_peak_bytes:+.1%})",
            f"{p.measured_peak_bytes / MIB:.2f}",
            f"{r['seconds'] * 1e3:.1f}" if r["seconds"] else "",
        ])  # fmt: skip
    return out


def losses(result: dict) -> list[str]:
    """Where the planner loses to a preset, with the numbers."""
    base = result["base"]
    out = []
    for r in result["rows"]:
        cheap = r["cheapest"]
        if "error" in r:
            out.append(
                f"{r['label']} ({r['budget'] / MIB:.2f} MiB): no plan, although "
                f"{cheap[0] if cheap else 'no preset'} fits; {r['error']}"
            )
            continue
        p = r["plan"]
        if p.measured_peak_bytes > r["budget"]:
            out.append(f"{r['label']}: the plan's peak {p.measured_peak_bytes} B is over the "
                       f"budget {r['budget']} B")  # fmt: skip
        if cheap is not None and p.measured.flops > cheap[1]["flops"] * (1 + 1e-9):
            out.append(
                f"{r['label']} ({r['budget'] / MIB:.2f} MiB): plan ×{p.flops_ratio:.4f} "
                f"({p.measured_peak_bytes / MIB:.2f} MiB; saves "
                f"{'; '.join(', '.join(s.names) or 'nothing' for s in p.scans)}; "
                f"{', '.join(str(s.schedule) for s in p.scans)}) against {cheap[0]} "
                f"×{cheap[1]['flops'] / base['flops']:.4f} ({cheap[1]['peak'] / MIB:.2f} MiB)"
            )
    return out


def section(result: dict, sizes: dict, wall: float, quick: bool, schedules: bool) -> str:
    flag = (" --quick" if quick else "") + ("" if schedules else " --no-schedules")
    flag += " --per-layer" if PER_LAYER else ""
    if quick and any(r["label"].startswith("halfway") for r in result["rows"]):
        flag += " --midpoints"
    rows = result["rows"]
    planned = [r for r in rows if "error" not in r]
    wins = sum(
        r["cheapest"] is None or r["plan"].measured.flops <= r["cheapest"][1]["flops"] * (1 + 1e-9)
        for r in planned
    )
    fits = sum(r["plan"].measured_peak_bytes <= r["budget"] for r in planned)
    halfway = [r for r in planned if r["label"].startswith("halfway")]
    strict = sum(
        r["cheapest"] is not None
        and r["plan"].measured.flops < r["cheapest"][1]["flops"] * (1 - 1e-9)
        for r in halfway
    )
    lost = losses(result)
    markers = PER_LAYER_MARKERS if PER_LAYER else MARKERS
    parts = [
        markers[0],
        "## remat.plan vs MaxText remat presets"
        + (", per-layer plans" if PER_LAYER else "")
        + " (`benchmarks/maxtext_presets.py`)",
        "",
        f"Run {datetime.date.today().isoformat()} on {machine_line()}; {wall:.0f} s in all. "
        f"Reproduce with `PYTHONPATH=src python benchmarks/maxtext_presets.py{flag}`.",
        "",
        f"A llama-style decoder built the way MaxText builds its layers ({sizes['layers']} "
        f"layers, d_model {sizes['d_model']}, {sizes['heads']} heads, gated SiLU MLP "
        f"{sizes['mlp_dim']}, RoPE, RMSNorm, seq {sizes['seq']}, batch {sizes['batch']}, vocab "
        f"{sizes['vocab']}, float32): `nn.scan` over `nn.remat(layer, policy=..., "
        "prevent_cse=False)`, MaxText's `checkpoint_name`s on the same values "
        "(`decoder_layer_input`, `query_proj`/`key_proj`/`value_proj` after RoPE, `context` "
        "and `attention_out` on the attention output before the out projection (`context` is "
        "the name MaxText's flash kernels give it), `out_proj`, `mlpwi_0`, `mlpwi_1`, "
        "`mlpwo`), each preset `save_only_these_names` over MaxText's list (`full`: "
        "`nothing_saveable`; `none`: no `nn.remat`).",
        "",
        "Presets: `remat.measure` (compiled peak: XLA's memory analysis, on CPU temp + "
        "arguments + outputs − aliased; FLOPs: matmuls of the optimised HLO with trip counts; "
        "ms/step: median after a warm-up, noisy under the load above). Plans: "
        f"`remat.plan(loss, params, tokens, budget=B{'' if schedules else ', schedules=False'}"
        f"{', per_layer=True' if PER_LAYER else ''})`"
        " on the decoder without `nn.remat` (the planner decides what each layer saves), at "
        "each distinct preset peak and halfway between consecutive ones, each from scratch "
        "(nothing remembered from the plan before: the baseline compile is in every row); "
        "compared with the preset with the fewest FLOPs whose peak fits B. Whole-step "
        "compiles: the planner's own tally (`plan.stats.step_compiles`: the un-checkpointed "
        "baseline and each plan verified); in brackets every `jax.stages.Lowered.compile` "
        "call (wrapped with a counter), the scans compiled alone included (a `Nested` or "
        "`Binomial` option is checked on its scan at full length, a program nearly the "
        "step's size); compiling s is the wall time of all of them, solve s "
        "`plan.solve_seconds`, rounds `plan.rounds`, predicted "
        "`plan.predicted_peak_bytes` (its error against the compiled peak) and compiled "
        "`plan.measured_peak_bytes`.",
        "",
        markdown_table(PRESET_HEAD, preset_rows(result)),
        "",
        markdown_table(PLAN_HEAD, plan_rows(result)),
        "",
        f"- the plan fits its budget at {fits}/{len(rows)} budgets and recomputes no more "
        f"than the cheapest preset that fits at {wins}/{len(rows)}"
        + (f"; strictly fewer FLOPs at {strict}/{len(halfway)} midpoints" if halfway else ""),
    ]
    if lost:
        parts.append("- where the planner loses to a preset:")
        parts += [f"  - {line}" for line in lost]
    parts.append(markers[1])
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller decoder, planned at the presets' peaks only")  # fmt: skip
    parser.add_argument("--midpoints", action="store_true",
                        help="with --quick: also plan halfway between the peaks")  # fmt: skip
    parser.add_argument("--no-schedules", action="store_true",
                        help="plan per-step save sets only (`schedules=False`)")  # fmt: skip
    parser.add_argument("--per-layer", action="store_true",
                        help="plan with per-layer save sets (`per_layer=True`)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=None, help="timed steps (0: no timing)")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    global PER_LAYER
    PER_LAYER = args.per_layer
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    schedules = not args.no_schedules
    start = time.perf_counter()
    midpoints = args.midpoints or not args.quick
    result = run(sizes, repeats, schedules, midpoints)
    print_table("MaxText presets", PRESET_HEAD, preset_rows(result))
    print_table("remat.plan at the presets' peaks", PLAN_HEAD, plan_rows(result))
    for line in losses(result):
        print(f"- loses: {line}")
    text = section(result, sizes, time.perf_counter() - start, args.quick, schedules)
    if not args.no_write:
        replace_section(BENCH_MD, PER_LAYER_MARKERS if PER_LAYER else MARKERS, text)
        print(f"wrote {BENCH_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
