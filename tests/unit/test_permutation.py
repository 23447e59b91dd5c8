"""Permutation test of retrain-equivalence (unlearning/metrics/permutation.py): exact vs a brute-force loop,
calibrated under the null (false-reject rate <= alpha), powerful when the distributions differ."""

import numpy as np
import pytest

from unlearning.metrics import klom, split_summary
from unlearning.metrics.permutation import UNDEFINED, klom_permutation_test, permutation_masks


def _brute(p, q, labels, n_perm, seed):
    """Per relabeling: klom() on the relabeled rows, then split_summary P95; p = (1 + #>=) / (1 + P)."""
    pooled = np.concatenate([p, q])
    masks = permutation_masks(len(pooled), len(p), n_perm, seed).astype(bool)

    def stat(sel):
        kl = klom(pooled[sel], pooled[~sel])
        return {s: v["p95"] for s, v in split_summary(np.where(np.isnan(kl), UNDEFINED, kl), labels).items()}

    obs = stat(np.arange(len(pooled)) < len(p))
    null = [stat(m) for m in masks]
    return {s: (obs[s], (1 + sum(t[s] >= obs[s] for t in null)) / (1 + n_perm)) for s in obs}


def test_matches_brute_force_loop():
    rng = np.random.default_rng(0)
    p = rng.normal(0.3, 1.0, size=(6, 9))
    q = rng.normal(0.0, 1.0, size=(7, 9))
    p[:, 0] = 100.0  # every unlearned margin at hi -> undefined KLoM on that sample
    labels = np.array(["forget"] * 3 + ["remote"] * 4 + ["validation"] * 2)
    got = klom_permutation_test(p, q, labels, n_permutations=40, seed=3, chunk=7)
    want = _brute(p, q, labels, 40, 3)
    for s, (obs, pv) in want.items():
        assert got[s]["p95"] == obs and got[s]["pvalue"] == pv, s
    # the observed statistic is the ordinary KLoM P95 where KLoM is defined
    kl = klom(p, q)
    assert got["remote"]["p95"] == split_summary(kl, labels)["remote"]["p95"]


def test_null_false_reject_rate_near_alpha():
    """200 synthetic trials with unlearned and oracle margins from ONE distribution (sample-specific means):
    the fraction of p < alpha must be about alpha (binomial sd at 200 trials, alpha 0.1: 0.021)."""
    rng = np.random.default_rng(1)
    n, n_u, n_o, trials = 30, 16, 16, 200
    pvals = []
    for _ in range(trials):
        mu = rng.normal(0, 3, size=n)
        sd = rng.uniform(0.5, 2, size=n)
        p = mu + sd * rng.standard_normal((n_u, n))
        q = mu + sd * rng.standard_normal((n_o, n))
        pvals.append(klom_permutation_test(p, q, np.array(["forget"] * n), n_permutations=99,
                                           seed=int(rng.integers(1 << 30)))["forget"]["pvalue"])
    pvals = np.array(pvals)
    for alpha in (0.05, 0.1, 0.2):
        rate = float(np.mean(pvals < alpha))
        assert rate <= alpha + 0.05, (alpha, rate)
        assert rate >= alpha - 0.05, (alpha, rate)


def test_small_pvalue_when_distributions_differ():
    rng = np.random.default_rng(2)
    n = 30
    mu = rng.normal(0, 3, size=n)
    p = mu + 2.0 + rng.standard_normal((40, n))  # shifted by two sd
    q = mu + rng.standard_normal((40, n))
    r = klom_permutation_test(p, q, np.array(["forget"] * n), n_permutations=99, seed=0)["forget"]
    assert r["pvalue"] == 0.01 and r["p95"] > r["null_p95"] > r["null_median"] > 0


def test_smallest_pvalue_with_few_models_bounds_the_test():
    # 2 unlearned vs 2 oracle models: only C(4, 2) = 6 relabelings, so a draw repeats the observed one about
    # 1 time in 6, and even the most extreme observed labeling gets p >= ~(1 + P/6) / (1 + P), far above
    # alpha = 0.01 (here the mirror labeling is as extreme too: p ~ 2/6). The floor is a lower bound.
    from unlearning.certificate.gate import smallest_klom_pvalue

    rng = np.random.default_rng(3)
    n = 30
    mu = rng.normal(0, 3, size=n)
    p, q = mu + 6.0 + 0.1 * rng.standard_normal((2, n)), mu + 0.1 * rng.standard_normal((2, n))
    pvals = [klom_permutation_test(p, q, np.array(["forget"] * n), n_permutations=600, seed=s)["forget"]["pvalue"]
             for s in range(5)]
    floor = smallest_klom_pvalue(2, 2, 600)
    assert 0.14 < floor < 0.17 and min(pvals) > floor - 0.04, (pvals, floor)
    assert smallest_klom_pvalue(80, 80, 200) == pytest.approx(1 / 201)
