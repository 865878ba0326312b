"""Helpers shared by `vs_torch.py` and `maxtext_presets.py`: compile counting, step timing,
the machine line and tables printed with rich and written as markdown.

Only remat's public API is used here; `replace_section` (how every benchmark keeps its
section of BENCHMARKS.md) is imported from where the other benchmark scripts import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
from rich.console import Console
from rich.table import Table

from remat._core._io import replace_section

BENCH_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
MIB = 2**20


### Compile counting


@dataclasses.dataclass
class CompileLog:
    """Every XLA compile made while `count_compiles` is active: its seconds."""

    seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileLog]:
    """Counts every ``jax.stages.Lowered.compile`` call inside the block (how `remat.plan`,
    `remat.measure` and ``jax.jit(...).lower(...).compile()`` compile), with its seconds.
    Which of them compiled the whole step, `remat.plan` tallies itself (``plan.stats``)."""
    log = CompileLog()
    original = jax.stages.Lowered.compile

    def counted(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            log.seconds.append(time.perf_counter() - start)

    jax.stages.Lowered.compile = counted
    try:
        yield log
    finally:
        jax.stages.Lowered.compile = original


def tree_bytes(tree: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def compiled_peak(m: Any) -> int:
    """The compiled peak of a `remat.Measurement`: its ``peak_bytes``, read by remat's one peak
    function (`remat._measure._peak`; on CPU ``temp + argument + output - alias``)."""
    return m.peak_bytes


### Timing


def median_seconds(step: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``step()`` (which must block until done) over
    ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_jax_step(fn: Callable[..., Any], args: Sequence[Any], repeats: int) -> float:
    """Median seconds of ``jax.jit(jax.value_and_grad(fn))(*args)`` (one compile)."""
    step = jax.jit(jax.value_and_grad(fn))
    return median_seconds(lambda: jax.block_until_ready(step(*args)), repeats)


### Reporting


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` says (as `remat.Report`
    names the host)."""
    from remat._report._machine import _cpu_model

    return _cpu_model()


def machine_line(extra: str = "") -> str:
    """The machine, the library versions and the load average (other jobs share the cores)."""
    cpu = cpu_name()
    load = os.getloadavg()
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"jax {jax.__version__} ({jax.default_backend()}){extra}; load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at the end of the run"
    )


def print_table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for h in head:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def section_start(markers: tuple[str, str], title: str, wall: float, command: str) -> list[str]:
    """The first lines of a BENCHMARKS.md section: its marker, title and the run line."""
    return [
        markers[0],
        f"## {title}",
        "",
        f"Run {datetime.date.today().isoformat()} on {machine_line()}; {wall:.0f} s in all. "
        f"Reproduce with `{command}`.",
    ]


def write_section(markers: tuple[str, str], text: str, write: bool) -> None:
    """Prints a section and, unless ``write`` is false, puts it in BENCHMARKS.md."""
    print(text)
    if write:
        replace_section(BENCH_MD, markers, text)
        print(f"wrote {BENCH_MD}")


def arch_arguments(doc: str, argv: Sequence[str] | None) -> Any:
    """The arguments of a script over the models of `vs_torch.py`: ``--arch`` (``gpt,mlp``)
    and ``--no-write`` (leave BENCHMARKS.md as it is); ``doc`` is the script's docstring."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    return parser.parse_args(argv)
