"""JAX's own scan tests, run with `lax.scan` replaced by `remat.scan` on each schedule.

Given JAX's ``tests/lax_control_flow_test.py`` (take the one matching the installed JAX,
e.g. ``git show jax-v0.10.2:tests/lax_control_flow_test.py`` in a clone of jax-ml/jax),
this script writes a copy of it into a scratch folder in which the module's ``lax`` and
``jax`` names are proxies: ``lax.scan`` and ``jax.lax.scan`` are
``functools.partial(remat.scan, schedule=S)`` and every other attribute is JAX's own. Only
the test module's names change; remat, and JAX's own functions that scan internally
(``lax.map``, ``fori_loop``, ...), still call the real `lax.scan`. It then runs
``pytest -k scan`` on that copy once per schedule (one process at a time, one worker) and
prints, per schedule, the passed/failed/skipped counts and each failure with the first line
of its error. ``lax`` (the unpatched module) is the baseline.

A few of JAX's tests read `lax.scan`'s own jaxpr, parameters or residual layout rather
than its results; they are listed in `EXPECTED` and reported apart from the others.

Run::

    PYTHONPATH=src python benchmarks/jax_scan_conformance.py path/to/lax_control_flow_test.py
    # options: --schedules lax per_step 'Nested(2)' 'Binomial(2)'  --workdir DIR  --write
    #          --reuse (read the reports an earlier run left in --workdir)

``--write`` records the table in BENCHMARKS.md (between ``<!-- jaxscan:start -->`` and
``<!-- jaxscan:end -->``). Each schedule takes a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_MD = ROOT / "BENCHMARKS.md"
MARKERS = ("<!-- jaxscan:start -->", "<!-- jaxscan:end -->")
SCHEDULES = ("lax", "per_step", "Nested(2)", "Binomial(2)")

# Tests that inspect `lax.scan`'s own jaxpr, equation parameters or residual layout (not its
# numbers): they cannot hold for a scan built from other scans / a custom rule.
EXPECTED = {
    "test_scan_input_to_output_forwarding": "counts forwarded outputs in the scan equation",
    "test_scan_diff_of_print": "reads the params of the jaxpr's first equation",
    "test_scan_typecheck_param": "type-checks a hand-edited scan equation's params",
    "test_scan_vjp_forwards_extensive_residuals": "reads lax.scan's residual layout",
}

PROXY = '''\
"""Written by remat's benchmarks/jax_scan_conformance.py: `lax.scan` -> `remat.scan`."""
import functools
import os
import types

import jax as _jax
from jax import lax as _lax

import remat

_SPEC = os.environ["REMAT_JAXSCAN_SCHEDULE"]
if _SPEC.isidentifier():  # "per_step", "none"
    SCHEDULE = _SPEC
else:  # "Nested(2)", "Binomial(3)", "Nested(levels=3)"
    SCHEDULE = eval(_SPEC, {"Nested": remat.Nested, "Binomial": remat.Binomial})  # noqa: S307
SCAN = functools.partial(remat.scan, schedule=SCHEDULE)


class _Proxy(types.ModuleType):
    def __init__(self, real, **overrides):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(overrides)
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


lax = _Proxy(_lax, scan=SCAN)
jax = _Proxy(_jax, lax=lax)
'''


def patched_source(source: str) -> str:
    """The test module with ``jax`` and ``lax`` rebound to the proxies after its imports."""
    tree = ast.parse(source)
    last = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            last = node.end_lineno
        elif last and not isinstance(node, ast.Expr):
            break
    lines = source.splitlines(keepends=True)
    hook = "from _remat_scan_proxy import jax, lax  # remat: lax.scan -> remat.scan\n"
    return "".join([*lines[:last], hook, *lines[last:]])


def run_schedule(
    test_file: Path, spec: str, workdir: Path, extra: list[str], reuse: bool = False
) -> dict:
    """Runs ``pytest -k scan`` on a (patched, unless ``spec == "lax"``) copy; returns results.

    With ``reuse``, a report already in ``workdir`` from an earlier run is read instead."""
    folder = workdir / re.sub(r"\W+", "_", spec).strip("_")
    if reuse and (folder / "junit.xml").exists():
        return parse_junit(folder / "junit.xml")
    folder.mkdir(parents=True, exist_ok=True)
    source = test_file.read_text()
    if spec != "lax":
        source = patched_source(source)
        (folder / "_remat_scan_proxy.py").write_text(PROXY)
    (folder / "lax_control_flow_test.py").write_text(source)
    junit = folder / "junit.xml"
    env = dict(os.environ, REMAT_JAXSCAN_SCHEDULE=spec)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "pytest", "lax_control_flow_test.py", "-k", "scan",
        "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not junit.exists():  # 2+: collection error, usage
        sys.exit(f"pytest wrote no report for {spec}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return parse_junit(junit)


def parse_junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed"] += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures[name] = message[0][:200] if message else ""
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {"counts": counts, "failures": failures}


def expected_reason(name: str) -> str | None:
    for prefix, reason in EXPECTED.items():
        if name.startswith(prefix):
            return reason
    return None


def report(results: dict) -> str:
    lines = [
        "| schedule | tests | passed | failed | expected failures | other failures | skipped |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for spec, res in results.items():
        c, fails = res["counts"], res["failures"]
        expected = sum(expected_reason(n) is not None for n in fails)
        total = sum(c.values())
        lines.append(
            f"| {'lax.scan (baseline)' if spec == 'lax' else spec} | {total} | {c['passed']} "
            f"| {c['failed']} | {expected} | {c['failed'] - expected} | {c['skipped']} |"
        )
    lines.append("")
    for spec, res in results.items():
        for name, message in sorted(res["failures"].items()):
            why = expected_reason(name)
            tag = f"expected: {why}" if why else f"FAILED: {message}"
            lines.append(f"- {spec}: `{name}`: {tag}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("test_file", type=Path, help="JAX's tests/lax_control_flow_test.py")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (a temp dir)")
    parser.add_argument("--write", action="store_true", help="record the table in BENCHMARKS.md")
    parser.add_argument(
        "--reuse", action="store_true", help="read the reports already in --workdir, if any"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args()
    import jax

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="jaxscan-"))
    results = {}
    for spec in args.schedules:
        res = run_schedule(args.test_file.resolve(), spec, workdir, args.pytest_args, args.reuse)
        results[spec] = res
        print(f"{spec}: {res['counts']}", flush=True)
    table = report(results)
    print(table)
    if args.write:
        from remat._io import replace_section

        when = datetime.date.today().isoformat()
        body = (
            f"{MARKERS[0]}\n"
            "## JAX's scan tests on `remat.scan` (`benchmarks/jax_scan_conformance.py`)\n\n"
            f"JAX {jax.__version__}'s `tests/lax_control_flow_test.py`, the tests selected by "
            "`-k scan`, with the test module's `lax.scan` and `jax.lax.scan` replaced by "
            f"`functools.partial(remat.scan, schedule=S)`. Run {when} on "
            f"{platform.machine()}, Python {platform.python_version()}, with "
            "`PYTHONPATH=src python benchmarks/jax_scan_conformance.py "
            "lax_control_flow_test.py --write` (the file from `git show "
            f"jax-v{jax.__version__}:tests/lax_control_flow_test.py`). *Expected failures* are "
            "the tests that read `lax.scan`'s own jaxpr, parameters or residual layout.\n\n"
            f"{table}\n"
            f"{MARKERS[1]}"
        )
        replace_section(BENCH_MD, MARKERS, body)


if __name__ == "__main__":
    main()
