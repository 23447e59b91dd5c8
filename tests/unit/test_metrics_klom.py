"""KLoM (docs/design.md §4.2): hand-computed rule cases, direction, model counts, vectorized vs per-sample loop."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from unlearning.metrics import klom, klom_summary, noise_floor, oracle_half_klom


def _klom_loop(p_arr, q_arr, normalize_q=False):
    """Per-sample procedure of the public reference (data-unlearning-bench compute_binned_KL_div), written
    out with np.digitize; normalize_q=True ends with scipy.stats.entropy exactly as the reference does."""
    p_arr = np.clip(p_arr, -100, 100)
    q_arr = np.clip(q_arr, -100, 100)
    lo = min(p_arr.min(), q_arr.min())
    hi = max(p_arr.max(), q_arr.max())
    if lo >= hi:
        hi = lo + 1
    bins = np.linspace(lo, hi, 21)
    pi, qi = np.digitize(p_arr, bins), np.digitize(q_arr, bins)
    pc = np.array([np.sum(pi == i) for i in range(1, 21)])
    qc = np.array([np.sum(qi == i) for i in range(1, 21)])
    pp = pc / pc.sum() if pc.sum() > 0 else np.zeros(20)
    qp = qc / qc.sum() if qc.sum() > 0 else np.zeros(20)
    qs = np.where(pp > 0, np.maximum(qp, 1e-5), qp)
    if normalize_q:
        return stats.entropy(pk=pp, qk=qs)  # nan when nothing of p is counted (0/0 inside scipy)
    if pc.sum() == 0:
        return np.nan
    return float(sum(pp[i] * math.log(pp[i] / qs[i]) for i in range(20) if pp[i] > 0))


def _col(*v):
    return np.array(v, dtype=float)[:, None]


def test_identical_samples_give_zero():
    rng = np.random.default_rng(0)
    p = rng.normal(scale=5, size=(30, 40))
    np.testing.assert_array_equal(klom(p, p), np.zeros(40))
    # same empirical distribution with a different model count (each oracle value twice)
    np.testing.assert_allclose(klom(p, np.concatenate([p, p])), 0.0, atol=1e-15)


def test_clip_rule():
    # 150 clips to 100, so both sides are {0, 100}; without the clip 100 would sit in bin 14 and 150 at hi.
    assert klom(_col(150.0, 0.0), _col(100.0, 0.0))[0] == 0.0
    # -300 and -100 both clip to -100: p = {-100, 0}, q = {-100, 0} -> 0.
    assert klom(_col(-300.0, 0.0, 5.0), _col(-100.0, 0.0, 5.0))[0] == 0.0


def test_value_equal_to_hi_is_not_counted():
    # lo = 0, hi = 10: p's 10 is in no bin, so p = all mass in bin 1 = q. A closed last bin would give
    # 0.5 log(0.5) + 0.5 log(0.5 / 1e-5) > 0 instead.
    assert klom(_col(0.0, 10.0), _col(0.0, 0.0))[0] == 0.0
    assert klom(_col(0.0, 0.0), _col(0.0, 10.0))[0] == 0.0


def test_floor_rule_hand_computed():
    # lo = 0, hi = 10, bin width 0.5: p = {0 -> bin 1, 5 -> bin 11} = [.5, .5]; q = {0, 0} in bin 1 (10 = hi
    # not counted) -> q = 1 in bin 1 and 0 in bin 11, floored to 1e-5 there.
    p, q = _col(0.0, 5.0), _col(0.0, 0.0, 10.0)
    expected = 0.5 * math.log(0.5 / 1.0) + 0.5 * math.log(0.5 / 1e-5)
    assert klom(p, q)[0] == pytest.approx(expected, rel=1e-12)
    # reference variant: scipy renormalizes the floored q to sum 1
    z = 1.0 + 1e-5
    expected_norm = 0.5 * math.log(0.5 * z) + 0.5 * math.log(0.5 * z / 1e-5)
    assert klom(p, q, normalize_q=True)[0] == pytest.approx(expected_norm, rel=1e-12)


def test_direction_is_kl_unlearned_to_oracle():
    # counted: p = {0: 1, 5: 1} -> [.5, .5]; q = {0: 3, 5: 1} -> [.75, .25]; both have a 10 (= hi, not counted).
    p = _col(0.0, 5.0, 10.0)
    q = _col(0.0, 0.0, 0.0, 5.0, 10.0)
    kl_pq = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    kl_qp = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert abs(kl_pq - kl_qp) > 1e-3
    assert klom(p, q)[0] == pytest.approx(kl_pq, rel=1e-12)
    assert klom(q, p)[0] == pytest.approx(kl_qp, rel=1e-12)


def test_all_equal_values_use_unit_width_bins():
    assert klom(_col(3.0, 3.0), _col(3.0, 3.0, 3.0))[0] == 0.0


def test_uncounted_sides():
    # every unlearned value equals hi -> nothing counted -> nan (as the reference); oracle side uncounted -> floor.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(_klom_loop(np.array([5.0, 5.0]), np.array([0.0, 5.0]), normalize_q=True))
    assert np.isnan(klom(_col(5.0, 5.0), _col(0.0, 5.0))[0])
    # p = {0} counted (its 5 = hi is not), q has nothing counted: KL = 1 * log(1 / 1e-5).
    assert klom(_col(0.0, 5.0), _col(5.0, 5.0))[0] == pytest.approx(math.log(1e5), rel=1e-12)


@pytest.mark.parametrize("normalize_q", [False, True])
def test_vectorized_matches_loop_reference(normalize_q):
    rng = np.random.default_rng(3)
    n = 300
    n_u, n_o = 9, 14  # different model counts
    shift = rng.normal(scale=3, size=n)
    p = rng.normal(loc=shift, scale=rng.uniform(0.1, 5, size=n), size=(n_u, n))
    q = rng.normal(scale=rng.uniform(0.1, 5, size=n), size=(n_o, n))
    p[:, :40] = np.round(p[:, :40])  # ties and values exactly on bin edges
    q[:, :40] = np.round(q[:, :40])
    p[:, 40:60] *= 80.0  # beyond the clip
    q[:, 50:70] = 2.0  # constant oracle side
    p[:, 60:65] = 2.0  # both sides constant and equal (lo >= hi)
    got = klom(p, q, normalize_q=normalize_q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = np.array([_klom_loop(p[:, s], q[:, s], normalize_q) for s in range(n)])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    assert np.any(got > 1.0) and np.any(got == 0.0)


def test_klom_rejects_mismatched_samples():
    with pytest.raises(ValueError, match="samples"):
        klom(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="n_models, n_samples"):
        klom(np.zeros(4), np.zeros((3, 4)))


def test_klom_summary_per_split():
    values = np.array([0.0, 1.0, 2.0, 3.0, 10.0, 20.0, np.nan])
    splits = np.array(["validation", "forget", "forget", "forget", "remote", "remote", "adjacent"])
    s = klom_summary(values, splits)
    assert list(s) == ["forget", "adjacent", "remote", "validation"]
    assert s["forget"]["p95"] == pytest.approx(np.percentile([1.0, 2.0, 3.0], 95))
    assert s["forget"]["mean"] == pytest.approx(2.0)
    assert s["remote"]["p95"] == pytest.approx(19.5)
    assert s["forget"]["n"] == 3 and s["forget"]["n_undefined"] == 0
    assert np.isnan(s["adjacent"]["p95"]) and s["adjacent"]["n_undefined"] == 1


def test_noise_floor_halves_and_seed():
    rng = np.random.default_rng(4)
    q = rng.normal(size=(11, 50))
    splits = np.array(["forget"] * 20 + ["validation"] * 30)
    perm = np.random.default_rng(7).permutation(11)
    np.testing.assert_array_equal(oracle_half_klom(q, seed=7), klom(q[perm[:5]], q[perm[5:]]))
    a, b = noise_floor(q, splits, seed=7), noise_floor(q, splits, seed=7)
    assert a == b and set(a) == {"forget", "validation"}
    assert noise_floor(q, splits, seed=8) != a
    # two identical oracles: the halves agree exactly
    same = np.repeat(rng.normal(size=(1, 50)), 2, axis=0)
    assert noise_floor(same, splits)["forget"]["p95"] == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        oracle_half_klom(q[:1])


def test_klom_grows_with_distribution_shift():
    rng = np.random.default_rng(5)
    base = rng.normal(size=(100, 200))
    oracle = rng.normal(size=(100, 200))
    means = [np.mean(klom(base + d, oracle)) for d in (0.0, 0.5, 1.5, 4.0)]
    assert all(a < b for a, b in zip(means, means[1:]))
