import jax
import pytest

import remat
from remat._core._complex import RealSaves
from remat._core._strategy import as_strategy, offload_available, resolve_policy


@pytest.mark.parametrize(
    "name, policy",
    [
        ("full", jax.checkpoint_policies.nothing_saveable),
        ("dots", jax.checkpoint_policies.dots_saveable),
        ("dots_no_batch", jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
        ("everything", jax.checkpoint_policies.everything_saveable),
    ],
)
def test_named_policies_resolve_to_jax_policies(name, policy):
    got = resolve_policy(name)
    assert got is policy or got == RealSaves(policy)  # complex values recomputed


def test_none_means_no_checkpoint_and_policy_none_means_recompute_all():
    assert resolve_policy("none") is None
    assert resolve_policy(None) is jax.checkpoint_policies.nothing_saveable


def test_names_policy_saves_exactly_those_names():
    policy = resolve_policy("names:a, b")
    from jax._src.ad_checkpoint import name_p

    assert policy(name_p, name="a")
    assert policy(name_p, name="b")
    assert not policy(name_p, name="c")


def test_unknown_string_lists_valid_ones():
    with pytest.raises(ValueError, match=r"`remat.apply`.*'fulll'.*'dots_no_batch'"):
        as_strategy("fulll")


def test_empty_names_is_an_error():
    with pytest.raises(ValueError, match="no names"):
        as_strategy("names:")


def test_strategy_is_hashable_and_compares_by_value():
    a = remat.Strategy("dots", scans=(0, "layers"), schedule=remat.Binomial(3))
    b = remat.Strategy("dots", scans=(0, "layers"), schedule=remat.Binomial(3))
    assert a == b and hash(a) == hash(b)
    assert "Binomial(snapshots=3)" in repr(a)
    assert a.name == "dots+binomial(3)"


def test_strategy_validates_eagerly():
    with pytest.raises(ValueError, match=r"remat\.Strategy"):
        remat.Strategy("nope")
    with pytest.raises(ValueError, match="schedule"):
        remat.Strategy("full", schedule="sqrt")
    with pytest.raises(ValueError, match="scans"):
        remat.Strategy("full", scans=(1.5,))


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_binomial_rejects_bad_snapshots(bad):
    with pytest.raises(ValueError, match=r"`remat.Binomial`.*snapshots"):
        remat.Binomial(bad)


def test_nested_validates_lengths():
    assert remat.Nested(2, lengths=[4, 8]).lengths == (4, 8)
    with pytest.raises(ValueError, match=r"`remat.Nested`"):
        remat.Nested(2, lengths=(4,))
    with pytest.raises(ValueError, match=r"`remat.Nested`"):
        remat.Nested(0)


def test_offload_string_on_cpu_says_what_to_use_instead():
    assert not offload_available()
    with pytest.raises(ValueError, match="names:a,b"):
        resolve_policy("offload:a,b")
