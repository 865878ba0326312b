"""``remat demo``'s second part: the demo GPT and its unrolled twin, side by side.

The twin (`remat._models._gpt.make_gpt_unrolled`) is the same model with the same weights,
its blocks called in a Python loop, as most models are written. For both, the table gives
the un-checkpointed step's peak and FLOPs, `remat.plan` at 50% and 35% of that peak (the
unrolled twin is rolled into a scan by the planner), and what compiling the step costs.
"""

from __future__ import annotations

import time
from typing import Any

from .._core._budget import MIB

BUDGETS = (0.5, 0.35)


def _row(name: str, fn, fn_args) -> list[str]:
    import jax

    from .._plan._plan import plan_budgets  # the public remat.plan_budgets
    from .._plan._result import InfeasibleBudget

    plans = plan_budgets(fn, *fn_args, budgets=list(BUDGETS), schedules=False)
    cells = [name]
    first = next((p for p in plans if not isinstance(p, InfeasibleBudget)), None)
    if first is not None:
        cells += [f"{first.baseline_peak_bytes / MIB:.1f}", f"{first.baseline_flops / 1e9:.2f}"]
    else:
        cells += ["", ""]
    for p in plans:
        if isinstance(p, InfeasibleBudget):
            cells.append(f"no fit (>= {p.smallest_peak_bytes / MIB:.1f})")
            continue
        peak, ratio = p.measured_peak_bytes / MIB, p.measured.flops / p.baseline_flops
        cells.append(f"{peak:.1f} MiB, {ratio:.2f}x FLOPs")
    step = jax.jit(jax.value_and_grad(fn))
    start = time.perf_counter()
    step.lower(*fn_args).compile()
    cells.append(f"{time.perf_counter() - start:.2f}")
    return cells


def _rolled_compile_seconds(fn, fn_args: tuple[Any, ...]) -> float:
    import jax

    from .._trace._roll_rewrite import roll_unscanned

    start = time.perf_counter()
    jax.jit(jax.value_and_grad(roll_unscanned(fn))).lower(*fn_args).compile()
    return time.perf_counter() - start


def unrolled_table(sizes: dict[str, int]) -> str:
    """The side-by-side table of the scanned GPT and its unrolled twin, as markdown."""
    from .._models._gpt import make_gpt, make_gpt_unrolled
    from .._trace._roll_rewrite import list_runs

    scanned, scanned_args = make_gpt(**sizes)
    unrolled, unrolled_args = make_gpt_unrolled(**sizes)
    start = time.perf_counter()
    runs = list_runs(unrolled, *unrolled_args)
    detect = time.perf_counter() - start
    header = ["model", "peak MiB", "GFLOPs"]
    header += [f"plan {b:.0%}" for b in BUDGETS] + ["compile s (as written)"]
    rows = []
    for name, fn, fn_args in (
        ("scanned (nn.scan)", scanned, scanned_args),
        ("unrolled (Python loop)", unrolled, unrolled_args),
    ):
        rows.append(_row(name, fn, fn_args))
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    rolled = _rolled_compile_seconds(unrolled, unrolled_args)
    found = ", ".join(f"{r.length} layers of {r.period} equations" for r in runs) or "nothing"
    lines.append(
        f"\nunrolled twin: rolled {found} in {detect:.2f} s (trace included); its rolled "
        f"step compiles in {rolled:.2f} s against {rows[1][-1]} s as written."
    )
    return "\n".join(lines)
