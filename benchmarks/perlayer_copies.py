"""Is a per-layer step's compile time XLA compiling a second copy of the layer?

On the models of `benchmarks/vs_torch.py` (8 layers in one ``lax.scan``), at each budget:
``remat.plan(..., per_layer=False)`` and ``per_layer=True`` (each from scratch) give a
uniform save set ``U`` and a per-layer pattern (two runs of layers, each saving one set).
The step ``jax.value_and_grad`` of the loss is then compiled (XLA's default options: what
the user's ``jax.jit`` compiles) with the scan in six forms, interleaved, each `REPEATS`
times, in a fresh process per XLA flag setting (``XLA_FLAGS`` is read once per process):

- ``uniform``: ``U`` in every layer of the plain scan (the uniform plan's scan);
- ``one run``: ``U`` in every layer, as segments (`remat._trace._periodic.segments`, the
  planner's per-layer form): one loop, the segments' custom VJP;
- ``U twice``: ``U`` in every layer, as segments split where the per-layer plan splits (two
  runs of the same save set: the second set a copy of the first, one name apart that no
  value has; a run of one layer is no loop, XLA inlines it);
- ``U twice, even``: the same, split in halves (two loops of the same length: where XLA
  could reuse the first loop's kernels for the second);
- ``per-layer``: the per-layer plan's pattern, as segments;
- ``per-layer, even``: its two save sets, the first in the first half of the layers and the
  second in the others (other FLOPs and memory: a form, not a plan).

If ``U twice`` costs what ``per-layer`` costs over ``uniform``, the compile time is XLA
compiling a second copy of the layer (whatever the sets), not the choice of sets. Each form
is compiled once more with ``--xla_dump_to`` to count its kernels (XLA:CPU emits one LLVM
module per fused kernel: ``*_kernel_module.ir-no-opt.ll``), and how many of them are
distinct once the numbers in value names and the metadata are removed (identical kernels
emitted twice would be a copy XLA does not reuse; XLA:CPU emits an identical fusion once,
so fewer kernels in a form of two runs means kernels shared between them). Per flag
setting, each form's median CPU seconds in the child process (``time.process_time``:
XLA's compile threads included; other jobs on the machine barely change it) and its ratio
to ``uniform``.

Usage:
  PYTHONPATH=src python benchmarks/perlayer_copies.py [--arch gpt,mlp] [--budgets 40%,25%]
      [--repeats 3] [--xla-flags=--xla_cpu_parallel_codegen_split_count=1 ...] [--job JSON]

``--job`` takes the save sets a run printed (``--job '{...}'``), instead of planning again.

Nothing is written to BENCHMARKS.md: the numbers are quoted where they are read (the docs'
section on per-layer compile time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

REPEATS = 3
FORMS = ("uniform", "one run", "U twice", "U twice, even", "per-layer", "per-layer, even")
# A name no value of the layer has: the second run's save set is the first's with it, so
# that the two runs are two segments saving the same values.
COPY = "__perlayer_copies_second_run__"


def model(kind: str):
    import vs_torch

    sizes = vs_torch.FULL
    args = (jax.tree.map(jnp.asarray, vs_torch.init_params(kind, **sizes)),
            jnp.asarray(vs_torch.init_inputs(kind, **sizes)))  # fmt: skip
    return vs_torch.make_jax_loss(kind, sizes["heads"]), args


def sets(kind: str, budgets: list[str]) -> list[dict]:
    """Per budget whose per-layer plan mixes two sets: the uniform plan's names and the
    per-layer plan's pattern."""
    from perlayer_compile import both_plans

    loss, args = model(kind)
    out = []
    for spec in budgets:
        got = both_plans(loss, args, spec)
        (uniform,) = [s for s in got[False].scans if s.names is not None]
        mixed = [s for s in got[True].scans if s.pattern and len(set(s.pattern)) > 1]
        if not mixed:
            print(f"{kind} {spec}: the per-layer plan saves one set in every layer; skipped")
            continue
        out.append(dict(kind=kind, budget=spec, uniform=list(uniform.names),
                        names=list(mixed[0].names),
                        pattern=[list(p) for p in mixed[0].pattern]))  # fmt: skip
    return out


def choices(job: dict) -> dict:
    """The scan's `ScanChoice` in each form of `FORMS`."""
    from remat._trace._periodic import runs
    from remat._trace._tag import ScanChoice

    u = tuple(job["uniform"])
    pattern = tuple(tuple(p) for p in job["pattern"])
    n = len(pattern)

    def twice(spans):
        return ScanChoice(
            names=(*u, COPY),
            pattern=tuple(
                (*u, COPY) if r % 2 else u for r, (a, b) in enumerate(spans) for _ in range(a, b)
            ),
        )

    return {
        "uniform": ScanChoice(names=u),
        "one run": ScanChoice(names=u, pattern=(u,) * n),
        "U twice": twice(runs(pattern)),
        "U twice, even": twice([(0, n // 2), (n // 2, n)]),
        "per-layer": ScanChoice(names=tuple(job["names"]), pattern=pattern),
        "per-layer, even": ScanChoice(
            names=tuple(job["names"]),
            pattern=(pattern[0],) * (n // 2) + (pattern[-1],) * (n - n // 2),
        ),
    }


def kernels(dump: Path) -> tuple[int, int]:
    """``(kernels, distinct kernels)`` of the compiles dumped in ``dump``: the LLVM modules
    XLA:CPU emitted, compared with the numbers in value names (``add.12``) removed."""
    texts = []
    for path in dump.glob("*_kernel_module.ir-no-opt.ll"):
        text = "\n".join(line for line in path.read_text().splitlines()
                         if not line.startswith(("; ModuleID", "source_filename", "!")))  # fmt: skip
        texts.append(re.sub(r"[._]\d+", "", re.sub(r"!\d+", "!", text)))
    return len(texts), len(set(texts))


def child(job: dict, repeats: int) -> dict:
    """The forms of ``job`` compiled in turn, ``repeats`` times, the order rotating each
    round: per form the median CPU seconds, the HLO lines and loops, and its kernels."""
    from remat._trace._tag import planned_scans, rewrite

    loss, args = model(job["kind"])
    position = planned_scans(loss, *args)[0].position
    fns = {k: rewrite(loss, {position: c}) for k, c in choices(job).items()}

    def compile_(fn):
        return jax.jit(jax.value_and_grad(lambda *a: fn(*a))).lower(*args).compile()

    compile_(fns["uniform"])  # warm: the first compile in a process is slower
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    labels = list(fns)
    for r in range(repeats):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            start = time.process_time()
            compile_(fns[label])
            cpu[label].append(time.process_time() - start)
    out = {}
    for label, fn in fns.items():
        hlo = compile_(fn).as_text()
        out[label] = dict(cpu=statistics.median(cpu[label]), lines=len(hlo.splitlines()),
                          loops=hlo.count(" while("))  # fmt: skip
    return out


def dumped(job: dict, flags: str) -> dict:
    """Each form's ``(kernels, distinct)`` (`kernels`), one child process per form."""
    out = {}
    for label in FORMS:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_dump_to={tmp}".strip())
            subprocess.run([sys.executable, __file__, "--dump", json.dumps(job), label],
                           env=env, check=True)  # fmt: skip
            out[label] = kernels(Path(tmp))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="gpt,mlp")
    parser.add_argument("--budgets", default="40%,25%")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument(
        "--xla-flags",
        action="append",
        default=None,
        help="an XLA_FLAGS setting to compare with the default (repeatable)",
    )
    parser.add_argument(
        "--job",
        action="append",
        default=None,
        help="the save sets as this script prints them (JSON), instead of planning",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dump", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        print("RESULT " + json.dumps(child(json.loads(opts.child), opts.repeats)), flush=True)
        return 0
    if opts.dump:
        job, label = json.loads(opts.dump[0]), opts.dump[1]
        from remat._trace._tag import planned_scans, rewrite

        loss, args = model(job["kind"])
        fn = rewrite(loss, {planned_scans(loss, *args)[0].position: choices(job)[label]})
        jax.jit(jax.value_and_grad(lambda *a: fn(*a))).lower(*args).compile()
        return 0
    began = time.perf_counter()
    if opts.job:
        jobs = [json.loads(j) for j in opts.job]
    else:
        jobs = [j for kind in opts.arch.split(",") for j in sets(kind, opts.budgets.split(","))]
    settings = ["", *(opts.xla_flags or [])]
    for job in jobs:
        pattern = [len(p) for p in job["pattern"]]
        print(f"\n--job '{json.dumps(job)}'")
        print(f"\n{job['kind']} {job['budget']}: uniform saves {len(job['uniform'])} values "
              f"per layer; per-layer plan saves {pattern}")  # fmt: skip
        counts = dumped(job, "")
        print("  kernels (distinct): " + "; ".join(
            f"{label} {n} ({d})" for label, (n, d) in counts.items()))  # fmt: skip
        for flags in settings:
            env = dict(os.environ, XLA_FLAGS=flags)
            run = subprocess.run([sys.executable, __file__, "--child", json.dumps(job),
                                  "--repeats", str(opts.repeats)], env=env, check=True,
                                 capture_output=True, text=True)  # fmt: skip
            (line,) = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
            got = json.loads(line[len("RESULT ") :])
            base = got["uniform"]["cpu"]
            print(f"  XLA_FLAGS={flags or '(none)'}: " + "; ".join(
                f"{label} {v['cpu']:.2f} s ({v['cpu'] / base:.2f}x, {v['lines']} HLO lines, "
                f"{v['loops']} loops)" for label, v in got.items()), flush=True)  # fmt: skip
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{time.perf_counter() - began:.0f} s; load average {load} (1/5/15 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
