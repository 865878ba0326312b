"""`remat.Plan` (a plan and why it was chosen, as JSON too), `remat.InfeasibleBudget`, and the
fingerprint of the program a plan is for."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from .._core._budget import format_bytes
from .._core._io import atomic_write_text
from .._core._plain import checksum, to_plain
from .._core._schedule import encode_schedule
from .._measure._measurement import Measurement
from ._compile import peak_of
from ._options import ScanPlan

# The version of the JSON that `Plan.to_json` writes and `remat.load_plan` reads. Format 2 adds
# a checksum of the whole file (`_core._plain.checksum`); format 1 files have none.
PLAN_FORMAT = 2

_INFEASIBLE = (
    "`remat.plan` cannot fit budget {budget} ({budget_bytes} bytes): the smallest peak the "
    "planner reached is {smallest} ({smallest_bytes} bytes, {fraction:.0%} of the "
    "{baseline_name} {baseline}{strategy}). {advice}. What sets that floor is live at its "
    "peak (`remat.memory(fn, *args, strategy=...)` lists it): what lives outside the scans "
    "(parameters, optimizer state, the loss head's logits, and what a layer left out of them "
    "saves: a layer that differs from the others, such as a first layer with parameters of "
    "its own, or under `jax.vmap` the first layer after a matmul with an input the map "
    "leaves unbatched (that matmul puts the mapped axis elsewhere, so the layer's equations "
    "differ), does not roll into the scan of the rest; `remat.list_scans(fn, *args)` shows "
    "how many layers each rolled scan holds), or one layer's own working set "
    "in its backward pass (attention scores: a smaller batch or sequence, or chunked "
    "attention), which no checkpoint of the layers lowers."
)

_NESTED = (
    " The planner plans the outermost scans and leaves the scans inside them as written "
    "({nested}; the inner loop of Flax's `remat_scan` is one): what those save for the "
    'backward pass is no choice of the plan. `remat.measure(fn, *args, strategy="full", '
    "override=True)` measures every scan checkpointed."
)

_PREDICTED = (
    " No plan is predicted under {predicted} ({predicted_bytes} bytes: the least-memory plan "
    "and the named strategies, their scans compiled alone, with the least memory outside the "
    "scans any compiled plan showed less how far those differed), so nothing more was "
    "compiled; a budget between the two is planned by compiling candidates."
)

_SAVED_INFEASIBLE = (
    "`remat.plan` found no plan within budget {budget} ({budget_bytes} bytes) that saves at "
    "most saved={saved} ({saved_bytes} bytes for the backward pass): the least any plan it "
    "compiled within the budget saves is {smallest} ({smallest_bytes} bytes). Raise `saved=` "
    "to at least {smallest}, or raise the budget (a plan with a larger peak may save less)."
)

_BELOW_FLOOR = (
    "`remat.plan` cannot fit budget {budget} ({budget_bytes} bytes): the step's arguments and "
    "outputs alone take {floor} ({floor_bytes} bytes: parameters, optimizer state, inputs and "
    "outputs, less the donated buffers; {fraction:.0%} of the {baseline_name} {baseline}), and "
    "no checkpointing reduces them. Raise the budget above {floor}, or reduce what the step "
    "takes and returns (parameters, optimizer state, batch size)."
)


_NO_OPTIMIZER = (
    "`Plan.step` needs the optimizer the plan was made for; this plan was made without one. "
    "Plan with `remat.plan(loss, *args, budget=..., optimizer=tx)` (an optax "
    "GradientTransformation), or use `plan.fn` as the loss in your own step."
)


class NothingToPlan(ValueError):
    """`remat.plan` found no scan to plan: the program has none of its own and no repeated
    layers to roll into one (the message says why). A `ValueError`; the CLI exits 1 on it, as
    on `InfeasibleBudget`: the arguments were right, the program cannot be planned."""


class InfeasibleBudget(ValueError):
    """No plan fits the memory budget (raised by `remat.plan`; public as `remat.InfeasibleBudget`).

    Attributes:
      budget_bytes: the budget asked for, in bytes.
      smallest_peak_bytes: the smallest measured peak the planner reached.
      baseline_peak_bytes: the un-checkpointed peak (the peak as written, for a program
        that checkpoints already).
      strategy: what the smallest measured point does, in words (e.g. ```full` on every
        scan``), or None when no point was measured.
      floor_bytes: when the budget is below the step's arguments and outputs less the
        donated buffers (which no plan reduces), those bytes: the planner stops before it
        solves, and ``smallest_peak_bytes`` is that floor. None otherwise.
      smallest_saved_bytes: with `remat.plan`'s ``saved=`` cap, when plans fit the budget
        but none within the cap, the fewest bytes one of them saves (``smallest_peak_bytes``
        is then that plan's peak). None otherwise.
      predicted_peak_bytes: when the planner settled the budget without compiling more (the
        least memory it knows predicted over it, beyond how far its predictions of the memory
        outside the scans have differed on the plans it compiled), that least predicted peak;
        ``smallest_peak_bytes`` is then the smallest peak compiled before. None otherwise.
      nested: the scans inside the planned scans' bodies, which the planner leaves as written
        (`_nested.nested_scans`), in words; None when there are none.

    Example:
      >>> e = InfeasibleBudget("50%", 1 << 20, 3 << 19, 1 << 21, strategy="`full` on every scan")
      >>> e.smallest_peak_bytes, str(e).split(". ")[1]
      (1572864, 'Raise the budget to at least 1.50 MiB')
      >>> "`remat.memory(fn, *args, strategy=...)` lists it" in str(e)
      True
      >>> "a layer left out of them" in str(e)
      True
    """

    __module__ = "remat"  # printed in tracebacks as remat.InfeasibleBudget, its public name

    def __init__(
        self,
        budget: Any,
        budget_bytes: int,
        smallest: int,
        baseline: int,
        written: bool = False,
        strategy: str | None = None,
        floor: int | None = None,
        saved: tuple[Any, int, int] | None = None,
        predicted: int | None = None,
        nested: str | None = None,
    ):
        if saved is not None:  # (as given, the cap in bytes, the fewest bytes a plan saved)
            text = _SAVED_INFEASIBLE.format(
                budget=budget, budget_bytes=budget_bytes, saved=saved[0], saved_bytes=saved[1],
                smallest=format_bytes(saved[2]), smallest_bytes=saved[2],
            )  # fmt: skip
        elif floor is not None:
            text = _BELOW_FLOOR.format(
                budget=budget, budget_bytes=budget_bytes, floor=format_bytes(floor),
                floor_bytes=floor, fraction=floor / baseline if baseline else 0.0,
                baseline_name="peak as written" if written else "un-checkpointed peak",
                baseline=format_bytes(baseline),
            )  # fmt: skip
        else:
            text = _INFEASIBLE.format(
                baseline_name="peak as written" if written else "un-checkpointed peak",
                budget=budget,
                budget_bytes=budget_bytes,
                smallest=format_bytes(smallest),
                smallest_bytes=smallest,
                fraction=smallest / baseline if baseline else 0.0,
                baseline=format_bytes(baseline),
                strategy="" if strategy is None else f", measured with {strategy}",
                advice=_advice(smallest, predicted, baseline),
            )
            if predicted is not None:
                text += _PREDICTED.format(predicted=format_bytes(predicted),
                                          predicted_bytes=predicted)  # fmt: skip
            if nested is not None:
                text += _NESTED.format(nested=nested)
        super().__init__(text)
        self.floor_bytes = floor
        self.smallest_saved_bytes = None if saved is None else saved[2]
        self.strategy = strategy
        self.budget_bytes = budget_bytes
        self.smallest_peak_bytes = smallest
        self.predicted_peak_bytes = predicted
        self.baseline_peak_bytes = baseline


def _advice(smallest: int, predicted: int | None, baseline: int | None = None) -> str:
    """What budget to ask for: the least peak compiled, and, when the planner settled the
    budget from predictions below that, the least predicted too (its least-memory plan was
    not compiled, so the peak it reaches may be below the least compiled one). Where no
    plan compiled or predicted peaks below ``baseline`` (the program's own peak), a larger
    budget under 100% cannot help: checkpointing does not lower this program's peak.

    Example:
      >>> _advice(4_680_000, 4_580_000)
      'Raise the budget to 4.46 MiB (a compiled plan fits it) or try down to 4.37 MiB (the least peak predicted, not compiled)'
      >>> _advice(1_452_044, None, 1_408_000)
      'Checkpointing the scans does not lower this peak (no plan compiled peaks below it): keep the program as written (budget 100%)'
    """
    if baseline and smallest >= baseline and (predicted is None or predicted >= baseline):
        return (
            "Checkpointing the scans does not lower this peak (no plan compiled peaks below "
            "it): keep the program as written (budget 100%)"
        )
    if predicted is not None and predicted < smallest:
        return (
            f"Raise the budget to {format_bytes(smallest)} (a compiled plan fits it) or try "
            f"down to {format_bytes(predicted)} (the least peak predicted, not compiled)"
        )
    return f"Raise the budget to at least {format_bytes(smallest)}"


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """What making a plan cost.

    Attributes:
      step_compiles: compiles of the whole step (the un-checkpointed baseline, unless the
        program was planned before in this process, and each verified round); a load from
        JAX's persistent compilation cache counts as one.
      scan_compiles: compiles of one scan on its own (calibration and candidate checks).
      compile_seconds: seconds spent compiling, both kinds, summed over compiles; compiles
        run side by side in threads, so this may exceed ``seconds``.
      seconds: the plan's wall time, from the call to the result.
    """

    step_compiles: int
    scan_compiles: int
    compile_seconds: float
    seconds: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checkpointing plan: the rewritten function and why it was chosen.

    Attributes:
      fn: ``fn`` rewritten by the plan: same signature, same values and gradients.
      scans: one `ScanPlan` per planned scan.
      budget_bytes: the budget the plan was made for.
      predicted_peak_bytes: the peak memory the calibrated model predicted for the plan
        before compiling it (corrected by the measured rounds before it, if any).
      measured: the plan's `remat.Measurement` (``None`` for a plan loaded without one).
      baseline_peak_bytes: the un-checkpointed gradient step's peak.
      baseline_flops: the un-checkpointed gradient step's matmul FLOPs.
      solve_seconds: seconds spent modelling and solving, without the compiles.
      rounds: solve-and-measure rounds this call ran (each solves, then compiles the step
        or reads a step compiled before for the same program); at most ``max_rounds``.
      fingerprint: hash of the traced program the plan is for (see `load_plan`).
      argnums: the differentiated arguments (with an optimizer: the parameters).
      has_aux: ``fn`` returns ``(loss, aux)``.
      optimizer: the optax ``GradientTransformation`` the budget's step applies (None: the
        gradient step); not written to JSON (pass ``optimizer=`` to `remat.load_plan`).
      rolled: the plan is for ``fn`` with its repeated layers rolled into scans
        (``roll=True``), numbered after the program's own scans; `load_plan` and
        `remat.apply` roll them again. False for a program planned as written (its own
        scans, or nothing to checkpoint).
      stats: compiles and seconds it took (`PlanStats`; ``None`` for a loaded plan); not
        written to JSON.
      scan_fingerprint: hash of the planned scans' bodies (equations, shapes, dtypes), which
        does not change when the loss is written as a closure over its batch: what
        ``remat.apply(loss_fn, plan)`` checks (see `scan_fingerprints`).
      scan_structure: the same hash with every number left out (shapes, sizes in
        parameters): equal for the same model at another batch size.
      written: the program's own checkpoints (`jax.checkpoint`, ``nn.remat``) that the plan
        replaces, with their policies and source lines; the baseline is the program as
        written, with them.
      jax_version: the JAX that traced the program planned (its fingerprints are of that
        JAX's program: another JAX version traces the same function differently).
    """

    fn: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    scans: tuple[ScanPlan, ...]
    budget_bytes: int
    predicted_peak_bytes: int
    measured: Measurement | None
    baseline_peak_bytes: int
    baseline_flops: float
    solve_seconds: float
    rounds: int
    fingerprint: str
    argnums: int | tuple[int, ...] = 0
    has_aux: bool = False
    optimizer: Any = dataclasses.field(default=None, repr=False, compare=False)
    rolled: bool = False
    stats: PlanStats | None = dataclasses.field(default=None, compare=False, repr=False)
    scan_fingerprint: str = ""
    scan_structure: str = ""
    written: tuple[str, ...] = ()
    jax_version: str = dataclasses.field(default_factory=lambda: jax.__version__, compare=False)

    # Marks a plan for the stages below `_plan` (which cannot import this class), e.g. the
    # strategy check that refuses a plan passed where one policy is expected.
    __remat_plan__ = True

    @functools.cached_property
    def step(self) -> Callable[..., Any]:
        """The jitted training step the plan was made for: ``step(params, opt_state, *rest)
        -> (params, opt_state, loss)`` (``loss`` is ``(loss, aux)`` with ``has_aux``), with
        ``fn`` checkpointed as planned and ``params``/``opt_state`` donated. ``rest`` are
        ``fn``'s other arguments, in order. Equal to optax's own step on the plain loss.
        An Equinox model is passed whole, with ``opt_state`` made as Equinox makes it:
        ``tx.init(eqx.filter(model, eqx.is_inexact_array))`` (``eqx.is_array`` gives the same
        state where every array is floating point).

        Raises:
          ValueError: for a plan made without ``optimizer=``, and, when the step fails, for
            an ``opt_state`` that another optimizer made.
        """
        if self.optimizer is None:
            raise ValueError(_NO_OPTIMIZER)
        from .._measure._step import checked_step, jitted_train_step

        step = jitted_train_step(self.fn, self.optimizer, self.argnums, self.has_aux)
        return checked_step(step, self.optimizer, "Plan.step")

    @functools.cached_property
    def policy(self) -> Any:
        """A `jax.checkpoint` policy that saves what this plan saves, for your own scan.

        ``jax.checkpoint(body, policy=plan.policy, prevent_cse=False)`` inside your
        `jax.lax.scan` (or ``nn.remat(Block, policy=plan.policy)`` in ``nn.scan``, or
        ``nnx.remat``) reproduces the plan's per-step choice. Values the program names with
        `checkpoint_name` are matched by name, others by primitive and operand types
        (exact when one equation of the body has them; see `remat._plan._policy`).
        `explain` prints the code, and the ``checkpoint_name`` calls that make it exact.
        Scans planned with a `remat.Nested` or `remat.Binomial` schedule are not covered.

        Raises:
          ValueError: for a per-layer plan (different save sets in different layers of one
            scan), which no one policy expresses: the message gives the per-layer pattern
            and the alternatives, `remat.apply` and `position_policy`.
        """
        from ._policy import plan_policy

        return plan_policy(self.scans)

    def position_policy(self, k: int) -> Any:
        """The policy of layer ``k`` in a per-layer plan whose pattern is as long as the scan
        (and of the ``k``-th layer of each group, layers ``i`` with ``i % g == k``, in one of
        period ``g``), to checkpoint each layer on its own; in a uniform plan, the same as
        `policy`.

        Raises:
          ValueError: if ``k`` is not an int of at least 0.
        """
        from ._policy import plan_policy

        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(
                f"`Plan.position_policy` got k={k!r}; expected a layer's position in its group, "
                "an int >= 0 (layer i of the scan is at position i % g)."
            )
        return plan_policy(self.scans, k)

    @property
    def measured_peak_bytes(self) -> int | None:
        """The measured peak (``None`` without a measurement)."""
        return None if self.measured is None else peak_of(self.measured)

    @property
    def flops_ratio(self) -> float | None:
        """Measured matmul FLOPs relative to the un-checkpointed step."""
        if self.measured is None or not self.baseline_flops:
            return None
        return self.measured.flops / self.baseline_flops

    def table(self):
        """The explanation as a `rich` renderable (see `explain`)."""
        from ._explain import plan_table

        return plan_table(self)

    def explain(self, width: int = 110, memory: Any = None) -> str:
        """A readable account of the plan: per scan, the schedule and each saved value.

        Per scan: its source, length, schedule and recomputed FLOPs, and a table of the values
        saved at each step (checkpoint name, primitive, shape, bytes × copies, source line);
        then the budget, the predicted and the measured peak, the step's FLOPs relative to no
        checkpointing and the solve time. `remat.plan`'s example shows it.

        Args:
          width: characters per line.
          memory: the plan's `remat.MemoryView` (``remat.memory(fn, *args, plan=plan)``,
            one more compile of the step, made only when asked for): adds where the peak is
            and what fills it.
        """
        from rich.console import Console

        console = Console(width=width, record=True, file=io.StringIO())
        console.print(self.table())
        if memory is not None:
            console.print(memory.summary(), highlight=False)
        return console.export_text()

    def __str__(self) -> str:
        return self.explain()

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (without ``fn``), with a ``"checksum"`` of the rest:
        the sha256 of its canonical JSON, and a digest per field so that `remat.load_plan`
        can name the field that was edited."""
        data = {
            "format": PLAN_FORMAT,
            **{
                f.name: to_plain(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name not in ("fn", "scans", "measured", "optimizer", "stats")
            },
            "scans": [
                {
                    **{
                        k: v
                        for k, v in to_plain(dataclasses.replace(s, schedule="per_step")).items()
                        # a per-layer plan's pattern, calls kept: written where they are
                        if k not in ("pattern", "kept_calls") or v
                    },
                    "schedule": encode_schedule(s.schedule),
                }
                for s in self.scans
            ],
            "measured": None if self.measured is None else to_plain(self.measured),
        }
        data["checksum"] = checksum(data)  # `load_plan` refuses a file edited after this
        return data

    def to_json(self, path: str | os.PathLike) -> Path:
        """Writes the plan to ``path`` as JSON, atomically; reload it with `remat.load_plan`.

        The file (format 2) carries a checksum of its contents: `remat.load_plan` refuses it
        once edited.
        """
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True))


def fingerprint(fn: Callable[..., Any], *args: Any) -> str:
    """A hash of the program ``fn`` traces to at ``args`` (equations, shapes, dtypes).

    Source locations are not part of it, so moving code around keeps a plan valid.

    Example:
      >>> import jax.numpy as jnp
      >>> from remat._plan._result import fingerprint
      >>> fingerprint(jnp.sin, jnp.ones(3)) == fingerprint(jnp.sin, jnp.ones(3))
      True
      >>> fingerprint(jnp.sin, jnp.ones(3)) == fingerprint(jnp.cos, jnp.ones(3))
      False
    """
    text = str(jax.make_jaxpr(fn)(*args))
    text = re.sub(r"0x[0-9a-f]+", "0x", text)  # object addresses in reprs
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _hash(text: str) -> str:
    return hashlib.sha256(re.sub(r"0x[0-9a-f]+", "0x", text).encode()).hexdigest()[:16]


def scan_fingerprints(infos: Any) -> tuple[str, str]:
    """Hashes of the planned scans (`remat._trace._tag.planned_scans`): with shapes, and
    without them.

    A scan's body takes what it closes over as inputs, so the hashes are the same whether
    the loss gets its batch and dropout key as arguments or closes over them (a ``loss_fn``
    made inside a ``train_step``); only the planned scans matter to a plan.
    """
    from .._trace._tag import flatten

    parts = [
        (f"{i.position} {i.reverse} {i.num_consts} {i.num_carry}", str(flatten(i.jaxpr)), i.length)
        for i in infos
    ]
    exact = _hash("\n".join(f"{head} {n}\n{body}" for head, body, n in parts))
    numbers = re.compile(r"[0-9]+")  # shapes, and sizes in parameters (``shape=(128, 256)``)
    shapeless = _hash("\n".join(head + "\n" + numbers.sub("#", body) for head, body, _ in parts))
    return exact, shapeless
