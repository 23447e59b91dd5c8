"""bench/equivalence.py's per-row Gaussian eps (float64), the core's estimator (unlearning/metrics/epsilon.py) as the
bench reads it: mu from two samples of margins, eps(delta) on the Gaussian-DP curve
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth and Su 2019), inverted by bisection."""

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import equivalence  # noqa: E402  (a bench script, on sys.path as bench/ is)


def samples_at(mu: np.ndarray, n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """[n, k] margins whose per-row mean difference over the pooled sd (ddof 1) is exactly mu [k]."""
    base = np.linspace(-1.0, 1.0, n)[:, None] * np.ones((1, len(mu)))
    r = base / base.std(0, ddof=1)  # sd 1 per row
    return r + mu[None, :], r


def test_mu_per_row_is_the_mean_difference_over_the_pooled_sd():
    u, r = samples_at(np.array([0.0, 0.5, 2.0]))
    np.testing.assert_allclose(equivalence.gaussian_mu(u, r), [0.0, 0.5, 2.0], atol=1e-12)


def test_a_row_without_spread_is_far_but_finite():
    u, r = np.ones((4, 1)), np.zeros((4, 1))  # constant samples, different: mu = inf in the core, capped here
    eps = equivalence._gaussian_eps_per_row(u, r, delta=1e-3)
    assert np.isfinite(eps[0]) and eps[0] > 100


def test_eps_per_row_inverts_the_gaussian_dp_curve():
    mu = np.array([0.5, 1.0, 2.0, 5.0])
    eps = equivalence._gaussian_eps_per_row(*samples_at(mu), delta=1e-3)
    # closed form written out here from Phi, not from the bench's helper
    delta = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    np.testing.assert_allclose(delta, 1e-3, rtol=1e-9)
    np.testing.assert_allclose(eps[:3], [1.3523, 3.1387, 7.5813], atol=1e-4)  # closed form at delta = 1e-3
    assert np.all(np.diff(eps) > 0)


@pytest.mark.parametrize("mu", [0.0, 1e-4])
def test_rows_below_delta_read_zero(mu):
    # delta(0) = 2 Phi(mu/2) - 1 is below 1e-3 for mu < 0.0025: eps 0, no bisection
    assert equivalence._gaussian_eps_per_row(*samples_at(np.array([mu])), delta=1e-3)[0] == 0.0
