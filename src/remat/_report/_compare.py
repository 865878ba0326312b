"""`remat.compare`: measure one program under several strategies, side by side."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .._core._errors import renamed
from .._core._strategy import STRATEGY_NAMES, Strategy, as_strategy
from .._shard._target import as_target, check_repeats, compile_device
from ._report import Report, current_machine

_BAD_STRATEGIES = (
    "`remat.compare` got strategies={got!r}; expected a list of strategies (strings such as "
    "'full' or 'names:a,b', policies, or `remat.Strategy`) or a dict {{label: strategy}}."
)
_DUPLICATE = (
    "`remat.compare` got two strategies labelled {label!r}; pass a dict {{label: strategy}} "
    "to give them distinct labels."
)
_NO_STRATEGIES = (
    "`remat.compare` got strategies={got!r}, so there is nothing to compare with the baseline; "
    "pass at least one, e.g. strategies=['full', 'dots'] (or use `remat.measure` for the "
    "baseline alone)."
)
_BAD_BASELINE = (
    "`remat.compare` got baseline={got!r}, which is neither the label of one of the "
    "strategies ({labels}) nor a known strategy ({names}). Pass baseline='none' (the program as "
    "written), a label from `strategies`, or a strategy."
)
_BAD_REPEATS = "`remat.compare` got repeats={got!r}; pass an int >= 0 (0 skips timing)."
_BAD_TITLE = "`remat.compare` got title={got!r}; pass a string (shown above the table)."
_BAD_PROGRESS = "`remat.compare` got progress={got!r}; pass True or False."


def strategy_label(strategy: object) -> str:
    """The label a strategy gets in a report: the string itself, `Strategy.name`, or a name.

    Example:
      >>> import remat
      >>> from remat._report._compare import strategy_label
      >>> strategy_label("names:attn_out"), strategy_label(remat.Strategy("dots"))
      ('names:attn_out', 'dots')
    """
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, Strategy):
        return strategy.name
    return as_strategy(strategy, "remat.compare").name


def _labelled(strategies: object, device: Any = None) -> list[tuple[str, object]]:
    if isinstance(strategies, Mapping):
        entries = [(str(label), s) for label, s in strategies.items()]
    elif isinstance(strategies, Sequence) and not isinstance(strategies, str | bytes):
        entries = [(strategy_label(s), s) for s in strategies]
    else:
        raise TypeError(_BAD_STRATEGIES.format(got=strategies))
    if not entries:
        raise ValueError(_NO_STRATEGIES.format(got=strategies))
    seen = set()
    for label, strategy in entries:
        if label in seen:
            raise ValueError(_DUPLICATE.format(label=label))
        seen.add(label)
        as_strategy(strategy, "remat.compare", device)  # validate before anything compiles
    return entries


def compare(
    fn: Callable[..., Any],
    *args: Any,
    strategies: Sequence[object] | Mapping[str, object],
    baseline: object = "none",
    argnums: int | Sequence[int] = 0,
    repeats: int | None = None,
    title: str = "",
    progress: bool = True,
    has_aux: bool = False,
    optimizer: object = None,
    roll: bool = True,
    override: bool = False,
    target: Any = None,
) -> Report:
    """Measures ``jax.value_and_grad(fn, argnums)`` under each strategy and the baseline.

    Every strategy is applied with `remat.apply` and measured with `remat.measure` (compiled
    memory, residuals, FLOPs with loop trip counts, and timings), one after the other in this
    process; a progress bar (rich, on stderr, only on a terminal) shows which one compiles.

    Args:
      fn: a scalar-valued function; its layers should be a `lax.scan` (or `nnx.scan`,
        `flax.linen.scan`, ...) for checkpointing to have an effect on every backend.
      *args: the arguments to measure ``fn`` at.
      strategies: a list of strategies (labelled by the string itself or `Strategy.name`)
        or a dict ``{label: strategy}``.
      baseline: the strategy, or the label of one of ``strategies``, that the others are
        compared with; it is always measured (first, when not among ``strategies``).
      argnums: which arguments to differentiate, as in `jax.grad`.
      repeats: timed runs per strategy (after a warm-up); 0 skips timing. Default 5, and 0
        with a ``target``.
      title: what is being measured, shown above the table and the plot.
      progress: show the progress bar (when stderr is a terminal).
      has_aux: ``fn`` returns ``(loss, aux)``, as in `jax.value_and_grad`.
      optimizer: an optax ``GradientTransformation``: measure the whole training step, as
        `remat.measure` does with it (parameters and optimizer state donated).
      roll: roll the repeated layers outside the program's scans into scans before applying
        each strategy, as `remat.apply` does; False applies them to the program as written.
      override: `remat.apply`'s: False keeps the program's own checkpoints, True replaces
        them by each strategy. Where the program checkpoints already, a strategy whose peak
        is above the program's as written gets a `RematWarning` with both figures (the
        ``"none"`` row is the program as written).
      target: compile every strategy for this TPU slice (a `remat.Target` or its name,
        ``"tpu:v5e:2x2"``), as `remat.measure` does with it.

    Returns:
      A `remat.Report` with one row per strategy, the baseline's row first.

    Raises:
      ValueError: a strategy is unknown, or two strategies have the same label.
      TypeError: ``strategies`` is neither a list nor a dict.

    Example:
      >>> import jax, jax.numpy as jnp, remat
      >>> def loss(w, x):
      ...     h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w)
      ...     return jnp.sum(h**2)
      >>> w, x = jnp.ones((4, 8, 8)) * 0.1, jnp.ones((2, 8))
      >>> report = remat.compare(loss, w, x, strategies=["full"], repeats=0)
      >>> report.labels, report.baseline
      (('none', 'full'), 'none')
    """
    from .._measure._measure import _check_args, _check_scalar, measure
    from .._trace._eqx import with_modules_split

    compile_target = as_target(target, "remat.compare")
    repeats = check_repeats(compile_target, repeats, "remat.compare")

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 0:
        raise ValueError(_BAD_REPEATS.format(got=repeats))
    if not isinstance(title, str):
        raise ValueError(_BAD_TITLE.format(got=title))
    if not isinstance(progress, bool):
        raise ValueError(_BAD_PROGRESS.format(got=progress))
    fn, args = with_modules_split(fn, args)  # Equinox modules: arrays traced, the rest static
    try:  # `remat.measure`'s input checks, named for `remat.compare`, before any compiling
        argnums_t = _check_args(args, argnums, repeats)
        if compile_target is not None:  # placed once: every row compiles the same shapes
            args = compile_target.place(args, argnums_t, "remat.compare")
        _check_scalar(fn, args, has_aux, where="remat.compare")
    except (TypeError, ValueError) as err:
        raise renamed(err, "`remat.measure`", "`remat.compare`")  # noqa: B904 (`renamed` chains)
    device = compile_device(args)  # a target's chip: "offload:..." is checked against it
    entries = _labelled(strategies, device)
    labels = [label for label, _ in entries]
    if isinstance(baseline, str) and baseline in labels:
        base_label = baseline
    else:
        try:
            as_strategy(baseline, "remat.compare", device)
        except ValueError as err:
            if "not a known strategy" not in str(err):
                raise
            shown = ", ".join(repr(label) for label in labels)
            raise ValueError(
                _BAD_BASELINE.format(got=baseline, labels=shown, names=STRATEGY_NAMES)
            ) from None
        base_label = strategy_label(baseline)
        if base_label not in labels:
            entries.insert(0, (base_label, baseline))
    # the baseline's row first, the others in the order given
    entries.sort(key=lambda entry: entry[0] != base_label)

    rows = []
    with _progress(len(entries), enabled=progress) as advance:
        for label, strategy in entries:
            advance(label)
            rows.append(
                (
                    label,
                    measure(
                        fn,
                        *args,
                        argnums=argnums,
                        strategy=strategy,
                        repeats=repeats,
                        has_aux=has_aux,
                        optimizer=optimizer,
                        roll=roll,
                        # the "none" row is the program as written, its checkpoints kept
                        override=override and strategy_label(strategy) != "none",
                    ),
                )
            )
        advance(None)
    return Report(
        rows=tuple(rows), baseline=base_label, machine=current_machine(compile_target), title=title
    )


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str | None], None]]:
    """Yields ``advance(label)``: marks the previous step done and shows ``label`` running."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    bar = Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (enabled and console.is_terminal),
    )
    task = bar.add_task("measuring", total=total)
    started = [False]

    def advance(label: str | None) -> None:
        if started[0]:
            bar.advance(task)
        started[0] = True
        if label is not None:
            bar.update(task, description=f"compiling and measuring [bold]{label}[/bold]")

    with bar:
        yield advance
