"""``remat demo``'s training-step section: a plan taken into the user's own ``train_step``.

A small linen model with dropout (its blocks in ``nn.scan``) is planned with Adam as part of
the budget (``optimizer=``), and the plan is applied, with `remat.apply(loss_fn, plan)`, to
the loss a Flax-style ``train_step`` makes at every call (closing over the batch and the
dropout key, updating a ``TrainState``). A few steps run beside the plain step: the losses are
equal, the compiled peak is the plan's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core._budget import MIB

# Small enough to add a few seconds to the demo.
SIZES = dict(layers=6, width=64, hidden=256, batch=128, steps=3)


def _model(layers: int, width: int, hidden: int):
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.Dropout(0.1, deterministic=False)(nn.gelu(nn.Dense(hidden)(x)))
            return x + nn.Dense(width)(h), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(
                Block, variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True}, length=layers,
            )  # fmt: skip
            x, _ = stack()(nn.Dense(width)(x), None)
            return nn.Dense(10)(x)

    return Model()


def _train_step(strategy):
    import optax

    from .._plan._apply import apply

    @jax.jit
    def train_step(state, x, y, key):
        dropout_key = jax.random.fold_in(key, state.step)

        def loss_fn(params):
            logits = state.apply_fn({"params": params}, x, rngs={"dropout": dropout_key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        if strategy is not None:
            loss_fn = apply(loss_fn, strategy)
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    return train_step


def train_section(budget: float = 0.6) -> str:
    """Plans the small model's Adam step at ``budget`` of its peak and runs a few steps."""
    import optax
    from flax.training import train_state

    from .._measure._peak import peak_bytes
    from .._plan._plan import plan

    s = SIZES
    model = _model(s["layers"], s["width"], s["hidden"])
    key = jax.random.key(0)

    @jax.jit  # one compile for the batch and the parameters, not one per operation
    def init(key):
        x = jax.random.normal(key, (s["batch"], 32))
        return x, model.init({"params": key, "dropout": key}, x)["params"]

    x, params = init(key)
    y = jnp.arange(s["batch"]) % 10
    tx = optax.adam(1e-3)

    def loss(params, x, y, key):
        logits = model.apply({"params": params}, x, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    p = plan(loss, params, x, y, key, budget=budget, optimizer=tx, schedules=False)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    lines = [
        f"remat.plan(loss, params, x, y, key, budget={budget:.0%}, optimizer=optax.adam(1e-3), "
        "schedules=False): "
        f"the Adam step's peak {p.measured_peak_bytes / MIB:.2f} MiB "
        f"({p.measured_peak_bytes / p.baseline_peak_bytes:.0%} of "
        f"{p.baseline_peak_bytes / MIB:.2f} MiB)."
    ]
    runs = {}
    for label, strategy in (("plain", None), ("planned", p)):
        step, st, losses = _train_step(strategy), state, []
        compiled_peak = peak_bytes(step.lower(st, x, y, key).compile())
        for _ in range(s["steps"]):
            st, value = step(st, x, y, key)
            losses.append(float(value))
        runs[label] = (losses, compiled_peak)
    for label, (losses, compiled_peak) in runs.items():
        shown = ", ".join(f"{v:.4f}" for v in losses)
        lines.append(
            f"  train_step ({label:7}) with remat.apply(loss_fn, plan) inside: "
            if label == "planned"
            else f"  train_step ({label:7}): "
        )
        lines[-1] += f"losses {shown}; compiled peak {compiled_peak / MIB:.2f} MiB"
    same = runs["plain"][0] == runs["planned"][0]
    lines.append(
        "  the same losses step by step (dropout masks recomputed, not redrawn)"
        if same
        else "  the losses differ (they should not: please report it)"
    )
    return "\n".join(lines)
