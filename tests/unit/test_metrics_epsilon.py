"""The per-row epsilon estimators (unlearning/metrics/epsilon.py): float64 references on tiny sizes, the
Gaussian-DP closed form, retrain against retrain near the floor, a memorized row at the cap."""

import math

import numpy as np
import pytest

from unlearning.metrics.epsilon import (aggregate, batch_epsilon, clopper_pearson_bounds, epsilon_metrics,
                                        epsilon_of_mu, gaussian_epsilon, gaussian_mu, gdp_delta, gdp_epsilon,
                                        row_epsilon, threshold_epsilon)
from unlearning.stats import clopper_pearson

DELTA = 1e-3


def _binom_sf(k, n, p):
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


@pytest.mark.parametrize("n", [1, 7, 30])
def test_clopper_pearson_bounds_solve_the_binomial_tails(n):
    lower, upper = clopper_pearson_bounds(n, 0.9)
    assert lower[0] == 0.0 and upper[n] == 1.0
    for k in range(n + 1):
        if k > 0:  # P(X >= k | lower) = 0.1, brute-force binomial sum
            assert _binom_sf(k, n, lower[k]) == pytest.approx(0.1, abs=1e-9)
        if k < n:  # P(X <= k | upper) = 0.1
            assert 1 - _binom_sf(k + 1, n, upper[k]) == pytest.approx(0.1, abs=1e-9)
        # the one-sided bounds at 0.9 are the two-sided interval at 0.8 (unlearning/stats.py, one function)
        lo2, hi2 = clopper_pearson(k, n, 0.8)
        assert lower[k] == pytest.approx(lo2, abs=1e-9) and upper[k] == pytest.approx(hi2, abs=1e-9)
        assert clopper_pearson(k, n, 0.9, two_sided=False) == (lower[k], upper[k])


def _scan_reference(u, r, delta):
    """Every threshold t of the pooled values and +inf, both directions, both role orders, in plain loops."""
    best = 0.0
    for t in [*u, *r, math.inf]:
        for sign in (1, -1):  # "U iff s >= t", and its mirror "U iff s < t"
            says_u = (lambda s: s >= t) if sign == 1 else (lambda s: s < t)
            fnr_u = sum(not says_u(s) for s in u) / len(u)  # U called R
            fpr_u = sum(says_u(s) for s in r) / len(r)  # R called U
            for fnr, fpr in ((fnr_u, fpr_u), (fpr_u, fnr_u)):  # roles swapped: R positive
                if fnr > 0 and 1 - delta - fpr > 0:
                    best = max(best, math.log((1 - delta - fpr) / fnr))
    return best


def test_threshold_scan_matches_brute_force_with_ties():
    rng = np.random.default_rng(3)
    u = np.round(rng.normal(0.0, 1.0, size=(9, 12)), 1)  # rounded: ties within and across the samples
    r = np.round(rng.normal(0.7, 1.0, size=(7, 12)), 1)
    got = threshold_epsilon(u, r, DELTA, rows_per_chunk=5)
    ref = [_scan_reference(u[:, i].tolist(), r[:, i].tolist(), DELTA) for i in range(12)]
    np.testing.assert_allclose(got.point, ref, rtol=0, atol=1e-12)
    assert (got.lower <= got.point + 1e-12).all() and (got.point <= got.upper + 1e-12).all()


def test_threshold_bounds_plug_in_clopper_pearson_rates():
    """A fully separated row: the best threshold errs on one U model (FNR 1/N) and no R model."""
    u = np.arange(10.0)[:, None]
    r = u + 100
    lo, hi = clopper_pearson_bounds(10, 0.95)
    got = threshold_epsilon(u, r, DELTA, 0.95)
    assert got.upper[0] == pytest.approx(math.log((1 - DELTA) / lo[1]))
    # the lower bound may use a threshold with no error at all: FNR's upper bound at 0 errors is > 0
    assert got.lower[0] == pytest.approx(math.log((1 - DELTA - hi[0]) / hi[0]))


def test_memorized_row_sits_at_the_cap():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(80, 5))
    r = rng.normal(size=(80, 5)) + 50  # every oracle far from every shadow: a row the candidate memorized
    got = threshold_epsilon(u, r, DELTA)
    np.testing.assert_allclose(got.point, math.log(80 * (1 - DELTA)), atol=1e-12)
    assert (gaussian_epsilon(u, r, DELTA).lower > 100).all()  # far beyond any budget


def test_retrain_against_retrain_sits_near_each_floor():
    rng = np.random.default_rng(1)
    u, r = rng.normal(size=(80, 400)), rng.normal(size=(80, 400))
    th = threshold_epsilon(u, r, DELTA)
    assert 1.2 < th.point.mean() < 1.6  # the threshold scan's floor at N = 80 (tails of 80 samples)
    assert th.upper.mean() > 4.5  # Clopper-Pearson cannot resolve small eps at N = 80
    g = gaussian_epsilon(u, r, DELTA)
    assert g.point.mean() < 0.45 and g.lower.mean() < 0.1  # the Gaussian fit resolves far better


@pytest.mark.parametrize("mu, closed", [(0.5, 1.352), (1.0, 3.139), (2.0, 7.581)])
def test_gaussian_estimator_recovers_the_closed_form(mu, closed):
    assert gdp_epsilon(mu, DELTA)[0] == pytest.approx(closed, abs=2e-3)
    rng = np.random.default_rng(2)
    u, r = rng.normal(size=(3000, 20)), rng.normal(mu, 1.0, size=(3000, 20))
    got = gaussian_epsilon(u, r, DELTA, n_bootstrap=50)
    assert got.point.mean() == pytest.approx(closed, rel=0.05)
    assert (got.lower <= got.point).all() and (got.point <= got.upper).all()


def _phi(x):
    return 0.5 * math.erfc(-x / math.sqrt(2))


@pytest.mark.parametrize("mu", [0.05, 0.3, 1.0, 4.0])
def test_gdp_epsilon_inverts_the_gdp_curve_float64(mu):
    eps = float(gdp_epsilon(mu, DELTA)[0])
    delta = _phi(-eps / mu + mu / 2) - math.exp(eps) * _phi(-eps / mu - mu / 2)
    if eps == 0.0:
        assert 2 * _phi(mu / 2) - 1 <= DELTA  # already below delta at eps = 0
    else:
        assert delta == pytest.approx(DELTA, rel=1e-6)
        assert float(gdp_delta(eps, mu)[()]) == pytest.approx(delta, rel=1e-9)
    assert gdp_epsilon(0.0, DELTA)[0] == 0.0 and np.isinf(gdp_epsilon(np.inf, DELTA)[0])


def test_gaussian_mu_is_the_standardized_mean_difference():
    u = np.array([[0.0], [2.0], [4.0]])
    r = np.array([[2.0], [4.0]])  # means 2 and 3, variances 4 and 2
    pooled = math.sqrt((2 * 4.0 + 1 * 2.0) / 3)
    assert gaussian_mu(u, r)[0] == pytest.approx(1.0 / pooled)
    same = np.ones((3, 1))
    assert gaussian_mu(same, same)[0] == 0.0 and np.isinf(gaussian_mu(same, same + 1)[0])


def test_aggregate_and_metrics_per_split():
    assert aggregate([0.0, 1.0, 2.0, 3.0], 0.5) == {"mean": 1.5, "quantile": 1.5}
    assert math.isnan(aggregate([], 0.9)["mean"])
    rng = np.random.default_rng(4)
    u, r = rng.normal(size=(20, 6)), rng.normal(size=(20, 6))
    r[:, :3] += 30  # the forget rows are far, the validation rows are not
    splits = np.array(["forget"] * 3 + ["validation"] * 3)
    m, rows = epsilon_metrics(u, r, splits, "threshold", DELTA, 0.9)
    assert m["forget"].point == pytest.approx(math.log(20 * (1 - DELTA)))
    assert m["validation"].point < m["forget"].point
    assert m["forget"].lower <= m["forget"].point <= m["forget"].upper
    assert m["validation"].mean == pytest.approx(rows.point[3:].mean())


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="estimator 'lira'"):
        row_epsilon(np.zeros((3, 1)), np.zeros((3, 1)), "lira", DELTA)
    with pytest.raises(ValueError, match="delta = 0"):
        threshold_epsilon(np.zeros((3, 1)), np.zeros((3, 1)), 0)
    with pytest.raises(ValueError, match="at least 2 models"):
        gaussian_epsilon(np.zeros((1, 2)), np.zeros((3, 2)), DELTA)
    with pytest.raises(ValueError, match="quantile"):
        aggregate([1.0], 1.5)


def test_infinite_rows_stay_infinite_through_quantiles():
    assert aggregate([1.0, np.inf, np.inf], 0.95)["quantile"] == np.inf
    assert aggregate([1.0, 2.0, np.inf], 0.5)["quantile"] == 2.0
    # two constant sides that differ: mu = inf on every resample, so both bounds are inf, not NaN
    u, r = np.zeros((3, 2)), np.ones((3, 2))
    got = gaussian_epsilon(u, r, DELTA, 0.9, n_bootstrap=20)
    assert np.isinf(got.point).all() and np.isinf(got.lower).all() and np.isinf(got.upper).all()


# --- bounds at every look: the bias-corrected lower bound, the batch aggregates ---------------------------------

def _reference_boot_mu(U, R, n_boot, seed):
    """The bootstrap of mu in plain float64 loops: each resample draws a multinomial count per model (the same
    draws as the estimator: U's B resamples, then R's), expands the values by their counts, and standardizes the
    mean difference by the pooled ddof-1 sd."""
    rng = np.random.default_rng(seed)
    wu = rng.multinomial(U.shape[0], np.full(U.shape[0], 1 / U.shape[0]), size=n_boot)
    wr = rng.multinomial(R.shape[0], np.full(R.shape[0], 1 / R.shape[0]), size=n_boot)
    out = np.zeros((n_boot, U.shape[1]))
    for b in range(n_boot):
        for i in range(U.shape[1]):
            u, r = np.repeat(U[:, i], wu[b]), np.repeat(R[:, i], wr[b])
            pooled = math.sqrt(((len(u) - 1) * u.var(ddof=1) + (len(r) - 1) * r.var(ddof=1)) / (len(u) + len(r) - 2))
            out[b, i] = abs(u.mean() - r.mean()) / pooled
    return out


def test_bias_corrected_lower_bound_float64_reference():
    rng = np.random.default_rng(5)
    U, R = rng.normal(size=(6, 3)), rng.normal(0.8, 1.0, size=(7, 3))
    got = gaussian_epsilon(U, R, DELTA, 0.9, n_bootstrap=40, seed=11)
    boot = _reference_boot_mu(U, R, 40, 11)
    np.testing.assert_allclose(got.boot_mu, boot, rtol=1e-9)
    mu, hi = gaussian_mu(U, R), np.quantile(boot, 0.9, axis=0)
    np.testing.assert_allclose(got.upper, gdp_epsilon(hi, DELTA), rtol=1e-12)
    # the basic bootstrap: the upper percentile reflected about the estimate (2 mu - q), floored at 0
    np.testing.assert_allclose(got.lower, gdp_epsilon(np.maximum(2 * mu - hi, 0.0), DELTA), rtol=1e-12)


def test_the_bias_corrected_lower_bound_holds_at_small_n_where_the_percentile_one_does_not():
    """Gaussians N(0, 1) and N(0.97, 1) per row (true eps 3.0 at delta 1e-3), 16 models per side, 2000 rows, one-
    sided 0.95: the plain percentile lower bound of mu lies above the truth on ~10 % of rows (|mean difference| /
    sd is biased upward at small N and the bootstrap doubles it); the reflected one on at most its 5 %."""
    rng = np.random.default_rng(7)
    truth = float(gdp_epsilon(0.97, DELTA)[0])
    U, R = rng.normal(size=(16, 2000)), rng.normal(0.97, 1.0, size=(16, 2000))
    got = gaussian_epsilon(U, R, DELTA, 0.95, n_bootstrap=400, seed=3)
    percentile = gdp_epsilon(np.quantile(got.boot_mu, 0.05, axis=0), DELTA)
    se = math.sqrt(0.05 * 0.95 / 2000)
    assert np.mean(got.lower > truth) <= 0.05 + 2 * se
    assert np.mean(percentile > truth) > 0.05 + 4 * se  # the bound it replaces does not hold
    assert np.mean(got.upper < truth) <= 0.05 + 2 * se


def test_epsilon_of_mu_matches_the_exact_curve():
    mu = np.concatenate([np.linspace(0, 20, 997), [0.0005, 19.9999, 20.5, 31.0]])
    np.testing.assert_allclose(epsilon_of_mu(mu, DELTA), gdp_epsilon(mu, DELTA), rtol=0, atol=1e-6)
    assert np.isinf(epsilon_of_mu(np.array([np.inf]), DELTA)).all()


def test_mean_aggregate_is_the_capped_mean_bounded_by_the_joint_bootstrap_float64_reference():
    rng = np.random.default_rng(9)
    U, R = rng.normal(size=(8, 5)), rng.normal(size=(8, 5))
    R[:, 0] += 40  # a memorized row: counted at the cap
    rows = gaussian_epsilon(U, R, DELTA, 0.9, n_bootstrap=60, seed=2)
    got = batch_epsilon(rows, "mean", 0.95, 0.9, DELTA, row_cap=4.0)
    capped = np.minimum(rows.point, 4.0)
    assert got.point == pytest.approx(capped.mean()) and capped[0] == 4.0
    assert got.mean == pytest.approx(rows.point.mean())  # the uncapped mean, logged beside it
    resampled = [np.minimum(gdp_epsilon(rows.boot_mu[b], DELTA), 4.0).mean() for b in range(rows.boot_mu.shape[0])]
    upper = float(np.quantile(resampled, 0.9))
    assert got.upper == pytest.approx(upper, abs=1e-6)
    assert got.lower == pytest.approx(max(0.0, 2 * got.point - upper), abs=1e-6)
    q = batch_epsilon(rows, "quantile", 0.95, 0.9, DELTA)
    assert (q.point, q.lower, q.upper) == (aggregate(rows.point, 0.95)["quantile"],
                                           aggregate(rows.lower, 0.95)["quantile"],
                                           aggregate(rows.upper, 0.95)["quantile"])
    with pytest.raises(ValueError, match="aggregate 'mean' needs the joint bootstrap"):
        batch_epsilon(threshold_epsilon(U, R, DELTA), "mean", 0.95, 0.9, DELTA)
    with pytest.raises(ValueError, match="aggregate 'median' is not known"):
        batch_epsilon(rows, "median", 0.95, 0.9, DELTA)


def test_mean_aggregate_bounds_hold_on_gaussians_where_the_truth_is_known():
    """20 batches of 50 rows at mu = 0.97 (true eps 3.0 per row, so the mean's truth is 3.0), N = 16 per side,
    one-sided 0.95: the joint bootstrap's bounds of the mean hold on most batches."""
    truth = float(gdp_epsilon(0.97, DELTA)[0])
    lower_holds = upper_holds = 0
    for k in range(20):
        rng = np.random.default_rng([13, k])
        U, R = rng.normal(size=(16, 50)), rng.normal(0.97, 1.0, size=(16, 50))
        got = batch_epsilon(gaussian_epsilon(U, R, DELTA, 0.95, n_bootstrap=200, seed=k), "mean", 0.95, 0.95,
                            DELTA, row_cap=10.0)
        lower_holds += got.lower <= truth
        upper_holds += got.upper >= truth
    assert lower_holds >= 18 and upper_holds >= 18
