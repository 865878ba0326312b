"""``remat lint TARGET``: report checkpointing mistakes in a program, as `remat.lint` does.

Exit codes follow linters (and the rest of the CLI for errors): 0 when there are no findings,
1 when there are findings (``--exit-zero`` makes it 0), 2 for a usage error (a target that
cannot be loaded, a factory that raises, an unknown strategy). Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ._errors import EXIT_OK, CliError

EXIT_FINDINGS = 1

_HELP = "check a program for checkpointing mistakes (exit 0: none, 1: findings, 2: usage error)"


def register(subparsers) -> None:
    from ._target import add_compile_target

    parser = subparsers.add_parser("lint", help=_HELP, description=_HELP)
    parser.add_argument(
        "target",
        metavar="TARGET",
        help="FILE.py:FACTORY or package.module:FACTORY; FACTORY() returns (loss_fn, args)",
    )
    parser.add_argument(
        "--strategy",
        default=None,
        help="lint remat.apply(loss_fn, STRATEGY) instead (e.g. full, dots, names:a,b)",
    )
    parser.add_argument(
        "--no-measure",
        action="store_true",
        help="skip compiling the gradient (no RM005: checkpoints the compiler removed)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the findings as JSON")
    parser.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even when there are findings"
    )
    parser.add_argument(
        "--no-roll",
        action="store_true",
        help="with --strategy: apply it to the program as written; by default repeated layers outside the program's scans are rolled into scans first",
    )
    parser.add_argument(
        "--has-aux",
        action="store_true",
        help="fn returns (loss, aux), as for jax.value_and_grad(..., has_aux=True)",
    )
    add_compile_target(parser)
    parser.set_defaults(func=run)


def _load(spec: str):
    from ._target import load_target

    try:
        loaded = load_target(spec)
    except CliError:
        raise
    except Exception as err:  # a factory that raises: one line, exit 2, no traceback
        first = str(err).splitlines()[0] if str(err) else ""
        raise CliError(f"could not load {spec!r}: {type(err).__name__}: {first}") from err
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and callable(loaded[0])):
        raise CliError(f"target {spec!r} must return (loss_fn, args); got {type(loaded).__name__}")
    fn, args = loaded
    return fn, tuple(args) if isinstance(args, list | tuple) else (args,)


def run(args: argparse.Namespace) -> int:
    from .._core._strategy import check_policy
    from .._lint._lint import lint

    if args.strategy is not None:
        try:
            check_policy(args.strategy, "remat lint --strategy")
        except ValueError as err:
            raise CliError(str(err)) from err
    if args.json:  # a wrong path fails now, not after compiling
        from .._core._io import check_writable

        check_writable(args.json, "--json")
    from ._target import compile_target_of

    target = compile_target_of(args, "remat lint")
    fn, fn_args = _load(args.target)
    try:
        findings = lint(
            fn, *fn_args, strategy=args.strategy, measure=not args.no_measure,
            roll=not args.no_roll, target=target, has_aux=args.has_aux,
        )  # fmt: skip
    except (TypeError, ValueError) as err:
        raise CliError(str(err).splitlines()[0]) from err
    for finding in findings:
        print(finding)
    count = len(findings)
    print(f"{count} finding{'s' * (count != 1)}" if count else "no findings")
    if args.json:
        from .._core._io import atomic_write_text

        payload = {
            "target": args.target,
            "findings": [dataclasses.asdict(f) for f in findings],
        }
        try:
            atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
        except OSError as err:  # an unwritable path: one line, and no partial file
            raise CliError(f"cannot write {args.json}: {err.strerror or err}") from err
    if findings and not args.exit_zero:
        return EXIT_FINDINGS
    return EXIT_OK
