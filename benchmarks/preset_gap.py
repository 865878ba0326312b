"""A MaxText preset against the planner's rewrite of the same save set.

``scale_bench.py``'s decoder at one of its shapes: the preset (``nn.remat(layer,
policy=save_only_these_names(...))`` in the scan) and the un-checkpointed decoder rewritten by
the planner (`remat._trace._tag.rewrite`: the body's jitted calls that hold no saved value
kept whole, `remat._trace._kept`) to save the values that carry the preset's
`checkpoint_name` s, and the preset's own policy around the scan body left untagged, with
the jitted functions in it all inlined (``untagged``: `remat._trace._tag.flatten`, as the
planner's rewrite did before it kept calls) and all kept as calls (``calls``), each compiled
as the planner compiles a step, with XLA's dump read by loop phase
(`remat._measure._phases.loop_phases`). Prints the peak, temporaries, the live bytes of each
phase and the matmul FLOPs of each: where the planner's plan at the preset's own peak
recomputes more than the preset, this shows whether the same save set fits as the planner
writes it.

Usage:
  PYTHONPATH=src python benchmarks/preset_gap.py [--model Llama-3-8B] [--preset minimal]
"""

from __future__ import annotations

import argparse

from scale_bench import MODELS, sizes_of


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
    args = parser.parse_args()
    sizes = sizes_of(MODELS[args.model], 4096)
    spec = as_step(Step(0, False, optax.adam(1e-4)))
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
