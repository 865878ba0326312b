"""`remat.Report`: the measurements of several strategies side by side.

A report is plain data: one `Measurement` per strategy label, the label of the baseline, and
the machine it was measured on. It renders as a table (`Report.table`), finds the strategies
on the memory/FLOPs Pareto front (`Report.pareto`), picks the cheapest strategy under a memory
budget (`Report.cheapest`), round-trips through JSON exactly (`Report.to_json`,
`Report.from_json`) and draws itself (`Report.plot`, see `_plot.py`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import numbers
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._core._budget import MIB
from .._core._io import atomic_write_text
from .._core._plain import from_plain
from .._core._warnings import RematWarning
from .._measure._measurement import SAVES_NOTHING_FRACTION, Measurement
from ._machine import Machine as Machine
from ._machine import current_machine as current_machine
from ._pareto import pareto_front

_FORMAT = "remat.Report"
_HEADERS = (
    "strategy",
    "peak MiB",
    "peak ×base",
    "residual MiB",
    "GFLOPs",
    "FLOPs ×base",
    "ms/step",
    "pareto",
)
_VERSION = 1
_COMPACT_BELOW = 110  # consoles narrower than the full table get the compact one

_NO_PICTURE_ROW = (
    "`remat.Report` got a picture for {label!r}, which is not a row; the rows are {labels}. "
    "Link pictures to the rows' labels."
)
_NO_ROWS = "`remat.Report` got no rows; expected at least the baseline's measurement."
_DUPLICATE_LABEL = (
    "`remat.Report` got the label {label!r} twice; every strategy needs a distinct label "
    "(pass a dict {{label: strategy}} to `remat.compare` to choose them)."
)
_NO_BASELINE = (
    "`remat.Report` got baseline={baseline!r}, which is not one of the row labels {labels}."
)
_NOT_A_REPORT = "`remat.Report.from_json` read {path}, which is not a remat report ({why})."
_BAD_FRACTION = (
    "`remat.Report.cheapest` got max_peak_fraction={got!r}; expected a number > 0, the budget "
    "as a fraction of the baseline's peak, e.g. 0.5 for half the memory."
)
_AS_WRITTEN_NOTE = (
    "as written: N of M scans: N of the M scans the strategy selects kept the program's own "
    "checkpoints (`remat.apply`'s default), so the row is the program as written there; kept "
    "in all M, it is left off the Pareto front and `cheapest`. override=True (`remat compare "
    "--override`) applies the strategy there."
)
_PICKED_PARTLY = (
    "`remat.Report.cheapest` picked {label!r}, which kept the program's own checkpoints in "
    "{kept} of its {of} scans: it is partly the program as written. Compare with "
    "override=True (`remat compare --override`) to measure the strategy there."
)


@dataclasses.dataclass(frozen=True)
class Report:
    """Measurements of several strategies of one program, with the baseline and the machine.

    Usually made by `remat.compare`. Rows keep the order they were measured in.

    Attributes:
      rows: ``(label, Measurement)`` pairs, one per strategy, labels distinct.
      baseline: the label of the row the others are compared with.
      machine: where it was measured.
      title: what was measured, e.g. ``"GPT: 4 layers, d_model 128, seq 128, batch 8"``.
      pictures: ``(label, path)`` of the rows that have a picture of where their memory
        goes (`remat.plot_memory`), e.g. ``remat demo``'s ``memory.png`` for the baseline;
        see `Report.with_pictures`.

    Example:
      >>> import remat
      >>> from remat._report._report import Machine
      >>> def row(peak, flops):
      ...     return remat.Measurement(
      ...         peak_bytes=peak, peak_source="peak_memory_in_bytes", temp_bytes=peak,
      ...         argument_bytes=0, output_bytes=0, alias_bytes=0, residuals=(),
      ...         residual_bytes=0, flops=flops, forward_flops=flops / 3,
      ...         recompute_requested=False, recompute_eliminated=False,
      ...         compile_seconds=0.1, seconds=None)
      >>> report = remat.Report(
      ...     rows=(("none", row(8 << 20, 3e9)), ("full", row(2 << 20, 4e9)),
      ...           ("worse", row(9 << 20, 5e9))),
      ...     baseline="none", machine=Machine("cpu", "cpu", 1, "0.10.2"))
      >>> report.pareto()
      ('none', 'full')
      >>> report.cheapest(max_peak_fraction=0.5)
      'full'
    """

    rows: tuple[tuple[str, Measurement], ...]
    baseline: str
    machine: Machine
    title: str = ""
    pictures: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        rows = tuple((str(label), m) for label, m in self.rows)
        if not rows:
            raise ValueError(_NO_ROWS)
        labels = [label for label, _ in rows]
        for label in labels:
            if labels.count(label) > 1:
                raise ValueError(_DUPLICATE_LABEL.format(label=label))
        if self.baseline not in labels:
            raise ValueError(_NO_BASELINE.format(baseline=self.baseline, labels=labels))
        object.__setattr__(self, "rows", rows)
        pictures = dict(self.pictures)
        for label in pictures:
            if label not in labels:
                raise ValueError(_NO_PICTURE_ROW.format(label=label, labels=labels))
        object.__setattr__(self, "pictures", tuple((k, str(v)) for k, v in pictures.items()))

    def with_pictures(self, pictures: dict[str, str | os.PathLike]) -> Report:
        """This report with ``pictures`` (``label -> path``) linked to its rows.

        Example:
          >>> import remat
          >>> from remat._report._report import Machine
          >>> m = remat.Measurement(8, "x", 8, 0, 0, 0, (), 0, 1.0, 1.0, False, False, 0.0, None)
          >>> machine = Machine("cpu", "cpu", 1, "0")
          >>> report = remat.Report(rows=(("none", m),), baseline="none", machine=machine)
          >>> report.with_pictures({"none": "memory.png"}).pictures
          (('none', 'memory.png'),)
        """
        return dataclasses.replace(self, pictures={**dict(self.pictures), **pictures})

    # --- access ---

    @property
    def labels(self) -> tuple[str, ...]:
        """The strategy labels, in row order."""
        return tuple(label for label, _ in self.rows)

    def __getitem__(self, label: str) -> Measurement:
        """The measurement of the strategy labelled ``label``."""
        for name, measurement in self.rows:
            if name == label:
                return measurement
        raise KeyError(f"`remat.Report` has no strategy {label!r}; it has {list(self.labels)}.")

    @property
    def num_devices(self) -> int:
        """The most devices any row's program ran on; above 1, every number is per device."""
        return max(getattr(m, "num_devices", 1) for _, m in self.rows)

    @property
    def per_device(self) -> bool:
        """Whether the rows are SPMD programs over several devices (numbers per device)."""
        return self.num_devices > 1

    @property
    def baseline_measurement(self) -> Measurement:
        """The baseline's `Measurement`."""
        return self[self.baseline]

    # --- analysis ---

    def as_written(self) -> tuple[str, ...]:
        """Labels of the rows that kept the program's own checkpoints in at least one scan
        the strategy selects (`remat.Measurement.scans_as_written`), in row order.

        Such a row is partly (or, when `remat.Measurement.as_written`, wholly) the program as
        its user wrote it: `remat.compare` with ``override=True`` applies the strategy there.
        The table marks them; a row that is the program as written everywhere is left off
        `Report.pareto` and `Report.cheapest` (unless it is the baseline).
        """
        return tuple(label for label, m in self.rows if m.scans_as_written)

    def _candidates(self) -> list[int]:
        """Rows that stand for their strategy: all but those that are the program as
        written under another label (the baseline always stands)."""
        return [
            i
            for i, (label, m) in enumerate(self.rows)
            if label == self.baseline or not m.as_written
        ]

    def pareto(self) -> tuple[str, ...]:
        """Labels of the strategies on the peak-memory/step-FLOPs Pareto front, in row order.

        A strategy is on the front when no other one has a lower or equal peak memory and
        lower or equal FLOPs with one of them strictly lower. A row that is the program as
        written under another label (`remat.Measurement.as_written`: every scan it selects
        kept the program's checkpoints) is not a strategy of its own and is left out.
        """
        rows = [self.rows[i] for i in self._candidates()]
        points = [(m.peak_bytes, m.flops) for _, m in rows]
        return tuple(rows[i][0] for i in pareto_front(points))

    def cheapest(self, max_peak_fraction: float = 0.5) -> str | None:
        """The strategy with the fewest FLOPs whose peak is at most a fraction of the baseline's.

        Args:
          max_peak_fraction: the memory budget as a fraction of the baseline's peak bytes.

        Returns:
          Its label (the lower peak breaks a FLOPs tie, then row order), or None when no
          strategy fits. A row that is the program as written under another label
          (`remat.Measurement.as_written`) is never picked; a row that kept the program's
          checkpoints in some of its scans is picked with a `RematWarning` that says so.

        Raises:
          ValueError: ``max_peak_fraction`` is not a number > 0.
        """
        frac = max_peak_fraction
        if isinstance(frac, bool) or not isinstance(frac, numbers.Real) or not frac > 0:
            raise ValueError(_BAD_FRACTION.format(got=frac))
        budget = max_peak_fraction * self.baseline_measurement.peak_bytes
        fits = [(self.rows[i][1].flops, self.rows[i][1].peak_bytes, i) for i in self._candidates()]
        fits = [f for f in fits if f[1] <= budget]
        if not fits:
            return None
        label, m = self.rows[min(fits)[2]]
        if m.scans_as_written and label != self.baseline:
            warnings.warn(
                _PICKED_PARTLY.format(
                    label=label, kept=m.scans_as_written, of=m.scans_as_written + m.scans_applied
                ),
                RematWarning,
                stacklevel=2,
            )
        return label

    # --- rendering ---

    def table(self, compact: bool = False):
        """A `rich.table.Table`: one row per strategy, relative to the baseline.

        Columns: strategy, peak MiB, peak relative to the baseline, residual MiB, GFLOPs per
        step, FLOPs relative to the baseline, median ms per step, and a mark (``*``) on the
        Pareto front. A ``!`` after a label means XLA removed the recomputation the strategy
        asked for (see `remat.measure`); ``(as written: N of M scans)`` means N of the M
        scans the strategy selects kept the program's own checkpoints (see
        `Report.as_written`).

        Numbers are never cut: on a narrow console the labels and headers wrap instead.
        ``compact`` draws fewer lines, for consoles of about 60 columns.
        """
        from rich import box
        from rich.table import Table

        title = self.title
        if self.num_devices > 1:  # an SPMD program: every memory number is one device's
            title = f"{title} (per device, {self.num_devices} devices)".strip()
        style = dict(box=box.SIMPLE_HEAD, padding=(0, 0)) if compact else {}
        table = Table(title=title or None, caption=self._caption(), caption_justify="left", **style)
        rows = self._cells()
        table.add_column("strategy", overflow="fold")
        for i, header in enumerate(_HEADERS[1:-1], start=1):
            widest = max(len(cells[i]) for cells in rows)
            table.add_column(header, justify="right", min_width=widest, overflow="fold")
        table.add_column("*" if compact else _HEADERS[-1], justify="center", overflow="fold")
        for cells in rows:
            table.add_row(*cells)
        return table

    def markdown(self) -> str:
        """The table as GitHub-flavoured Markdown, with the machine below it.

        Example:
          >>> from remat._report._report import Machine, Report
          >>> import remat
          >>> m = remat.Measurement(2**20, "x", 0, 0, 0, 0, (), 0, 1e9, 1e9, False, False, 0.0, None)
          >>> print(Report((("none", m),), "none", Machine("cpu", "cpu", 1, "0.10.2")).markdown())
          | strategy | peak MiB | peak ×base | residual MiB | GFLOPs | FLOPs ×base | ms/step | pareto |
          |---|--:|--:|--:|--:|--:|--:|:-:|
          | none (baseline) | 1.00 | 1.00× | 0.00 | 1.000 | 1.00× | - | * |
          <BLANKLINE>
          machine: cpu (cpu x1), jax 0.10.2<br>* on the peak-memory/FLOPs Pareto front
        """
        lines = [
            "| " + " | ".join(_HEADERS) + " |",
            "|---|" + "--:|" * (len(_HEADERS) - 2) + ":-:|",
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in self._cells()]
        return "\n".join(lines) + "\n\n" + self._caption().replace("\n", "<br>")

    def saves_nothing(self) -> tuple[str, ...]:
        """Labels of strategies that recompute but whose peak does not fall.

        A strategy is listed when its compiled FLOPs are above the baseline's (or the
        measurement says its checkpoints recompute, see `remat.Measurement.saves_nothing`)
        while its peak is not at least 2% below the baseline's (or its own plain twin's).
        The table marks them ``~`` and its caption gives both figures.
        """
        base = self.baseline_measurement
        out = []
        for label, m in self.rows:
            if label == self.baseline or m.recompute_eliminated:
                continue
            costs_more = m.flops > base.flops
            no_fall = m.peak_bytes > SAVES_NOTHING_FRACTION * base.peak_bytes
            if m.saves_nothing or (costs_more and no_fall):
                out.append(label)
        return tuple(out)

    def _cells(self) -> list[list[str]]:
        base = self.baseline_measurement
        front = set(self.pareto())
        no_saving = set(self.saves_nothing())
        rows = []
        for label, m in self.rows:
            name = f"{label} (baseline)" if label == self.baseline else label
            if m.scans_as_written:
                of = m.scans_as_written + m.scans_applied
                name += f" (as written: {m.scans_as_written} of {of} scans)"
            if m.recompute_eliminated:
                name += " !"
            elif label in no_saving:
                name += " ~"
            rows.append(
                [
                    name,
                    f"{m.peak_bytes / MIB:.2f}",
                    _ratio(m.peak_bytes, base.peak_bytes),
                    f"{m.residual_bytes / MIB:.2f}",
                    f"{m.flops / 1e9:.3f}",
                    _ratio(m.flops, base.flops),
                    f"{m.seconds.median * 1e3:.1f}" if m.seconds else "-",
                    "*" if label in front else "",
                ]
            )
        return rows

    def _caption(self) -> str:
        lines = [f"machine: {self.machine.describe()}", "* on the peak-memory/FLOPs Pareto front"]
        if self.num_devices > 1:
            lines.append(
                f"memory and FLOPs per device: XLA's analysis of the program partitioned over "
                f"{self.num_devices} devices (SPMD)"
            )
        if any(m.recompute_eliminated for _, m in self.rows):
            lines.append("! XLA removed the recomputation this strategy asked for")
        if self.as_written():
            lines.append(_AS_WRITTEN_NOTE)
        base = self.baseline_measurement
        for label in self.saves_nothing():
            m = self[label]
            lines.append(
                f"~ {label} recomputes ({m.flops / base.flops:.2f}× the baseline's FLOPs) but "
                f"its peak, {m.peak_bytes / MIB:.2f} MiB, is not 2% below the baseline's "
                f"{base.peak_bytes / MIB:.2f} MiB: no memory saved"
            )
        return "\n".join(lines)

    def render(self, width: int = 120) -> str:
        """The table as plain text (no colour), ``width`` characters wide at most; below 110
        columns with fewer lines, and at any width with every number whole."""
        from rich.console import Console

        console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
        console.print(self.table(compact=width < _COMPACT_BELOW))
        for label, path in self.pictures:
            console.print(f"where the memory of {label} goes: {path}")
        return console.file.getvalue()

    def __str__(self) -> str:
        return self.render()

    def plot(
        self,
        path: str | os.PathLike,
        y: str = "flops",
        extra: Sequence[tuple[str, float, float]] = (),
        budget: float | None = None,
        budget_label: str = "memory budget",
        highlight: str | None = None,
    ) -> Path:
        """Draws peak memory against step FLOPs (or time) into a PNG, written atomically.

        Every strategy is labelled, the Pareto front is drawn as a step line over the
        region it dominates, and the baseline is marked with a star.

        Args:
          path: the PNG to write.
          y: ``"flops"`` (GFLOPs per step) or ``"time"`` (median ms per step).
          extra: more points to draw (e.g. the planner's plans), as
            ``(label, peak_bytes, flops)`` or, for ``y="time"``, ``(label, peak_bytes,
            seconds)``. They are drawn as diamonds and take part in the drawn front.
          budget: a memory budget in bytes, drawn as a vertical dashed line.
          budget_label: its legend entry.
          highlight: the label of a point to circle (e.g. the strategy picked for a budget).

        Returns:
          ``path``.

        Raises:
          ValueError: ``y`` is neither ``"flops"`` nor ``"time"``, or ``y="time"`` and no
            strategy was timed.
        """
        from ._plot import plot_report

        return plot_report(
            self,
            path,
            y=y,
            extra=extra,
            budget=budget,
            budget_label=budget_label,
            highlight=highlight,
        )

    # --- JSON ---

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; `Report.from_dict` reverses it exactly."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "title": self.title,
            "baseline": self.baseline,
            "machine": dataclasses.asdict(self.machine),
            "rows": [{"label": label, **dataclasses.asdict(m)} for label, m in self.rows],
            "pictures": dict(self.pictures),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """The report that `Report.to_dict` returned ``data`` for."""
        rows = tuple(
            (row["label"], from_plain(Measurement, {k: v for k, v in row.items() if k != "label"}))
            for row in data["rows"]
        )
        return cls(
            rows=rows,
            baseline=data["baseline"],
            machine=from_plain(Machine, data["machine"]),
            title=data.get("title", ""),
            pictures=tuple(data.get("pictures", {}).items()),
        )

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes the report as JSON, atomically (temporary file, then rename).

        Returns:
          ``path``.
        """
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Report:
        """Reads a report that `Report.to_json` wrote; it compares equal to the one written.

        Raises:
          ValueError: the file cannot be read, is not UTF-8 JSON, or is not a remat report;
            the message names the file.
        """
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            why = f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"
            raise ValueError(_NOT_A_REPORT.format(path=path, why=why)) from None
        except json.JSONDecodeError as err:
            raise ValueError(_NOT_A_REPORT.format(path=path, why=f"invalid JSON: {err}")) from None
        except OSError as err:
            why = f"cannot read it: {err.strerror or err}"
            raise ValueError(_NOT_A_REPORT.format(path=path, why=why)) from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(_NOT_A_REPORT.format(path=path, why=f"no 'format': {_FORMAT!r}"))
        if data.get("version") != _VERSION:
            raise ValueError(
                _NOT_A_REPORT.format(path=path, why=f"version {data.get('version')!r}")
            )
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:
            why = f"malformed: {type(err).__name__}: {err}"
            raise ValueError(_NOT_A_REPORT.format(path=path, why=why)) from None


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base else "-"
