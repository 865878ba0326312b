"""Per-device sizes without devices: shardings over an abstract 4x2 mesh, read and propagated.

The 8-device runs are in test_sharded.py; these check the arithmetic in the one-device process.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import remat
from remat._shard._shard_counts import shard_counts, splits_of
from remat._shard._sharding import is_sharded, shard_count

MESH = AbstractMesh((4, 2), ("data", "fsdp"))


def named(*spec):
    return NamedSharding(MESH, P(*spec))


@pytest.mark.parametrize(
    ("spec", "pieces", "per_device"),
    [
        ((), 1, 8 * 16 * 4),  # replicated: every device holds all 512 bytes
        (("data",), 4, 2 * 16 * 4),  # batch over data=4: (2, 16) per device
        ((None, "fsdp"), 2, 8 * 8 * 4),  # columns over fsdp=2: (8, 8)
        (("data", "fsdp"), 8, 2 * 8 * 4),  # both: (2, 8)
        ((("data", "fsdp"),), 8, 1 * 16 * 4),  # rows over both axes: (1, 16)
    ],
)
def test_per_device_bytes_divides_by_the_shard_count(spec, pieces, per_device):
    aval = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    assert shard_count((8, 16), named(*spec)) == pieces
    assert remat.per_device_bytes(aval, named(*spec)) == per_device
    assert remat.per_device_bytes(aval) == 512  # no sharding: whole


def test_per_device_bytes_pads_pieces_when_the_spec_does_not_divide():
    aval = jax.ShapeDtypeStruct((6, 16), jnp.bfloat16)  # 6 rows do not split 4 ways
    assert remat.per_device_bytes(aval, named("data")) == 2 * 16 * 2  # ceil(6 / 4) rows


def test_per_device_bytes_rejects_what_has_no_shape():
    with pytest.raises(TypeError, match=r"`remat.per_device_bytes`.*ShapeDtypeStruct"):
        remat.per_device_bytes(3.0)


def test_is_sharded_reads_abstract_meshes():
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=named("data"))
    assert is_sharded({"x": x})
    assert not is_sharded({"x": jnp.ones(3)})


def counts_of(fn, args, shardings):
    closed = jax.make_jaxpr(fn)(*args)
    counts = shard_counts(closed, shardings)
    return closed, counts


def test_dot_keeps_free_dimension_splits_and_drops_contracted_ones():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 32))
    closed, counts = counts_of(
        lambda x, w: (x @ w, (x @ w).sum(0), x.T @ x), (x, w), [named("data"), named(None, "fsdp")]
    )
    xw, col_sums, gram = closed.jaxpr.outvars
    assert counts[xw] == 8  # (8@data, 32@fsdp)
    assert counts[col_sums] == 2  # the data axis is summed away: (32@fsdp,)
    assert counts[gram] == 1  # contracting over the split batch: replicated (16, 16)


def test_elementwise_transpose_reshape_and_broadcast_keep_splits():
    def f(x):
        y = jnp.tanh(x) * 2.0
        return y.T, y.reshape(8, 4, 4), y[:, None, :], y.reshape(128)

    closed, counts = counts_of(f, (jnp.ones((8, 16)),), [named("data")])
    t, r, b, flat = closed.jaxpr.outvars
    assert [counts[v] for v in (t, r, b)] == [4, 4, 4]
    assert splits_of((8, 16), named("data")) == (4, 1)
    assert counts[flat] == 4  # a flattening reshape keeps the split on its outer part


def test_scan_body_values_are_split_like_the_sliced_inputs():
    def f(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w), h

        return jax.lax.scan(body, x, ws)

    ws, x = jnp.ones((3, 16, 16)), jnp.ones((8, 16))
    closed, counts = counts_of(f, (ws, x), [named(None, None, "fsdp"), named("data")])
    (scan,) = closed.jaxpr.eqns
    body = scan.params["jaxpr"].jaxpr
    h_in, w_in = body.invars
    assert counts[h_in] == 4 and counts[w_in] == 2  # the layer axis of ws is sliced off
    (dot,) = [e for e in body.eqns if e.primitive.name == "dot_general"]
    assert counts[dot.outvars[0]] == 8  # (8@data, 16@fsdp)
    carry, ys = closed.jaxpr.outvars
    assert counts[carry] == 8  # tanh(h @ w): (8@data, 16@fsdp)
    assert counts[ys] == 4  # stacked per-step carries: (3, 8@data, 16)


def test_no_value_is_split_more_ways_than_there_are_devices():
    x = jnp.ones((8, 8))
    closed, counts = counts_of(lambda x: x * x.T, (x,), [named(("data", "fsdp"))])
    # x is split 8 ways on rows, x.T 8 ways on columns; the merge would say 64.
    assert counts[closed.jaxpr.outvars[0]] == 8
