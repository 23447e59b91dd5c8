"""Membership inference: loss-threshold AUC vs sklearn, per-example epsilon (NeurIPS 2023 challenge) vs a
plain per-example loop and vs the official threshold grid, hand cases, forget-quality score."""

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from unlearning.metrics import forget_quality_score, loss_threshold_auc, per_example_epsilon

DELTA = 1e-5


# ---------------------------------------------------------------- loss-threshold AUC
def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    f = np.round(rng.gamma(2.0, 0.3, size=57), 1)  # rounding creates many ties
    v = np.round(rng.gamma(2.0, 0.5, size=83), 1)
    y = np.r_[np.ones(57), np.zeros(83)]
    ref = roc_auc_score(y, -np.r_[f, v])  # members predicted by LOW loss
    assert loss_threshold_auc(f, v) == pytest.approx(ref, abs=1e-12)
    assert loss_threshold_auc(f, v) > 0.5


def test_auc_extremes():
    assert loss_threshold_auc([0.1, 0.2], [0.3, 0.4, 0.5]) == 1.0
    assert loss_threshold_auc([0.3, 0.4], [0.1, 0.2]) == 0.0
    assert loss_threshold_auc([0.2, 0.2], [0.2]) == 0.5
    with pytest.raises(ValueError, match="non-empty"):
        loss_threshold_auc([], [0.1])


# ---------------------------------------------------------------- per-example epsilon
def _eps_of_rates(fpr, fnr, delta=DELTA):
    """Official per-threshold rule, plain Python: None = discarded."""
    if fpr == 0 and fnr == 0:
        return math.inf
    if fpr == 0 or fnr == 0:
        return None
    terms = []
    if 1 - delta - fpr > 0:
        terms.append(math.log(1 - delta - fpr) - math.log(fnr))
    if 1 - delta - fnr > 0:
        terms.append(math.log(1 - delta - fnr) - math.log(fpr))
    return max(0.0, max(terms)) if terms else None


def _epsilon_official_grid(u, o, cap=50.0, delta=DELTA, per_unit=100):
    """Plain numpy port of the official scorer (DeepMind unlearning_metric.py): [models x thresholds]
    comparison masks, as the original torch code, single + double threshold rules, per example."""
    if np.median(o) > np.median(u):
        pos, neg = o, u
    else:
        pos, neg = u, o
    pd_, nd_ = np.ptp(pos), np.ptp(neg)
    if max(pd_, nd_) > 0 and min(pd_, nd_) / max(pd_, nd_) < 0.01:
        return cap
    # single rule
    lo_all, hi_all = min(pos.min(), neg.min()), max(pos.max(), neg.max())
    t = np.linspace(lo_all, hi_all, int(np.ceil((hi_all - lo_all) * per_unit)))
    fpr_s = (neg[:, None] >= t).mean(0)
    fnr_s = (pos[:, None] < t).mean(0)
    # double rule (positive = peakier)
    p2, n2 = (neg, pos) if pd_ >= nd_ else (pos, neg)
    width, buf = min(pd_, nd_), 2.0
    rmin, rmax = p2.min() + width - buf, p2.max() + buf
    right = np.linspace(rmin, rmax, int(np.ceil((rmax - rmin) * per_unit)))
    nl = int(np.ceil(2 * buf * per_unit))
    left = np.concatenate([np.linspace(r - width - buf, r - width + buf, nl) for r in right])
    right = np.repeat(right, nl)
    inside = lambda c: ((left <= c[:, None]) & (c[:, None] <= right))  # noqa: E731
    fpr_d = inside(n2).mean(0)
    fnr_d = 1 - inside(p2).mean(0)
    eps = [_eps_of_rates(a, b, delta) for a, b in zip(np.r_[fpr_s, fpr_d], np.r_[fnr_s, fnr_d])]
    kept = [e for e in eps if e is not None]
    return float(np.clip(max(kept), 0, cap)) if kept else 0.0


def test_hand_case():
    # u = {0,1,2,3}, o = {2,3,4,5}: best attack has FPR = FNR = 1/4 (single t = 3, or interval [0, 2]).
    u = np.array([[0.0], [1.0], [2.0], [3.0]])
    o = np.array([[2.0], [3.0], [4.0], [5.0]])
    assert per_example_epsilon(u, o)[0] == pytest.approx(math.log((0.75 - DELTA) / 0.25), rel=1e-12)


def test_one_zero_rate_thresholds_are_discarded():
    # u peaky near 0, o wide with one value (0.15) among u. Interval [0, 0.3] holds all u and that one o
    # (FNR = 0, FPR = 1/4): discarded, else it would give log(4) = 1.386. The best kept attacks have
    # FPR = FNR = 1/4 (single t in (0.2, 0.3], or interval [0, 0.2]).
    u = np.array([[0.0], [0.1], [0.2], [0.3]])
    o = np.array([[0.15], [1.0], [2.0], [3.0]])
    assert per_example_epsilon(u, o)[0] == pytest.approx(math.log((0.75 - DELTA) / 0.25), rel=1e-12)


def test_single_rule_positive_side_is_the_larger_median():
    # a case (found by search) where the single-threshold rule, with the oracle side (larger median) as
    # positive, gives the maximum: predicting the other side would give 1.139 instead of 1.569
    u = np.array([0.4, 3.3, -0.1, -0.6, -0.4])
    o = np.array([2.1, 4.2, -1.2, 0.1, 0.4, 0.0, 3.8, 2.6])
    got = per_example_epsilon(u[:, None], o[:, None])[0]
    assert got == pytest.approx(_epsilon_official_grid(u, o), rel=1e-12)
    assert got == pytest.approx(1.5686, abs=1e-4)


def test_identical_samples_give_zero_and_same_distribution_is_small():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 6))
    np.testing.assert_array_equal(per_example_epsilon(x, x), 0.0)  # every rule has TPR = FPR
    # two draws of one distribution: the tails of 200 samples give epsilon ~ 1-2 (see mia.py), far below
    # log(N - 1) ~ 5.3 (the scorer's measurable range) and the cap; a clear shift gives much more.
    same = per_example_epsilon(rng.normal(size=(200, 8)), rng.normal(size=(200, 8)))
    shifted = per_example_epsilon(rng.normal(size=(200, 8)), rng.normal(size=(200, 8)) + 2.0)
    assert same.mean() < 2.5 and same.max() < 3.5, same
    assert shifted.min() > same.max(), (same, shifted)


def test_fully_separated_is_capped():
    rng = np.random.default_rng(2)
    u = rng.normal(size=(25, 5))
    o = rng.normal(size=(25, 5)) + 20.0
    np.testing.assert_array_equal(per_example_epsilon(u, o), 50.0)
    np.testing.assert_array_equal(per_example_epsilon(o, u, cap=7.0), 7.0)


def test_peaky_and_constant_cases():
    rng = np.random.default_rng(3)
    o = rng.normal(size=(20, 1))
    assert per_example_epsilon(np.full((20, 1), 0.1), o)[0] == 50.0  # unlearned collapsed to one value
    assert per_example_epsilon(np.full((5, 1), 0.1), np.full((7, 1), 0.1))[0] == 0.0  # constant, equal
    assert per_example_epsilon(np.full((5, 1), 0.1), np.full((7, 1), 0.2))[0] == 50.0  # constant, different
    # the peaky rule can be switched off; an unlearned point mass sitting on one oracle value is then not
    # perfectly separable (every interval holding it holds that oracle too), so epsilon stays finite
    at_oracle = np.full((20, 1), o[3, 0])
    assert per_example_epsilon(at_oracle, o)[0] == 50.0
    assert per_example_epsilon(at_oracle, o, peaky_ratio=None)[0] < 50.0


def test_epsilon_monotone_in_shift():
    rng = np.random.default_rng(4)
    base_u = rng.normal(size=(60, 12))
    base_o = rng.normal(size=(60, 12))
    means = [per_example_epsilon(base_u, base_o + d).mean() for d in (0.0, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in zip(means, means[1:])), means


def test_matches_plain_port_of_official_scorer():
    rng = np.random.default_rng(5)
    n_u, n_o = 9, 13  # different model counts
    cols_u, cols_o = [], []
    for _ in range(2):
        # peaky low-median oracle vs skewed wide unlearned: the single rule's positive side (larger median)
        # differs from the double rule's (peakier side)
        cols_u.append(0.3 + rng.exponential(3.0, n_u)); cols_o.append(rng.normal(0.0, 0.4, n_o))
        # bimodal unlearned vs wider oracle
        cols_u.append(np.r_[rng.normal(-2, 0.3, 4), rng.normal(2, 0.3, n_u - 4)]); cols_o.append(rng.normal(0, 1.5, n_o))
        # narrow unlearned vs wide shifted oracle: the +-2 width band of the double rule binds
        cols_u.append(rng.normal(0.0, 1.0, n_u)); cols_o.append(rng.normal(0.7, 2.5, n_o))
        # ties inside and across sides
        cols_u.append(np.round(rng.normal(0.5, 1.0, n_u), 1)); cols_o.append(np.round(rng.normal(0.0, 1.0, n_o), 1))
    cols_u.append(rng.normal(size=n_u)); cols_o.append(rng.normal(scale=0.005, size=n_o))  # peaky rule: cap
    u, o = np.stack(cols_u, axis=1), np.stack(cols_o, axis=1)
    got = per_example_epsilon(u, o)
    ref = np.array([_epsilon_official_grid(u[:, i], o[:, i]) for i in range(u.shape[1])])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert got[-1] == 50.0 and len(np.unique(np.round(got, 6))) >= 5, got


def test_epsilon_rejects_bad_input():
    with pytest.raises(ValueError, match="examples"):
        per_example_epsilon(np.zeros((3, 2)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="non-finite"):
        per_example_epsilon(np.array([[np.nan]]), np.zeros((1, 1)))
    with pytest.raises(ValueError, match="clip"):
        per_example_epsilon(np.array([[0.0], [1e5]]), np.zeros((2, 1)))


def test_forget_quality_score_buckets():
    # 512 models: max epsilon ceil(log 511) = 7 -> 14 buckets of width 0.5 worth 1, 1/2, 1/4, ...
    eps = np.array([0.0, 0.49, 0.5, 1.2, 7.0, 50.0])
    assert forget_quality_score(eps, 512) == pytest.approx((1 + 1 + 0.5 + 0.25 + 0 + 0) / 6)
    assert forget_quality_score(np.array([6.9]), 512) == pytest.approx(0.5**13)
