"""The gate's accuracy check keeps exact retrains in at every ensemble size (false-reject rate measured)."""

import numpy as np
import pytest
import scipy.stats as st

from unlearning.certificate.gate import accuracy_interval
from unlearning.stats import student_t_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30, 79])
def test_student_t_quantile_matches_scipy(df):
    for p in (0.5, 0.9, 0.975, 0.97725):
        assert student_t_quantile(p, df) == pytest.approx(st.t.ppf(p, df), abs=1e-5)


@pytest.mark.parametrize("df,p", [(1, 0.99997), (1, 0.999999), (2, 0.99999)])
def test_student_t_quantile_far_tail(df, p):
    # past the old bisection bracket of 1e4 (df = 1: 1.06e4 and 3.2e5)
    assert student_t_quantile(p, df) == pytest.approx(st.t.ppf(p, df), rel=1e-4)


@pytest.mark.parametrize("n_oracles", [3, 4, 8, 80])
def test_a_further_retrain_is_rejected_rarely_at_any_n(n_oracles):
    """Simulated retrains: each model's accuracy on a 138-row split varies with its seed (per-model rate
    ~ N(0.95, 0.015)) and its sampling. The [min, max] rule alone rejects a further retrain 2/(N+1) of
    the time (40% at N = 4); the interval must stay near the nominal ~5%."""
    rng = np.random.default_rng(n_oracles)
    n, trials, rejected = 138, 1000, 0
    for _ in range(trials):
        rates = np.clip(rng.normal(0.95, 0.015, n_oracles + 1), 0, 1)
        acc = rng.binomial(n, rates) / n
        oracles, candidate = acc[:-1], acc[-1]
        lo, hi = accuracy_interval(oracles.min(), oracles.max(), oracles.mean(), n, 2.0, oracles.std(), n_oracles)
        rejected += not lo <= candidate <= hi
    assert rejected / trials <= 0.06


def test_only_statistical_failures_let_an_exact_retrain_through():
    """The kind each check carries decides, not its name: a statistical check (a comparison with retrains) and
    a business rule (a floor) may share a name's prefix."""
    from unlearning.certificate.gate import BUSINESS, STATISTICAL, Check, Verdict

    kinds = {"klom_pvalue/forget": STATISTICAL, "klom_pvalue/remote": STATISTICAL, "acc/remote": STATISTICAL,
             "acc/adjacent": STATISTICAL, "acc/validation_min": BUSINESS}

    def verdict(*failed):
        checks = {k: Check(0.5, ">=", 0.9, k not in failed, kinds[k]) for k in
                  ("klom_pvalue/forget", "acc/remote", "acc/validation_min", *failed)}
        return Verdict(passed=all(c.passed for c in checks.values()), objective="retrain_equivalence", checks=checks)

    assert verdict("klom_pvalue/remote").failed_on_statistics_only()
    assert verdict("acc/adjacent").failed_on_statistics_only()
    assert not verdict("acc/validation_min").failed_on_statistics_only()  # a business floor
    assert not verdict("klom_pvalue/remote", "acc/validation_min").failed_on_statistics_only()
    assert not verdict().failed_on_statistics_only()  # nothing failed: nothing to override


def test_a_suppression_retrain_that_misses_the_bound_is_rejected():
    """Suppression's `acc/forget` is max_forget_accuracy, an absolute bound, though it shares the name of the
    retrain_equivalence gate's statistical check: an exact retrain that keeps predicting the forget set (as
    retrains do) must not be promoted as a false reject."""
    from unlearning.config import Gate
    from unlearning.certificate.gate import SplitMeasures, evaluate_gate

    measures = [SplitMeasures("forget", 0.6667), SplitMeasures("adjacent", 0.9, original_acc=0.92),
                SplitMeasures("validation", 0.9)]
    verdict = evaluate_gate("suppression", measures, Gate(), exact=True)
    assert not verdict.passed and not verdict.checks["acc/forget"]["passed"]
    assert not verdict.failed_on_statistics_only() and not any("gate defect" in f for f in verdict.failures)


def test_a_huge_z_asks_for_the_whole_range_not_an_error():
    # z = 50: the normal CDF is 1.0 in float64; the interval is then everything, not a ValueError.
    from unlearning.certificate.gate import accuracy_interval

    assert accuracy_interval(0.9, 0.95, 0.92, 50, 50.0, oracle_std=0.02, n_oracles=4) == (0.0, 1.0)
