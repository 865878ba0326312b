"""``remat compare TARGET --strategies a,b,c``: measure a program under several strategies."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from ._errors import EXIT_USAGE, CliError

_BARE = ("none", "full", "dots", "dots_no_batch", "everything")
_SCHEDULE = re.compile(r"^(?P<policy>.+)\+(?P<kind>nested|binomial)\((?P<n>\d+)\)$")


_UNKNOWN_CLI = (
    "{where} got {got!r}, which is not a known strategy; {hint}write one of {names}, "
    "names:NAME,NAME or offload:NAME,NAME, optionally followed by +nested(LEVELS) or "
    "+binomial(SNAPSHOTS), e.g. 'full+nested(2)'"
)


def parse_strategy(text: str, where: str = "remat compare --strategies"):
    """A strategy from its command-line spelling: a strategy string, optionally followed by
    ``+nested(LEVELS)`` or ``+binomial(SNAPSHOTS)`` (the labels `remat.Strategy.name` gives).

    Example:
      >>> from remat._cli._cli_compare import parse_strategy
      >>> parse_strategy("full+binomial(3)")
      Strategy(policy='full', scans=None, schedule=Binomial(snapshots=3))
      >>> parse_strategy("dots")
      'dots'
    """
    from .._core._schedule import Binomial, Nested
    from .._core._strategy import Strategy, check_policy

    match = _SCHEDULE.match(text)
    try:
        if match:
            n = int(match["n"])
            schedule = Nested(levels=n) if match["kind"] == "nested" else Binomial(n)
            check_policy(match["policy"], where)
            return Strategy(match["policy"], schedule=schedule)
        check_policy(text, where)
    except ValueError as err:
        if "not a known strategy" in str(err):
            raise CliError(_unknown_strategy(text, where), EXIT_USAGE) from err
        raise CliError(str(err).replace("`", ""), EXIT_USAGE) from err
    return text


def _unknown_strategy(text: str, where: str) -> str:
    """The message for a strategy the shell spelled wrong, in the shell's own terms."""
    import difflib

    from .._core._strategy import STRATEGY_NAMES

    bare = [n for n in STRATEGY_NAMES if "<" not in n]
    close = difflib.get_close_matches(text.split("+")[0], bare, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return _UNKNOWN_CLI.format(where=where, got=text, hint=hint, names=", ".join(bare))


def split_strategies(text: str) -> list[str]:
    """Splits ``--strategies``: at ``;`` if there is one, else at commas, where a piece that is
    not a strategy of its own continues the ``names:``/``offload:`` list before it.

    Example:
      >>> from remat._cli._cli_compare import split_strategies
      >>> split_strategies("none,full,names:qkv,attn_out,dots")
      ['none', 'full', 'names:qkv,attn_out', 'dots']
    """
    if ";" in text:
        return [p.strip() for p in text.split(";") if p.strip()]
    pieces: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        new = piece in _BARE or ":" in piece or _SCHEDULE.match(piece) or not pieces
        if not new and pieces[-1].startswith(("names:", "offload:")):
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    return pieces


def parse_argnums(text: str) -> int | tuple[int, ...]:
    """``"0"`` -> 0, ``"0,1"`` -> (0, 1); anything else is a usage error."""
    try:
        nums = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise CliError(
            f"--argnums got {text!r}; expected an int or ints separated by commas, e.g. 0 or 0,1",
            EXIT_USAGE,
        ) from None
    return nums[0] if len(nums) == 1 else nums


def register(subparsers) -> None:
    from ._target import add_compile_target, add_step_arguments

    parser = subparsers.add_parser(
        "compare",
        help="measure a program under several checkpointing strategies",
        description=(
            "Measure FACTORY()'s (fn, args) under each strategy: compiled peak memory, "
            "residuals, FLOPs with loop trip counts and step time, side by side."
        ),
    )
    parser.add_argument("target", metavar="FILE_OR_MODULE:FACTORY")
    parser.add_argument(
        "--strategies",
        required=True,
        help="comma-separated strategies, e.g. 'full,dots,names:qkv,attn_out,full+nested(2)' "
        "(use ';' to separate them if a name could be mistaken for a strategy)",
    )
    parser.add_argument("--baseline", default="none", help="strategy compared with (default none)")
    add_step_arguments(parser)
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs per strategy (default 5; 0 when FACTORY returns jax.ShapeDtypeStructs: "
        "shapes are compiled and measured, not run)",
    )
    parser.add_argument("--out", type=Path, help="directory for report.json and pareto.png")
    parser.add_argument(
        "--no-roll",
        action="store_true",
        help="apply the strategies to the program as written; by default repeated layers outside the program's scans are rolled into scans first",
    )
    parser.add_argument(
        "--override",
        action="store_true",
        help="replace the program's own checkpoints (jax.checkpoint, nn.remat) by each strategy; by default a scan that checkpoints already is left as written, and its row says so",
    )
    add_compile_target(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ._target import compile_target_of, load_target, repeats_for

    target = compile_target_of(args, "remat compare")

    strategies = {label: parse_strategy(label) for label in split_strategies(args.strategies)}
    if not strategies:
        raise CliError("--strategies is empty; give at least one, e.g. --strategies full,dots")
    baseline = parse_strategy(args.baseline, "remat compare --baseline")
    argnums = parse_argnums(args.argnums)
    if args.out is not None:  # a wrong path fails now, not after compiling
        from .._core._io import check_folder

        check_folder(args.out, ("report.json", "pareto.png"), "--out")
    fn, fn_args = load_target(args.target)
    from .._report._compare import compare  # after the cheap checks: a bad target fails fast

    report = compare(
        fn,
        *fn_args,
        strategies=strategies,
        baseline=args.baseline if args.baseline in strategies else baseline,
        argnums=argnums,
        repeats=repeats_for(args.repeats, fn_args, target),
        target=target,
        title=args.target,
        has_aux=args.has_aux,
        roll=not args.no_roll,
        override=args.override,
    )
    # As wide as the terminal (or $COLUMNS); at 60 columns the numbers still print whole.
    print(report.render(shutil.get_terminal_size((120, 24)).columns))
    if args.out is not None:
        try:
            print(f"wrote {report.to_json(args.out / 'report.json')}")
            print(f"wrote {report.plot(args.out / 'pareto.png')}")
        except OSError as err:
            raise CliError(f"cannot write into {args.out}: {err}", EXIT_USAGE) from err
    return 0
