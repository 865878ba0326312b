"""XLA's TPU compiler, run deviceless from this host: what its memory analysis means, and
remat's measure and plan compiled for a TPU slice (`remat.Target`).

Skipped where libtpu is not installed (``pip install 'remat[tpu]'``; ``./dev test`` keeps it in
a second environment, see docs/tpu.md). The figures are libtpu 0.0.42's (jax[tpu] 0.10.2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("libtpu", reason="libtpu is not installed: pip install 'remat[tpu]'")

import remat
from remat._measure._hbm import compile_measured
from remat._measure._peak import BUFFER_ASSIGNMENT, compiled_memory
from remat._plan import _memo

MIB = 2**20
V5E_USABLE = 16128 * MIB  # what a v5e program may use of its 16 GiB (its OOM error: 15.75G)
HBM_ONE_CHIP, SUM_PADDED, HBM_PADDED = 16100 * MIB + 1536, 16923452928, 16889649664


def _mlp_loss(checkpoint: bool):
    def body(h, w):
        w1, w2 = w
        return h + jnp.tanh(h @ w1) @ w2, None

    def loss(p, x):
        h, _ = jax.lax.scan(jax.checkpoint(body) if checkpoint else body, x, p)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return loss


def _mlp_shapes(layers=8, tokens=4096, d=1024, f=4096):
    w1 = jax.ShapeDtypeStruct((layers, d, f), jnp.bfloat16)
    w2 = jax.ShapeDtypeStruct((layers, f, d), jnp.bfloat16)
    return (w1, w2), jax.ShapeDtypeStruct((tokens, d), jnp.bfloat16)


def _sharded(leaf, mesh, spec):
    sharding = jax.sharding.NamedSharding(mesh, spec)
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def _on(target, params, x):
    """The parameters replicated and the tokens split over the slice's chips."""
    mesh = remat.parse_target(target).mesh()
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    params = tuple(jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=rep) for p in params)
    return params, jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=split)


def test_full_remat_anomaly_is_vmem_not_hbm():
    """The scanned bf16 MLP on a v5e 2x2: ``jax.checkpoint`` on the body lowers the HBM the
    step allocates (temp 80.46 MiB -> 0), yet the compiler's ``peak_memory_in_bytes`` rises
    (396 -> 404 MiB): that figure counts the on-chip VMEM the checkpointed loop fills, not HBM.
    remat's TPU peak is the HBM of the compiler's buffer assignment: 338.23 and 258.10 MiB,
    the latter 0.10 MiB of constants over temp + arguments + outputs."""
    params, x = _on("tpu:v5e:2x2", *_mlp_shapes())
    out = {}
    for name, checkpoint in (("written", False), ("full", True)):
        step = jax.jit(jax.value_and_grad(_mlp_loss(checkpoint)))
        compiled = compile_measured(step.lower(params, x))
        out[name] = (compiled_memory(compiled), compiled.memory_analysis())
    (written, ws), (full, fs) = out["written"], out["full"]
    scalars = 1024  # the loss and its padding: TPU buffers are 512-byte aligned
    assert (written.argument_bytes, written.output_bytes) == (130 * MIB, 128 * MIB + scalars)
    assert (written.temp_bytes, full.temp_bytes) == (84370432, 0)
    assert written.peak_source == full.peak_source == BUFFER_ASSIGNMENT
    assert (written.peak_bytes, full.peak_bytes) == (354654720, 270637568)
    assert written.peak_bytes < written.temp_bytes + 258 * MIB + scalars  # the sum overstates
    assert (ws.peak_memory_in_bytes, fs.peak_memory_in_bytes) == (415242240, 423630848)
    assert fs.peak_memory_in_bytes > ws.peak_memory_in_bytes  # the anomaly, as XLA reports it


def test_hbm_capacity_is_checked_on_hbm_not_on_peak_memory_or_the_sum():
    """The compiler refuses a program whose HBM (its buffer assignment's memory space 0)
    exceeds the chip, and only then. A program of 16100 MiB in HBM whose
    ``peak_memory_in_bytes`` (16196 MiB, with 96 MiB of VMEM) is over the 16128 MiB a v5e
    program may use compiles; 30 MiB more HBM is refused. An FSDP step (the scanned MLP's
    weights sharded over a v5e 2x2, padded with a donated argument) whose
    ``temp + argument + output - alias`` is 16139.46 MiB, over the limit, compiles: its
    temporaries count 32 MiB that its buffer assignment does not place in HBM; 35 MiB more
    argument is refused. remat's peak is the buffer assignment's HBM."""
    device = remat.parse_target("tpu:v5e:1x1").devices()[0]
    one = jax.sharding.SingleDeviceSharding(device)
    a = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=one)  # 64 MiB
    step = jax.jit(lambda x, a: (jnp.sin(x), ((a @ a) @ a).sum()), donate_argnums=0)

    def big(mib):
        return jax.ShapeDtypeStruct(((mib - 64) * MIB // 4,), jnp.float32, sharding=one)

    compiled = compile_measured(step.lower(big(16100), a))
    memory = compiled_memory(compiled)
    assert memory.peak_source == BUFFER_ASSIGNMENT
    assert memory.peak_bytes == HBM_ONE_CHIP
    backend_peak = compiled.memory_analysis().peak_memory_in_bytes
    assert backend_peak // MIB == 16196 and backend_peak > V5E_USABLE
    with pytest.raises(Exception, match="Ran out of memory"):
        step.lower(big(16130), a).compile()

    mesh = remat.parse_target("tpu:v5e:2x2").mesh()
    (w1, w2), x = _mlp_shapes(layers=8, tokens=4 * 4096)
    spec = jax.sharding.PartitionSpec
    w1 = _sharded(w1, mesh, spec(None, "fsdp"))
    w2, x = _sharded(w2, mesh, spec(None, None, "fsdp")), _sharded(x, mesh, spec("fsdp"))
    padded = jax.jit(
        lambda p, x, pad: (jax.value_and_grad(_mlp_loss(False))(p, x), jnp.sin(pad)),
        donate_argnums=2,
    )

    def pad(mib):
        return _sharded(jax.ShapeDtypeStruct((mib * MIB,), jnp.float32), mesh, spec("fsdp"))

    compiled = compile_measured(padded.lower((w1, w2), x, pad(15395)))
    memory = compiled_memory(compiled)
    parts = memory.temp_bytes + memory.argument_bytes + memory.output_bytes - memory.alias_bytes
    assert parts == SUM_PADDED > V5E_USABLE  # accepted all the same
    assert memory.peak_bytes == HBM_PADDED <= V5E_USABLE
    with pytest.raises(Exception, match="Ran out of memory"):
        padded.lower((w1, w2), x, pad(15430)).compile()


def test_measure_compiles_for_the_target():
    params, x = _mlp_shapes(layers=4, tokens=2048, d=512, f=2048)
    m = remat.measure(_mlp_loss(False), params, x, target="tpu:v5e:2x2")
    # one set of devices per slice, whoever asks: a model's own `Target.mesh` shardings and
    # the placement `remat.plan` makes are one program's
    t = remat.parse_target("tpu:v5e:2x2")
    assert t.devices("remat.Target")[0] is t.devices("remat.plan")[0]
    assert (m.backend, m.num_devices, m.seconds, m.peak_source) == (
        "tpu",
        4,
        None,
        BUFFER_ASSIGNMENT,
    )
    assert m.peak_bytes <= m.temp_bytes + m.argument_bytes + m.output_bytes - m.alias_bytes
    # FSDP placement: each chip holds a quarter of every weight (their largest dimension)
    assert m.argument_bytes == 2 * 4 * 512 * 2048 * 2 // 4 + 2048 * 512 * 2 // 4


@pytest.mark.slow  # about 10 compiles, 7.5 min on this loaded host: `./dev test-tpu -m slow`
def test_plan_for_v5e_fits_the_tpu_compilers_peak():
    """A plan made for one v5e chip, from shapes: its step compiled by the TPU compiler
    fits the budget, and the scan-alone calibration compiled for the TPU too."""
    params, x = _mlp_shapes(layers=8, tokens=4096, d=1024, f=4096)
    loss = _mlp_loss(False)
    written = remat.measure(loss, params, x, target="tpu:v5e-1")
    budget = written.peak_bytes // 2
    plan = remat.plan(loss, params, x, budget=budget, target="tpu:v5e-1", verbose=False)
    assert plan.measured.backend == "tpu"
    assert plan.measured_peak_bytes <= budget < written.peak_bytes
    # the plan applied and compiled again for the chip: the same peak, under the budget
    placed = remat.parse_target("tpu:v5e-1").place((params, x))
    again = remat.measure(remat.apply(loss, plan), *placed, repeats=0)
    assert again.backend == "tpu"
    assert again.peak_bytes == plan.measured_peak_bytes
    assert np.isclose(again.flops, plan.measured.flops)


@pytest.mark.slow  # 3-4 TPU compiles of a 512K-token step, minutes on this loaded host
def test_plan_where_the_written_step_is_refused():
    """The scanned MLP on a v5e 2x2 with 512K tokens: the compiler refuses the step as written
    (19.81G asked of 15.75G; its gradients sharded as the weights are). The planner starts from the step that recomputes everything,
    plans a budget of 16 GiB at the 15.75 GiB the compiler gives a program, and its plan
    compiles under it; a relative budget is of the 19.81G the refusal states."""
    params, x = _mlp_shapes(layers=8, tokens=4 * 131072)
    loss = _mlp_loss(False)
    _memo.forget()
    with pytest.warns(remat.RematWarning, match="the compiler gives a program"):
        plan = remat.plan(loss, params, x, budget="16GiB", target="tpu:v5e:2x2", verbose=False)
    assert plan.baseline_peak_bytes == round(19.81 * 2**30)
    assert plan.budget_bytes == V5E_USABLE
    assert plan.measured.backend == "tpu"
    assert plan.measured_peak_bytes <= V5E_USABLE
    # it recomputes no matmul: the dot saved, its tanh recomputed (8 GiB of dots per chip)
    assert plan.measured.flops == pytest.approx(plan.baseline_flops, rel=1e-9)
    half = remat.plan(loss, params, x, budget="50%", target="tpu:v5e:2x2", verbose=False)
    assert half.budget_bytes == round(19.81 * 2**30) // 2
    assert half.measured_peak_bytes <= half.budget_bytes
    _memo.forget()


def test_offload_priced_for_the_chip_and_kept_in_host_memory():
    """An ``"offload:act"`` strategy measured for a v5e chip from this CPU host (whose own
    device has no host memory to offload to: the strategy is checked against the target's
    chip). The compiled step keeps the offloaded values in host memory (``host_bytes``: the 4
    layers' tanh outputs, 32 MiB; in HBM that saves nothing here, and `remat.measure`'s
    warning gives TPU's reason). The planner prices an offloaded value at the chip's rates
    (2 x bytes / 1.5e10 s at 197 TFLOP/s). A compile target's report names the slice."""
    from jax.ad_checkpoint import checkpoint_name

    from remat._report._report import current_machine

    def loss(p, x):
        def body(h, w):
            a = checkpoint_name(jnp.tanh(h @ w[0]), "act")
            return h + a @ w[1], None

        h, _ = jax.lax.scan(body, x, p)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    params, x = _mlp_shapes(layers=4, tokens=2048, d=512, f=2048)
    # an "offload:" strategy is checked against the target's chip (host memory), not this
    # CPU host; small enough that the checkpoints lower no HBM: the warning gives TPU's reason
    with pytest.warns(remat.RematWarning, match="kept in on-chip VMEM") as said:
        m = remat.measure(loss, params, x, strategy="offload:act", target="tpu:v5e-1")
    assert not any("jax.lax.scan" in str(w.message) for w in said)
    assert m.host_bytes == 4 * 2048 * 2048 * 2
    _memo.forget()
    remat.plan(loss, params, x, budget="100%", offload=True, target="tpu:v5e-1", verbose=False)
    (know,) = _memo._MEMORY.values()
    priced = [n for n in know.prepared.nodes if n.offload_flops is not None]
    assert priced
    for n in priced:
        assert n.offload_flops == pytest.approx(2 * n.bytes * n.multiplicity / 1.5e10 * 197e12)
    _memo.forget()
    machine = current_machine(remat.parse_target("tpu:v5e:2x2"))
    assert (machine.backend, machine.device_kind, machine.device_count) == ("tpu", "TPU v5 lite", 4)
    assert machine.host.startswith("tpu:v5e:2x2, compiled (never run) on ")
