"""The memorization map (unlearning/licensing/memorization.py): the halves' design, the IN/OUT gathering, and the map's
epsilon on rows whose IN and OUT statistics are known Gaussians (float64 references on tiny sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from unlearning.licensing.memorization import (
    MemorizationMap, affordable_members, half_splits, in_out_samples, member_rows, memorization_map, row_losses,
)
from unlearning.metrics.epsilon import gdp_epsilon


def test_halves_come_in_complementary_pairs_so_every_row_is_in_for_half_the_members():
    mask = half_splits(10, 8, seed=3)
    assert mask.shape == (8, 10)
    assert (mask.sum(1) == 5).all()
    assert (mask[0::2] ^ mask[1::2]).all()  # each pair splits every row between its two members
    assert (mask.sum(0) == 4).all()
    assert not (half_splits(10, 8, seed=4) == mask).all()  # seeded


def test_an_odd_row_count_leaves_one_row_out_of_each_pair_and_every_row_still_compares_as_many_in_as_out():
    mask = half_splits(7, 6, seed=0)
    assert (mask.sum(1) == 3).all()
    assert ((mask[0::2] | mask[1::2]).sum(1) == 6).all()  # one row of 7 in neither half of a pair
    U, R = in_out_samples(np.arange(42, dtype=float).reshape(6, 7), mask)
    assert U.shape == R.shape


def test_member_rows_lists_each_members_rows():
    mask = half_splits(6, 4, seed=1)
    rows = member_rows(mask)
    for k in range(4):
        assert sorted(rows[k].tolist()) == np.flatnonzero(mask[k]).tolist()


@pytest.mark.parametrize("n_members", [3, 2, 0])
def test_an_odd_or_too_small_ensemble_is_refused(n_members):
    with pytest.raises(ValueError, match="even number of members"):
        half_splits(10, n_members, seed=0)


def test_in_out_samples_takes_each_rows_own_in_and_out_members():
    # member k's value on row j is 100 k + j: which members a row gathers can be read back
    mask = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=bool)
    values = 100.0 * np.arange(4)[:, None] + np.arange(3)[None, :]
    U, R = in_out_samples(values, mask)
    assert U.tolist() == [[0, 101, 2], [200, 201, 302]]
    assert R.tolist() == [[100, 1, 102], [300, 301, 202]]


def test_the_maps_epsilon_on_known_gaussians_matches_the_gaussian_dp_curve():
    """Rows whose IN margins are N(mu, 1) and OUT margins N(0, 1): the map's point epsilon approaches the closed
    form eps(mu, delta) (float64), and its bounds bracket it."""
    rng = np.random.default_rng(0)
    n_members, mus, delta = 2000, np.array([0.0, 0.5, 1.0, 2.0]), 1e-3
    mask = half_splits(len(mus), n_members, seed=1)
    margin = rng.standard_normal((n_members, len(mus))) + np.where(mask, mus[None, :], 0.0)
    # logits [N, n, 2] whose margin z_y - z_other is `margin` (label 0)
    logits = np.stack([margin, np.zeros_like(margin)], axis=-1)
    m = memorization_map(logits, np.zeros(len(mus), dtype=int), mask, logits[0], delta, 0.99, n_bootstrap=400)
    truth = gdp_epsilon(mus, delta)
    np.testing.assert_allclose(m.mu, mus, atol=0.1)  # 1000 per side: the fitted separation within 2 standard errors
    np.testing.assert_allclose(m.point, gdp_epsilon(m.mu, delta), rtol=1e-9)  # read through the curve, exactly
    assert m.point[0] < 0.3  # no memorization: near 0
    assert (m.lower <= m.point + 1e-12).all() and (m.point <= m.upper + 1e-12).all()
    assert (m.lower[1:] <= truth[1:]).all() and (truth[1:] <= m.upper[1:]).all()
    assert m.n_members == n_members and len(m) == 4


def test_row_losses_is_the_cross_entropy_in_float64():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    labels = np.array([0, 2])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(row_losses(logits, labels), -np.log(p[[0, 1], [0, 2]]), rtol=1e-12)
    np.testing.assert_allclose(row_losses(logits[None], labels), row_losses(logits, labels))


def test_score_names_the_three_scores_and_share_above_counts_upper_bounds():
    m = MemorizationMap(point=np.array([0.1, 2.0]), lower=np.zeros(2), upper=np.array([1.0, 4.0]), mu=np.zeros(2),
                        loss=np.array([0.5, 0.1]), n_members=8, delta=1e-3, confidence=0.9)
    assert m.score("upper").tolist() == [1.0, 4.0] and m.score("loss").tolist() == [0.5, 0.1]
    assert m.share_above(3.0) == 0.5
    with pytest.raises(ValueError, match="allowed"):
        m.score("mean")


def test_affordable_members_is_the_largest_even_size_within_the_budget():
    cost = lambda n: 0.25 * n  # noqa: E731  (retrains for n half-data members)
    assert affordable_members(8.0, cost, 16, 64) == 32
    assert affordable_members(3.0, cost, 16, 64) is None  # even 16 members cost 4 retrains
    assert affordable_members(100.0, cost, 16, 64) == 64
