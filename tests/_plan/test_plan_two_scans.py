"""Two scans in sequence, the second reading the first's output in every step (an
encoder-decoder): a calibration point of one scan is a whole step whose other scan saves
nothing, as its prediction counts it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat._plan._alone import check_alone, solution_of
from remat._plan._calibrate import prepare
from remat._plan._memo import Knowledge


def _encoder_decoder(layers=2, d=16, batch=32):
    def enc_block(h, w):
        w1, w2 = w
        return h + jnp.tanh(h @ w1) @ w2, None

    def loss(params, x):
        enc, dec = params
        e, _ = jax.lax.scan(enc_block, x, enc)

        def dec_block(h, w):  # reads the encoder's output in every step
            w1, w2 = w
            return h + jnp.tanh((h + e) @ w1) @ w2, None

        h, _ = jax.lax.scan(dec_block, x, dec)
        return jnp.mean(h**2)

    keys = jax.random.split(jax.random.key(0), 5)

    def stack(k1, k2):
        return (
            jax.random.normal(k1, (layers, d, 4 * d)) / jnp.sqrt(d),
            jax.random.normal(k2, (layers, 4 * d, d)) / jnp.sqrt(4 * d),
        )

    params = (stack(*keys[:2]), stack(*keys[2:4]))
    return loss, (params, jax.random.normal(keys[4], (batch, d)))


@pytest.fixture(scope="module")
def prepared():
    loss, args = _encoder_decoder()
    return prepare(loss, args, 0, False)


def test_a_calibration_point_saves_nothing_in_the_other_scan(prepared):
    prep = prepared
    positions = {info.position for info in prep.infos}
    assert len(positions) == 2 and len(prep.calibration) >= 4
    for choice, _ in prep.calibration:
        # Left out, the other scan would compile as written (saving everything).
        assert set(choice.choices) == positions
        assert sum(1 for c in choice.choices.values() if not c.names) >= 1
        assert choice.flops > 0  # the other scan recomputes what it does not save


def test_a_calibration_point_is_predicted_as_its_scans_alone_predict_it(prepared):
    # The scans alone of a point's step count both scans, as its prediction does: a point
    # of one scan alone left the other's contribution (a whole scan's) out of the sum, and
    # the memory outside the scans read from its compiled step took it in.
    prep = prepared
    know = Knowledge(prep)
    for choice, predicted in prep.calibration:
        alone, _ = check_alone(prep, know, solution_of(prep, choice), choice, priced=True)
        assert int(alone) == predicted


def test_scans_alone_refuse_a_candidate_that_leaves_a_scan_out(prepared):
    from remat._plan._options import fixed_choice

    prep = prepared
    choice = fixed_choice(prep.cands, prep.offsets, prep.models, [0], save=True)
    with pytest.raises(ValueError, match=r"leaves scan\(s\) \[1\] out"):
        check_alone(prep, Knowledge(prep), solution_of(prep, choice), choice, priced=True)
