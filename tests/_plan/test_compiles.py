"""What a plan costs, and what it knows: whole-step compiles are counted, predictions are
judged on programs the planner was not tuned on, every save set of a small body is
enumerated, and a budget exactly at a known point's peak gets that point or better."""

from __future__ import annotations

import io
import itertools

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import remat
from conftest import fixed_save_sets
from conftest import mlp_stack as shared_mlp_stack
from remat._measure._hlo import hlo_flops
from remat._measure._peak import peak_bytes
from remat._models._gpt import make_gpt
from remat._plan import _compile, _memo
from remat._plan._progress import Progress


def mlp_stack():
    """The planner's tests' MLP stack at other sizes (a program it was not tuned on)."""
    return shared_mlp_stack(layers=6, d=24, batch=96, seed=7)


def gated_recurrence(steps=96, batch=16, d=32):
    k = jax.random.split(jax.random.key(8), 3)
    params = {"wz": jax.random.normal(k[0], (d, d)) * 0.1,
              "wh": jax.random.normal(k[1], (d, d)) * 0.1}  # fmt: skip
    xs = jax.random.normal(k[2], (steps, batch, d))

    def loss(params, xs):
        def step(h, x):
            z = jax.nn.sigmoid((h + x) @ params["wz"])
            return (1 - z) * h + z * jnp.tanh((h * x) @ params["wh"]), None

        h, _ = jax.lax.scan(step, jnp.zeros((batch, d)), xs)
        return jnp.mean(h**2)

    return loss, (params, xs)


class Counter:
    """Counts every compile in the process by the size of its program (`Lowered.compile` is
    wrapped), and the planner's own tally of whole-step compiles."""

    def __init__(self, monkeypatch, loss, args):
        self.reference = len(jax.jit(jax.value_and_grad(loss)).lower(*args).as_text())
        self.sizes: list[int] = []
        original = jax.stages.Lowered.compile
        sizes = self.sizes

        def compile(lowered, *a, **k):
            sizes.append(len(lowered.as_text()))
            return original(lowered, *a, **k)

        monkeypatch.setattr(jax.stages.Lowered, "compile", compile)
        self.start = _compile.tally()[0]

    def step_compiles(self) -> int:
        return _compile.tally()[0].get("step", 0) - self.start.get("step", 0)

    def large(self) -> int:
        """Compiles of programs at least half the size of the step (the step itself, and
        scan-alone programs, whose body is most of the step)."""
        return sum(size >= 0.5 * self.reference for size in self.sizes)

    def tallied(self) -> int:
        now = _compile.tally()[0]
        return sum(now.values()) - sum(self.start.values())


def test_compiles_first_plan_again_and_budgets(monkeypatch):
    _memo.forget()
    loss, args = mlp_stack()
    count = Counter(monkeypatch, loss, args)
    p = remat.plan(loss, *args, budget=0.7)
    first = count.step_compiles()
    assert first <= 3, first  # the baseline and at most 2 rounds
    assert p.stats.step_compiles == first and p.rounds <= 2
    # Nothing compiles a large program behind the planner's back.
    assert count.large() <= count.tallied()
    q = remat.plan(loss, *args, budget=0.5)  # the same program: known, and calibrated
    assert count.step_compiles() - first <= 1
    assert q.stats.step_compiles <= 1
    _memo.forget()
    before = count.step_compiles()
    budgets = (0.8, 0.5, 0.35, 0.25)
    remat.plan_budgets(loss, *args, budgets=budgets)
    assert count.step_compiles() - before <= len(budgets) + 2


def test_compiler_options_change_neither_memory_nor_flops():
    for loss, args in (mlp_stack(), gated_recurrence()):
        lowered = jax.jit(jax.value_and_grad(loss)).lower(*args)
        fast, default = lowered.compile(_compile.COMPILER_OPTIONS), lowered.compile()
        assert peak_bytes(fast) == peak_bytes(default)
        assert hlo_flops(fast.as_text()) == hlo_flops(default.as_text())


def test_scan_options_change_neither_memory_phases_nor_flops_of_a_scan_alone():
    """A scan alone compiled with `_compile.SCAN_CPU_OPTIONS` (fusion emitters off, one LLVM
    module) has the memory, loop phases and FLOPs it has with `COMPILER_OPTIONS`, saving nothing,
    saving the unfused values and as written: the calibration reads them."""
    from remat._measure._phases import loop_phases
    from remat._measure._xla_dump import compile_with_dump
    from remat._plan._body import lower_scan

    loss, args = make_gpt(layers=2, d_model=32, seq=16, batch=2, heads=2)
    info, length, choices = fixed_save_sets(loss, args, (False, "unfused"))
    assert _compile.scan_options() is _compile.SCAN_CPU_OPTIONS
    for choice in [*choices, None]:
        lowered = lower_scan(info, choice, length)
        read = [compile_with_dump(lowered, o) for o in (_compile.SCAN_CPU_OPTIONS,
                                                        _compile.COMPILER_OPTIONS)]  # fmt: skip
        (fast, fast_dump), (slow, slow_dump) = read
        assert (
            fast.memory_analysis().temp_size_in_bytes == slow.memory_analysis().temp_size_in_bytes
        )
        assert peak_bytes(fast) == peak_bytes(slow)
        assert loop_phases(fast_dump) == loop_phases(slow_dump) is not None
        assert hlo_flops(fast.as_text()) == hlo_flops(slow.as_text()) > 0


def test_a_scan_option_this_jaxlib_lacks_falls_back_to_the_steps_options():
    lowered = jax.jit(lambda x: jnp.sin(x) @ x).lower(jnp.ones((8, 8)))
    unknown = {**_compile.SCAN_CPU_OPTIONS, "xla_cpu_not_an_option": True}
    before = _compile.tally()[0].get(_compile.SCAN, 0)
    compiled = _compile.compile_lowered(lowered, _compile.SCAN, options=unknown)
    assert peak_bytes(compiled) == peak_bytes(lowered.compile(_compile.COMPILER_OPTIONS))
    assert _compile.tally()[0].get(_compile.SCAN, 0) == before + 1
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such compile option"):
        lowered.compile(unknown)  # the option is refused as such


def test_named_strategies_are_compiled_alone_beside_the_first_plans_step(monkeypatch):
    """Near the budget the named strategies compete (`_named.try_named`); the one that is
    no calibration point (``dots``) is compiled alone while the plan's step compiles
    (`_ahead.look_ahead`), so checking them compiles nothing more. One the model puts far
    over the budget (`_named.far_over`) is neither looked ahead for nor checked: on this
    stack at 35% ``dots`` is (the model puts it 2.3x the budget), and its scans alone put it
    over the budget too, so `try_named` compiles the same steps (none) without checking it."""
    from remat._plan import _named, _rounds
    from remat._plan._memo import best_known, step_flops
    from remat._plan._options import alone_key

    far = _named.FAR
    monkeypatch.setattr(_named, "FAR", float("inf"))  # every named candidate looked ahead for
    _memo.forget()
    loss, args = shared_mlp_stack()
    compiled_during = []
    real = _rounds.try_named

    def try_named(*a, **k):
        before = _compile.tally()[0].get(_compile.SCAN, 0)
        real(*a, **k)
        compiled_during.append(_compile.tally()[0].get(_compile.SCAN, 0) - before)

    monkeypatch.setattr(_rounds, "try_named", try_named)
    p = remat.plan(loss, *args, budget="35%", verbose=False)
    assert compiled_during == [0]
    know = next(reversed(_memo._MEMORY.values()))
    prep = know.prepared
    keys, dots = {}, None
    for names, solution, choice in _named.named_choices(prep):
        (o,) = solution.options
        keys[names] = alone_key(o, choice.choices[prep.infos[prep.cands[o].scan].position])
        if names == ("dots",):
            dots = solution, choice
    assert keys[("dots",)] not in dict(prep.alone)  # not compiled to calibrate
    assert set(keys.values()) <= set(know.alone)
    alone, _ = _named.check_alone(prep, know, *dots)  # compiled beside the step: no compile
    assert alone + know.margin > p.budget_bytes  # over on its scans alone

    best = best_known(prep, know, p.budget_bytes)
    reference = step_flops(prep, best.choice)
    real_check = _named.check_alone
    for limit in (float("inf"), far):
        monkeypatch.setattr(_named, "FAR", limit)
        ahead = _named.ahead(prep, know, p.budget_bytes, reference, p.predicted_peak_bytes)
        checked, verified = [], []

        def check_alone(prep_, know_, solution, choice, checked=checked):
            checked.append(choice)
            return real_check(prep_, know_, solution, choice)

        monkeypatch.setattr(_named, "check_alone", check_alone)
        _named.try_named(prep, know, p.budget_bytes, best, lambda *a, v=verified: v.append(a))
        looked = [_memo.choice_key(c) for _, c in ahead]
        seen = [_memo.choice_key(c) for c in checked]
        assert verified == []  # the same steps compiled: none
        assert (_memo.choice_key(dots[1]) in looked) == (limit == float("inf"))
        assert (_memo.choice_key(dots[1]) in seen) == (limit == float("inf"))
    _memo.forget()


# Programs the planner was not tuned on: transformers of other widths and batches, an MLP
# stack and a recurrence.
UNSEEN = {
    "gpt-d64-b4": lambda: make_gpt(layers=4, d_model=64, seq=64, batch=4, heads=2),
    "gpt-d96-b8": lambda: make_gpt(layers=3, d_model=96, seq=64, batch=8, heads=3),
    "mlp": mlp_stack,
    "recurrence": gated_recurrence,
}


# The GPTs repeat, at other widths and batches, what tests/_plan/test_memory_model.py checks on
# the planner's own GPT (a prediction within 3% of the compiled peak): a slow sweep.
SLOW_UNSEEN = {"gpt-d64-b4", "gpt-d96-b8"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_UNSEEN else n for n in sorted(UNSEEN)],
)
def test_predictions_within_5_percent_on_unseen_programs(name):
    loss, args = UNSEEN[name]()
    planned = 0
    _memo.forget()
    for k, fraction in enumerate((0.6, 0.5, 0.35)):
        before = set(_known().measured) if _memo._MEMORY else set()  # other budgets
        try:
            p = remat.plan(loss, *args, budget=fraction, verbose=False)
        except remat.InfeasibleBudget:
            continue  # below what this program can reach (the MLP stack: about 45%)
        planned += 1
        # A program planned before compiles the step at most three times (two rounds and
        # `_calls.near_miss`), and after a step that fits only a cheaper one: gpt-d64-b4 at
        # 35% compiled a candidate predicted 0.3% under the budget 1,956 bytes over it (and
        # again with its jitted calls kept whole, `near_miss`), then one that fits; gpt-d96-b8
        # at 35% verified the save set its probe found (nothing fit the model), then a
        # cheaper one its search found. Both plans are cheaper than the memory model fitted
        # before `_options.fixed_solution`'s recompute closure found (gpt-d64-b4: 427,819,008
        # step FLOPs against 452,984,832 in one compile; gpt-d96-b8: infeasible).
        assert p.stats.step_compiles <= 3, (name, fraction)
        if k:
            fitting: list[float] = []
            for known in (v for key, v in _known().measured.items() if key not in before):
                if known.measured.peak_bytes <= p.budget_bytes:
                    assert all(known.measured.flops < f for f in fitting), (name, fraction)
                    fitting.append(known.measured.flops)
        measured = p.measured_peak_bytes
        assert measured <= p.budget_bytes
        assert abs(p.predicted_peak_bytes - measured) <= 0.05 * measured, (name, fraction)
        assert p.rounds <= 2
        assert "predicted peak" in p.explain() and "error" in p.explain()
    assert planned >= 2, name


def _known():
    """What the planner knows of the program planned last (`_memo.Knowledge`)."""
    return next(reversed(_memo._MEMORY.values()))


def named_body():
    """A scanned block with five named values."""

    def loss(ws, x):
        def block(h, w):
            a = checkpoint_name(h @ w[0], "a")
            b = checkpoint_name(jnp.sin(a), "b")
            c = checkpoint_name(b @ w[1], "c")
            d = checkpoint_name(jnp.tanh(c) * a, "d")
            return h + checkpoint_name(d @ w[2], "e"), None

        h, _ = jax.lax.scan(block, x, ws)
        return jnp.mean(h**2)

    k = jax.random.split(jax.random.key(9), 4)
    ws = (
        jax.random.normal(k[0], (6, 32, 64)) * 0.1,
        jax.random.normal(k[1], (6, 64, 64)) * 0.1,
        jax.random.normal(k[2], (6, 64, 32)) * 0.1,
    )
    return loss, (ws, jax.random.normal(k[3], (128, 32)))


@pytest.mark.slow  # a sweep: 32 save sets compiled, 4 plans
def test_plan_is_within_1_percent_of_every_save_set():
    """Every subset of the body's named values, compiled: at budgets at and between their
    peaks, the plan's FLOPs are within 1% of the cheapest subset that fits. (Compiled as the
    planner compiles, in half the time: the same peak and FLOPs, see
    `test_compiler_options_change_neither_memory_nor_flops`.)"""
    loss, args = named_body()
    names = ("a", "b", "c", "d", "e")
    points = []
    for k in range(len(names) + 1):
        for subset in itertools.combinations(names, k):
            policy = jax.checkpoint_policies.save_only_these_names(*subset)
            fn = remat.apply(loss, remat.Strategy(policy))
            lowered = jax.jit(jax.value_and_grad(fn)).lower(*args)
            compiled = lowered.compile(_compile.COMPILER_OPTIONS)
            points.append((peak_bytes(compiled), hlo_flops(compiled.as_text())))
    peaks = sorted({p for p, _ in points})
    budgets = [peaks[0], peaks[len(peaks) // 3], (peaks[1] + peaks[2]) // 2, peaks[-1]]
    for budget in budgets:
        p = remat.plan(loss, *args, budget=int(budget), schedules=False, verbose=False)
        cheapest = min(f for peak, f in points if peak <= budget)
        assert p.measured_peak_bytes <= budget
        assert p.measured.flops <= 1.01 * cheapest, (budget, p.measured.flops, cheapest)


@pytest.mark.slow  # the zero-slack cases below run by default; this one plans a GPT twice
def test_zero_slack_at_the_every_step_recomputed_peak_with_schedules():
    """The budget exactly at the compiled peak of a calibration point, every step recomputed
    (the per-step ``"full"`` point): with schedules on, the plan fits and costs no more
    FLOPs than that point (a `Binomial` schedule that also fits costs more), and reports no
    more rounds than allowed."""
    from remat._plan._compile import compile_measure
    from remat._plan._plan import knowledge
    from remat._trace._tag import rewrite

    _memo.forget()
    loss, args = make_gpt(layers=4, d_model=64, seq=64, batch=4, heads=2)
    # prepared as a first plan prepares it, and remembered: the plan below starts from it
    # (nothing compiled yet besides) instead of preparing the same program again
    prep = knowledge(loss, args, 0, True, None).prepared
    _, (nothing, _) = prep.calibration[:2]
    point = compile_measure(rewrite(loss, nothing.choices), args, 0, "full", None)
    budget = point.peak_bytes
    p = remat.plan(loss, *args, budget=budget, max_rounds=4, verbose=False)
    assert p.measured_peak_bytes <= budget
    assert p.measured.flops <= point.flops
    assert 1 <= p.rounds <= 4
    q = remat.plan(loss, *args, budget=int(budget * 1.3), max_rounds=1, verbose=False)
    assert q.rounds <= 1


def test_zero_slack_at_a_known_plan():
    """Planned again at exactly the peak of a plan it compiled, the planner returns that plan
    or a cheaper one, without compiling the step again."""
    _memo.forget()
    loss, args = mlp_stack()
    first = remat.plan(loss, *args, budget=0.6, verbose=False)
    again = remat.plan(loss, *args, budget=first.measured_peak_bytes, verbose=False)
    assert again.measured_peak_bytes <= first.measured_peak_bytes
    assert again.measured.flops <= first.measured.flops
    assert again.stats.step_compiles <= 1


@pytest.mark.slow  # two MaxText presets compiled, then a first plan of the decoder
def test_zero_slack_below_the_least_memory_the_model_knows():
    """MaxText's ``save_out_proj`` saves one value that cuts a decoder layer in two: its
    compiled peak is below that of recomputing everything, which is the least memory the
    linear model knows. At exactly that peak the planner still finds a plan (it tries
    saving the program's own named values one at a time), as cheap as the preset."""
    from remat._models._maxtext import PRESETS, QUICK, make_decoder
    from remat._plan._compile import compile_measure

    _memo.forget()
    # each preset's step measured as the planner measures its plans: one compile apiece
    preset = compile_measure(*make_decoder(PRESETS["save_out_proj"], QUICK), 0, "preset", None)
    full = compile_measure(*make_decoder(PRESETS["full"], QUICK), 0, "full", None)
    assert preset.peak_bytes < full.peak_bytes  # the premise: the cut saves memory
    loss, args = make_decoder(None, QUICK)
    p = remat.plan(loss, *args, budget=preset.peak_bytes, verbose=False)
    assert p.measured_peak_bytes <= preset.peak_bytes
    assert p.measured.flops <= preset.flops
    assert p.stats.step_compiles <= 3


def test_the_cyclic_collector_is_paused_during_a_plan_and_restored():
    import gc

    from remat._plan._plan import no_cyclic_gc

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            with no_cyclic_gc():
                assert not gc.isenabled()
            assert gc.isenabled() == enabled
        finally:
            gc.enable()
    loss, args = mlp_stack()
    remat.plan(loss, *args, budget=0.6, verbose=False)
    assert gc.isenabled()


def test_progress_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown = Terminal()
    progress = Progress(stream=shown, delay=0.0)
    progress("verifying round 1")
    progress.close()
    assert "verifying round 1" in shown.getvalue() and " s)" in shown.getvalue()
    for quiet in (Progress(verbose=False, stream=Terminal(), delay=0.0),
                  Progress(stream=io.StringIO(), delay=0.0)):  # fmt: skip
        quiet("tracing")
        quiet.close()
        assert quiet.stream.getvalue() == ""
