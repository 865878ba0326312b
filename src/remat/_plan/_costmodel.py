"""The planner's cost model: each scan body as a graph of values with bytes and FLOPs.

For every scan of a traced program (see `_tag.py` for how values are numbered and named) the
model records, per value of the body: its bytes, the FLOPs to compute it (``dot_general`` and
convolutions exactly, nested loops times their trip count, other primitives none: see
`ELEMENTWISE_FLOPS`), whether XLA fuses its recomputation into its consumers (no matmul in it
and no matmul reads it), the values it is computed from, whether it is loop-invariant (depends only on the
scan's constants: JAX hoists such residuals out of the loop, so they are stored once), and
whether the backward pass of the step needs it. The last is read from JAX itself: the body,
with every value tagged, is checkpointed with a policy that may save any tagged value, and
`saved_residuals` lists what the VJP keeps.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
from jax._src.ad_checkpoint import saved_residuals
from jax.extend import core as jcore

from .._core._dtypes import itemsize
from .._shard._shard_counts import shard_counts
from .._trace._jaxpr_walk import site
from .._trace._rewrite import ScanInfo, _source
from .._trace._tag import _spec, eval_tagged, flatten, is_tagged, user_name, value_name
from ._milp import Node

# The FLOPs the model charges per element of a value that is not a matmul or convolution.
# Zero, so that the model counts what is measured (matmul FLOPs in the optimised HLO) and,
# among plans that recompute equally many matmul FLOPs, the integer program's tie-break takes
# the least memory: elementwise values (normalisation statistics, activations, softmax) are
# recomputed rather than saved. Saving them looks nearly free in bytes but is not: on the demo
# GPT, saving the 16 LayerNorm/softmax statistics (0.5 MiB in all) beside the matmul outputs
# raised the compiled peak by 5.6 MiB, because XLA then materialises the recomputed
# normalisations that it otherwise fuses into their consumers.
ELEMENTWISE_FLOPS = 0.0

_MATMULS = ("dot_general", "conv_general_dilated")
_NAMED = re.compile(r"named '(remat_[^']+)'")
_ARGUMENT = re.compile(r"from the argument .*?\[(\d+)\]")


def aval_bytes(aval: Any) -> int:
    """Bytes of one value of type ``aval``."""
    return int(math.prod(aval.shape)) * itemsize(aval.dtype)


def eqn_flops(eqn: Any, elementwise: float = 1.0) -> float:
    """FLOPs of one equation: exact for matmuls and convolutions, ``elementwise`` per output
    element otherwise (the planner's model uses 0: see `ELEMENTWISE_FLOPS`)."""
    name = eqn.primitive.name
    out_elems = sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out_elems * math.prod(lhs[d] for d in lhs_contract)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        out_features = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
        return 2.0 * out_elems * math.prod(rhs) / max(out_features, 1)
    subs = list(jcore.jaxprs_in_params(eqn.params))
    if subs:
        inner = [jaxpr_flops(s, elementwise) for s in subs]
        if name == "cond":
            return max(inner)
        if name == "scan":
            return eqn.params["length"] * inner[0]
        if name in ("custom_jvp_call", "custom_vjp_call"):
            return inner[0]
        return float(sum(inner))
    return elementwise * float(out_elems)


def jaxpr_flops(jaxpr: Any, elementwise: float = 1.0) -> float:
    """Forward FLOPs of a jaxpr (loops times their trip count; while loops counted once)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return float(sum(eqn_flops(e, elementwise) for e in jaxpr.eqns))


def source_of(eqn: Any) -> str | None:
    """``"file.py:123"`` of the code that produced ``eqn`` (outside flax/equinox if possible)."""
    return _source(eqn) or None


@dataclasses.dataclass(frozen=True)
class Value:
    """One value of a scan body (or one of the body's carried inputs)."""

    name: str  # checkpoint name, or "carry[i]"
    primitive: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    flops: float
    inputs: tuple[int, ...]  # indices into ScanModel.values
    needed: bool
    saveable: bool
    recomputable: bool
    invariant: bool
    source: str | None
    # Recomputing it costs no memory of its own unless an input does: no matmul in it, and no
    # matmul reads it (XLA fuses elementwise work into consumers, but a matmul's operands,
    # here and in the backward pass, are buffers of their own).
    fusible: bool = False
    # The program's own `checkpoint_name` for it (on it, or on the value it is named as).
    user_name: str | None = None
    # Its equation's operand types (``"float32[8, 128]"``): what `remat.Plan.policy` matches
    # on where the value has no name of the program's own.
    operands: tuple[str, ...] = ()
    # Where its equation was made (`remat._trace._jaxpr_walk.site`): values of one source
    # line made by one operation in a Python loop share it; different operations do not.
    site: tuple[str, ...] = ()


def operand_text(aval: Any) -> str:
    """An operand's type as a plan's policy matches it: ``"float32[8, 128]"``."""
    shape = getattr(aval, "shape", None)
    return str(aval) if shape is None else f"{aval.dtype}{list(shape)}"


@dataclasses.dataclass(frozen=True)
class ScanModel:
    """The cost model of one scan: its body's values and the scan's shape."""

    index: int
    length: int
    values: tuple[Value, ...]
    carry_bytes: int  # bytes of one step's carry
    forced_bytes: int  # per step: residuals no name choice removes (e.g. integer values)
    step_flops: float  # forward FLOPs of one step
    source: str | None

    def nodes(self, group: int = 0, steps: int | None = None) -> list[Node]:
        """The MILP graph of this scan; ``steps`` copies are stored per saved value."""
        steps = self.length if steps is None else steps
        return [
            Node(
                bytes=v.bytes,
                flops=v.flops,
                inputs=v.inputs,
                multiplicity=1 if v.invariant else steps,
                repeats=self.length,
                needed=v.needed,
                saveable=v.saveable,
                recomputable=v.recomputable,
                group=group,
                fusible=v.fusible,
            )
            for v in self.values
        ]


def model_scan(
    info: ScanInfo, input_splits: Sequence[tuple[int, ...]] | None = None, num_devices: int = 1
) -> ScanModel:
    """Builds the cost model of one scan (a `remat.list_scans` entry).

    For a program sharded over several devices, ``input_splits`` gives, per body input, how
    many pieces each dimension is cut into (see `remat._shard._shard_counts.scan_input_splits`);
    every value's bytes are then its bytes on one device, as XLA's memory analysis counts.
    """
    index, nc, nk = info.position, info.num_consts, info.num_carry
    flat = flatten(info.jaxpr)
    jaxpr = flat.jaxpr
    counts = shard_counts(flat, list(input_splits), num_devices) if input_splits else {}

    def aval_bytes_of(var: Any) -> int:  # per device
        return aval_bytes(var.aval) // counts.get(var, 1)

    values: list[Value] = []
    where: dict[Any, int] = {}  # var -> index in values
    invariant_vars = set(jaxpr.invars[:nc]) | set(jaxpr.constvars)
    carry_bytes = 0
    for i, var in enumerate(jaxpr.invars[nc : nc + nk]):
        carry_bytes += aval_bytes_of(var)
        where[var] = len(values)
        values.append(
            Value(
                name=f"carry[{i}]",
                primitive="carry",
                shape=tuple(var.aval.shape),
                dtype=str(var.aval.dtype),
                bytes=aval_bytes_of(var),
                flops=0.0,
                inputs=(),
                needed=False,
                saveable=True,
                recomputable=False,
                invariant=False,
                source=None,
            )
        )
    names: dict[str, int] = {}
    matmul_operands = {
        v for e in jaxpr.eqns if e.primitive.name in _MATMULS for v in e.invars
    }  # fmt: skip
    for j, e in enumerate(jaxpr.eqns):
        given = user_name(e)
        if given is not None:  # the value it names is known by this name too
            for v in e.invars:
                if (
                    not isinstance(v, jcore.Literal)
                    and v in where
                    and values[where[v]].user_name is None
                ):
                    values[where[v]] = dataclasses.replace(values[where[v]], user_name=given)
        inputs = tuple(
            sorted({where[v] for v in e.invars if not isinstance(v, jcore.Literal) and v in where})
        )
        invariant = all(isinstance(v, jcore.Literal) or v in invariant_vars for v in e.invars)
        flops = eqn_flops(e, ELEMENTWISE_FLOPS)
        for k, var in enumerate(e.outvars):
            if invariant:
                invariant_vars.add(var)
            name = value_name(index, j, k, len(e.outvars))
            where[var] = len(values)
            if is_tagged(var.aval):
                names[name] = len(values)
            values.append(
                Value(
                    name=name,
                    primitive=e.primitive.name,
                    shape=tuple(var.aval.shape),
                    dtype=str(var.aval.dtype),
                    bytes=aval_bytes_of(var),
                    flops=flops,
                    inputs=inputs,
                    needed=False,
                    saveable=is_tagged(var.aval),
                    recomputable=True,
                    invariant=invariant,
                    source=source_of(e),
                    fusible=flops == 0 and var not in matmul_operands,
                    user_name=given,
                    operands=tuple(operand_text(v.aval) for v in e.invars),
                    site=site(e),
                )
            )
    needed, forced = _needed(flat, index, names, nc, nk)
    values = [dataclasses.replace(v, needed=i in needed) for i, v in enumerate(values)]
    return ScanModel(
        index=index,
        length=info.length,
        values=tuple(values),
        carry_bytes=carry_bytes,
        forced_bytes=forced,
        step_flops=jaxpr_flops(jaxpr, ELEMENTWISE_FLOPS),
        source=info.source or None,
    )


def _needed(flat: Any, index: int, names: dict[str, int], nc: int, nk: int) -> tuple[set[int], int]:
    """Which values the backward pass of one step needs, and the bytes of unnamed residuals."""
    policy = jax.checkpoint_policies.save_only_these_names(*names)
    body = jax.checkpoint(lambda *a: eval_tagged(flat, index, a), policy=policy)
    specs = [_spec(v.aval) for v in flat.jaxpr.invars]
    needed: set[int] = set()
    forced = 0
    for aval, description in saved_residuals(body, *specs):
        named = _NAMED.search(description)
        argument = _ARGUMENT.search(description)
        if named and named.group(1) in names:
            needed.add(names[named.group(1)])
        elif argument:
            position = int(argument.group(1))
            if nc <= position < nc + nk:
                needed.add(position - nc)  # carries are the first values
        else:
            forced += aval_bytes(aval)
    return needed, forced


def model_scans(
    scans: Sequence[ScanInfo],
    splits: dict[int, list[tuple[int, ...]]] | None = None,
    num_devices: int = 1,
) -> tuple[ScanModel, ...]:
    """Cost models of the given scans, in order (per device, with ``splits`` of a sharded
    program; see `model_scan`)."""
    splits = splits or {}
    return tuple(model_scan(info, splits.get(info.position), num_devices) for info in scans)
