"""The licensing rule (unlearning/licensing/decision.py): the cut fitted against brute force on tiny cases, its lowering
after a failed audit, the gate's operating characteristic, the guards and the decision."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from unlearning.licensing.decision import (
    Cuts, Guards, adjacent_share, audit_operating_characteristic, debiased_mu, decide, fail_probability, fit_cuts,
    lowered, map_paid, nearest_rows, operating_grid, request_false_accept,
)
from unlearning.metrics.epsilon import gdp_epsilon


def brute_force_cut(scores, fail, target, k, min_licensed):
    """Every threshold t any subset of rows could define, the largest whose licensed rows (score <= t) number at
    least min_licensed and keep 1 - (1 - mean fail)^k <= target: float64, no sorting tricks."""
    best = None
    for t in sorted(set(scores)):
        licensed = [f for s, f in zip(scores, fail) if s <= t]
        if len(licensed) >= min_licensed and 1 - (1 - sum(licensed) / len(licensed)) ** k <= target:
            best = t if best is None else max(best, t)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_fit_cuts_matches_brute_force_on_tiny_cases(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(3, 12))
    scores = np.round(rng.uniform(0, 3, m), 1)  # ties on purpose
    fail = rng.uniform(0, 0.3, m) * (scores > 1) + rng.choice([0.0, 1.0], m, p=[0.9, 0.1])
    fail = np.clip(fail, 0, 1)
    for target, min_rows in itertools.product((0.05, 0.2), (1, 3)):
        cuts = fit_cuts(scores, fail, target, max_rows=4, min_licensed=min_rows)
        for k in range(1, 5):
            assert cuts.for_rows(k) == brute_force_cut(scores.tolist(), fail.tolist(), target, k, min_rows)


def test_cuts_never_rise_with_the_request_size_and_larger_requests_get_none():
    rng = np.random.default_rng(1)
    scores = rng.uniform(0, 4, 200)
    fail = np.clip((scores - 1.0) / 3, 0, 1)
    cuts = fit_cuts(scores, fail, 0.05, max_rows=6, min_licensed=5)
    values = [c for c in cuts.by_rows if c is not None]
    assert values == sorted(values, reverse=True)
    assert cuts.for_rows(7) is None and cuts.for_rows(0) is None
    assert cuts.calibration_rows == 200 and cuts.target == 0.05


def test_an_epsilon_cut_never_passes_the_budget():
    scores = np.array([0.5, 1.0, 2.5, 3.5, 6.0])
    assert fit_cuts(scores, np.zeros(5), 0.05, max_rows=1, min_licensed=1).for_rows(1) == 6.0
    assert fit_cuts(scores, np.zeros(5), 0.05, max_rows=1, min_licensed=1, cap=3.0).for_rows(1) == 2.5


def test_no_cut_when_even_the_lowest_rows_fail_too_often():
    cuts = fit_cuts([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], 0.05, max_rows=2, min_licensed=1)
    assert cuts.by_rows == (None, None)


def test_a_failed_audit_lowers_every_cut_below_the_failing_rows():
    cuts = Cuts((2.0, 1.5, 1.0, None), 0.05, 100)
    low = lowered(cuts, [1.2, 1.7])
    assert low.by_rows[0] < 1.2 and low.by_rows[0] == math.nextafter(1.2, -math.inf)
    assert low.by_rows[1] < 1.2 and low.by_rows[2] == 1.0 and low.by_rows[3] is None
    assert low.lowered_by == 1
    assert Cuts.from_dict(low.to_dict()) == low


def test_request_false_accept():
    assert request_false_accept(0.0, 5) == 0.0
    assert request_false_accept(0.1, 1) == pytest.approx(0.1)
    assert request_false_accept(0.1, 3) == pytest.approx(1 - 0.9 ** 3)


def test_debiased_mu_removes_the_noise_of_the_mean_difference():
    np.testing.assert_allclose(debiased_mu([0.0, 0.5, 2.0], 32, 32), [0.0, math.sqrt(0.25 - 1 / 16), math.sqrt(4 - 1 / 16)])


def test_the_operating_characteristic_rises_from_the_gates_floor_to_certain_failure():
    grid = operating_grid(3.0, 1e-3, points=7)
    mu_b = grid[-1] / 1.5 - 0.5 / 1.5
    assert gdp_epsilon(mu_b, 1e-3)[0] == pytest.approx(3.0, rel=1e-3)  # the separation whose epsilon is the budget
    oc = audit_operating_characteristic(grid, 40, 3.0, 1e-3, 0.99, "gaussian", sims=60, n_bootstrap=100)
    assert oc[0] < 0.1 and oc[-1] == 1.0
    assert (np.diff(oc) >= -0.1).all()  # rises (up to simulation noise)
    p = fail_probability([0.0, grid[-1] + 1, np.nan], grid, oc)
    assert p[0] == oc[0] and p[1] == 1.0 and p[2] == 1.0


def test_adjacent_share_and_nearest_rows():
    X = np.array([[0.0], [0.1], [0.2], [5.0], [5.1], [9.0]])
    nb = nearest_rows(X[[0, 3]], X, [0, 3], k=1)
    assert nb.tolist() == [[1], [4]]
    assert adjacent_share([0, 1], nearest_rows(X[[0, 1]], X, [0, 1], k=1)) == 1.0  # each other's nearest
    assert adjacent_share([0, 5], nearest_rows(X[[0, 5]], X, [0, 5], k=2)) == 0.0
    assert adjacent_share([2], nearest_rows(X[[2]], X, [2], k=2)) == 0.0  # one row is never a cluster


GUARDS = Guards(max_class_share=0.1, max_adjacent_share=0.5, max_debt_rows=10)
CUTS = Cuts((2.0, 1.5, 1.0), 0.05, 100)
TRAIN_LABELS = np.repeat(np.arange(10), 50)


def test_a_request_of_rows_under_the_cut_is_licensed():
    d = decide([0.5, 1.2], CUTS, 3.0, [1, 2], TRAIN_LABELS, 0.0, GUARDS, debt_rows=0)
    assert d.licensed and d.path == "licensed" and d.cut == 1.5 and d.reasons == ()
    assert "model unchanged" in d.line() and d.to_dict()["path"] == "licensed"


@pytest.mark.parametrize("scores, labels, adjacent, debt, reason", [
    ([0.5, 1.6], [1, 2], 0.0, 0, "above the cut"),
    ([0.5, 0.5, 0.5, 0.5], [1, 2, 3, 4], 0.0, 0, "no cut keeps"),
    ([0.5, 0.5], [1, 1], 1.0, 0, "cluster"),
    ([0.5, 0.5], [1, 2], 0.0, 9, "max_debt_rows"),
    ([0.5, float("nan")], [1, 2], 0.0, 0, "no map entry"),
])
def test_what_takes_the_exact_path(scores, labels, adjacent, debt, reason):
    d = decide(scores, CUTS, 3.0, labels, TRAIN_LABELS, adjacent, GUARDS, debt_rows=debt)
    assert not d.licensed and d.path == "exact"
    assert any(reason in r for r in d.reasons), d.reasons


def test_a_class_is_never_licensed_whatever_its_scores():
    cuts = Cuts((5.0,) * 60, 0.05, 100)
    d = decide(np.zeros(50), cuts, 3.0, np.full(50, 3), TRAIN_LABELS, 0.0, GUARDS, debt_rows=0)
    assert not d.licensed and any("class-level" in r for r in d.reasons)
    assert d.class_share == 1.0


def test_without_a_map_nothing_is_licensed():
    d = decide([0.1], None, 3.0, [1], TRAIN_LABELS, 0.0, GUARDS, debt_rows=0)
    assert not d.licensed and any("no memorization map" in r for r in d.reasons)


def test_a_map_paid_when_it_licensed_at_least_its_cost_in_retrains():
    assert map_paid(licensed=5, decided=40, cost_retrains=4.8)
    assert not map_paid(licensed=2, decided=40, cost_retrains=4.8)
    assert map_paid(licensed=0, decided=9, cost_retrains=4.8)  # too early to say
