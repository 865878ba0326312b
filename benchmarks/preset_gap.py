"""A MaxText preset against the planner's rewrite of the same save set, and what keeping the
scan body's jitted calls whole does to a save set's compiled peak.

``scale_bench.py``'s decoder at one of its shapes: the preset (``nn.remat(layer,
policy=save_only_these_names(...))`` in the scan) and the un-checkpointed decoder rewritten by
the planner (`remat._trace._tag.rewrite`) to save the values that carry the preset's
`checkpoint_name` s, and the preset's own policy around the scan body left untagged, with
the jitted functions in it inlined as the planner inlines them (`remat._trace._tag.flatten`)
and kept as calls, each compiled as the planner compiles a step, with XLA's dump read by
loop phase (`remat._measure._phases.loop_phases`). Prints the peak, temporaries, the live
bytes of each phase and the matmul FLOPs of both: where the planner's plan at the preset's
own peak recomputes more than the preset, this shows whether the same save set fits.

``--plan BUDGET`` instead plans the un-checkpointed decoder at ``BUDGET`` (``"50%"``) and
compiles the plan's save set as the planner writes it (every jitted call in the body
inlined, so that each value in it can be named) and with the calls named in ``--keep``
(``jnp.where``'s is ``_where``; default: every call none of whose values is saved) bound
whole, the values outside them tagged with the same names.

``--names N1,N2,...`` instead compiles the save set of those planner names
(``remat_s0_e14,...``, as `remat.Plan.scans` lists them) with every call inlined and with
the calls that hold none of them kept (`ScanChoice.kept_calls`): a set the search compiled
or checked on its scans alone, against the preset's peak.

``--given`` instead plans the un-checkpointed decoder at the preset's own compiled peak with
the preset's names given as a strategy (``strategies=("names:...",)``: compiled whole, and
kept as calls where it misses by little, `remat._plan._calls.near_miss`), and prints the
plan's FLOPs against the preset's, its compiled peak and its compiles: what the planner
reaches when it knows the preset's set, against `scale_bench.py`'s row, where it does not.

Usage:
  PYTHONPATH=src python benchmarks/preset_gap.py [--model Llama-3-8B] [--preset minimal]
  PYTHONPATH=src python benchmarks/preset_gap.py --given [--model Llama-3-8B] [--preset minimal]
  PYTHONPATH=src python benchmarks/preset_gap.py --model Llama-3.2-1B --plan 50% [--keep _where]
  PYTHONPATH=src python benchmarks/preset_gap.py --names remat_s0_e14,remat_s0_e45,...
"""

from __future__ import annotations

import argparse

from scale_bench import MODELS, sizes_of


def plan_forms(args, sizes, spec) -> None:
    """``--plan``: the plan's save set compiled with every call inlined and with calls kept."""
    import jax

    import remat
    from remat._measure._peak import compiled_memory
    from remat._measure._step import lower_step
    from remat._models._maxtext import decoder_shapes
    from remat._trace._rewrite import lax_loop, rewrite_scans
    from remat._trace._tag import ScanChoice, keeps_a_call, rewrite, tagged_body

    loss, shapes = decoder_shapes(None, sizes)
    p = remat.plan(loss, *shapes, budget=args.plan, optimizer=spec.optimizer, verbose=False)
    (scan,) = p.scans
    if scan.schedule != "per_step" or scan.pattern:
        raise SystemExit(f"the plan's scan is {scan.schedule!r}: this compares per-step plans")
    names = scan.names
    keep = None if args.keep is None else set(args.keep.split(","))
    policy = jax.checkpoint_policies.save_only_these_names(*names)

    def kept(info, _):
        if not keeps_a_call(info, names):
            raise SystemExit("no jitted call of the body is kept for this save set")
        body = tagged_body(info, names, keep)  # the calls in ``keep`` (None: all) kept
        return jax.checkpoint(body, policy=policy, prevent_cse=False)

    programs = {
        "inlined": rewrite(loss, {scan.position: ScanChoice(names=names)}),
        "kept": rewrite_scans(loss, kept, lax_loop),
    }
    print(f"{args.model} plan at {args.plan}: {len(names)} values saved per step, "
          f"plan's compiled peak {p.measured_peak_bytes:,}", flush=True)  # fmt: skip
    for label, fn in programs.items():
        m = compiled_memory(lower_step(fn, shapes, spec).compile())
        print(f"  calls {label:8s} (kept: {args.keep or 'all'}) peak {m.peak_bytes:,}", flush=True)


def named_forms(args, sizes, spec) -> None:
    """``--names``: that save set compiled with every call inlined and with calls kept."""
    from remat._measure._hlo import hlo_flops
    from remat._measure._peak import compiled_memory
    from remat._measure._step import lower_step
    from remat._models._maxtext import decoder_shapes
    from remat._trace._tag import ScanChoice, rewrite

    loss, shapes = decoder_shapes(None, sizes)
    names = tuple(args.names.split(","))
    for kept in (False, True):
        fn = rewrite(loss, {0: ScanChoice(names=names, kept_calls=kept)})
        compiled = lower_step(fn, shapes, spec).compile()
        m = compiled_memory(compiled)
        print(f"{args.model} {len(names)} names, calls {'kept' if kept else 'inlined':7s} "
              f"peak {m.peak_bytes:,} FLOPs {hlo_flops(compiled.as_text()):.6e}", flush=True)  # fmt: skip


def given_plan(args, sizes, spec) -> None:
    """``--given``: the plan at the preset's peak with the preset's names given."""
    import time

    import optax

    import remat
    from remat._measure._hlo import hlo_flops
    from remat._measure._peak import compiled_memory
    from remat._measure._step import lower_step
    from remat._models._maxtext import PRESETS, decoder_shapes
    from remat._plan._costmodel import model_scans
    from remat._trace._tag import planned_scans

    compiled = lower_step(*decoder_shapes(PRESETS[args.preset], sizes), spec).compile()
    peak, flops = compiled_memory(compiled).peak_bytes, hlo_flops(compiled.as_text())
    loss, shapes = decoder_shapes(None, sizes)
    (model,) = model_scans(planned_scans(loss, *shapes))
    tagged = {v.user_name for v in model.values if v.user_name}
    names = [n for n in PRESETS[args.preset] if n in tagged]
    start = time.perf_counter()
    p = remat.plan(loss, *shapes, budget=peak, optimizer=optax.adam(1e-4), verbose=False,
                   strategies=("names:" + ",".join(names),))  # fmt: skip
    print(f"{args.model} {args.preset} peak {peak:,}: plan with the preset's names given "
          f"{time.perf_counter() - start:.1f} s, {p.stats.step_compiles} + "
          f"{p.stats.scan_compiles} compiles, compiled {p.measured_peak_bytes:,}, FLOPs "
          f"{p.measured.flops / flops:.4f}x the preset's, calls kept "
          f"{any(s.kept_calls for s in p.scans)}", flush=True)  # fmt: skip


def main() -> None:
    import jax
    import optax

    from remat._measure._hlo import hlo_flops
    from remat._measure._peak import compiled_memory
    from remat._measure._phases import loop_phases
    from remat._measure._step import ANALYSIS_OPTIONS, Step, as_step, lower_step
    from remat._measure._xla_dump import compile_with_dump
    from remat._models._maxtext import PRESETS, decoder_shapes
    from remat._plan._costmodel import model_scans
    from remat._plan._options import assemble, candidates, fixed_choice
    from remat._trace._rewrite import lax_loop, rewrite_scans
    from remat._trace._tag import _eval_inlined, flatten, planned_scans, rewrite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-3-8B", choices=sorted(MODELS))
    parser.add_argument("--preset", default="minimal")
    parser.add_argument("--plan", help="plan at this budget and compare the calls' forms")
    parser.add_argument("--keep", help="with --plan: the calls kept, by name (a,b); else all")
    parser.add_argument("--names", help="compile this planner save set (a,b) in both forms")
    parser.add_argument("--given", action="store_true", help="plan with the preset given")
    args = parser.parse_args()
    sizes = sizes_of(MODELS[args.model], 4096)
    spec = as_step(Step(0, False, optax.adam(1e-4)))
    if args.plan:
        plan_forms(args, sizes, spec)
        return
    if args.names:
        named_forms(args, sizes, spec)
        return
    if args.given:
        given_plan(args, sizes, spec)
        return
    loss, shapes = decoder_shapes(None, sizes)
    infos = planned_scans(loss, *shapes)
    models = model_scans(infos)
    cands = candidates(models, False)
    _, _, offsets = assemble(cands)
    names = set(PRESETS[args.preset])
    saved = frozenset(i for i, v in enumerate(models[0].values) if v.user_name in names)
    choice = fixed_choice(cands, offsets, models, [0], save=saved)
    policy = jax.checkpoint_policies.save_only_these_names(*names)

    def untagged(info, _):  # the scan body as traced, under the preset's policy
        flat, nk = flatten(info.jaxpr), info.num_carry

        def body(consts, carry, xs):
            outs = _eval_inlined(flat.jaxpr, flat.consts, [*consts, *carry, *xs])
            return list(outs[:nk]), list(outs[nk:])

        return jax.checkpoint(body, policy=policy, prevent_cse=False)

    def calls(info, _):  # the same with the body's jitted functions kept as calls
        nk = info.num_carry

        def body(consts, carry, xs):
            outs = jax.core.eval_jaxpr(info.jaxpr.jaxpr, info.jaxpr.consts, *consts, *carry, *xs)
            return list(outs[:nk]), list(outs[nk:])

        return jax.checkpoint(body, policy=policy, prevent_cse=False)

    programs = {
        "preset": decoder_shapes(PRESETS[args.preset], sizes),
        "planner": (rewrite(loss, choice.choices), shapes),
        "untagged": (rewrite_scans(loss, untagged, lax_loop), shapes),
        "calls": (rewrite_scans(loss, calls, lax_loop), shapes),
    }
    for label, (fn, fn_args) in programs.items():
        compiled, dump = compile_with_dump(lower_step(fn, fn_args, spec), ANALYSIS_OPTIONS)
        m, p = compiled_memory(compiled), loop_phases(dump)
        print(
            f"{args.model} {args.preset} {label:8s} peak {m.peak_bytes:,} temp {m.temp_bytes:,} "
            f"FLOPs {hlo_flops(compiled.as_text()):.6e}",
            flush=True,
        )
        print(f"  phases (live bytes): {p}", flush=True)


if __name__ == "__main__":
    main()
