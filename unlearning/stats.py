"""The statistics the gate, the qualification and `unlearn status` share, without torch (docs/design.md §4.5,
§4.6, §4.7): the evaluated splits, the normal CDF, Student's t quantile, and the binomial intervals (Clopper and
Pearson 1934, one function for the one- and the two-sided uses; Wilson 1927).

numpy and the standard library only: importing it costs milliseconds, and whatever imports only it, the config
and the records (unlearning/certificate/gate.py, unlearning/certificate/qualification.py) answers without loading torch.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

# The evaluated splits, in report order (docs/design.md §4.2, §4.4).
SPLITS: tuple[str, ...] = ("forget", "adjacent", "remote", "validation")


def normal_cdf(z: float) -> float:
    """Phi(z) of the standard normal, float64."""
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def normal_quantile(p: float) -> float:
    """Phi^-1(p) of the standard normal (0 < p < 1)."""
    return NormalDist().inv_cdf(p)


@lru_cache(maxsize=256)
def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (p >= 0.5) of Student's t with `df` degrees of freedom: bisection on the CDF, which is
    0.5 + the integral of the density from 0 (Simpson's rule on the substitution x = tan u, which keeps the
    heavy tails of df = 1, 2 finite). Accurate to ~1e-6; the core has no scipy."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p = {p} must be in [0.5, 1)")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float) -> float:
        top, m = math.atan(t), 400  # integrate pdf(tan u) / cos(u)^2 over u in [0, atan t]
        f = lambda u: c * (1 + math.tan(u) ** 2 / df) ** (-(df + 1) / 2) / math.cos(u) ** 2  # noqa: E731
        h = top / m
        total = f(0) + f(top) + sum((4 if k % 2 else 2) * f(k * h) for k in range(1, m))
        return 0.5 + total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:  # bracket first: df = 1 at p = 0.99997 is past 1e4
        lo, hi = hi, hi * 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


# --- binomial proportions ---------------------------------------------------------------------------------

def _log_pmf(n: int, p: np.ndarray) -> np.ndarray:
    """log Binomial(n, p) pmf of every count j = 0..n: [len(p), n + 1] (p strictly inside (0, 1))."""
    j = np.arange(n + 1)
    log_comb = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in j])
    return log_comb[None, :] + j[None, :] * np.log(p)[:, None] + (n - j)[None, :] * np.log1p(-p)[:, None]


@lru_cache(maxsize=128)
def _clopper_pearson_table(n: int, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """For every count k = 0..n: lower[k] with P(X >= k | lower) = tail (0 at k = 0) and upper[k] with
    P(X <= k | upper) = tail (1 at k = n). float64 [n + 1] each, by bisection (100 halvings of (0, 1))."""
    k = np.arange(n + 1)
    ge_k = k[None, :] >= k[:, None]  # [k, j]: j >= k
    le_k = k[None, :] <= k[:, None]  # [k, j]: j <= k

    def solve(increasing_in_p) -> np.ndarray:
        lo, hi = np.full(n + 1, 1e-300), np.full(n + 1, 1 - 1e-16)
        for _ in range(100):
            mid = (lo + hi) / 2
            below = increasing_in_p(mid) < 0
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return (lo + hi) / 2

    # P(X >= k | p) grows with p: the lower bound is where it reaches the tail
    lower = solve(lambda p: (np.exp(_log_pmf(n, p)) * ge_k).sum(1) - tail)
    # P(X <= k | p) falls with p: the upper bound is where it falls to the tail
    upper = solve(lambda p: tail - (np.exp(_log_pmf(n, p)) * le_k).sum(1))
    lower[0], upper[n] = 0.0, 1.0
    lower.setflags(write=False)
    upper.setflags(write=False)
    return lower, upper


def clopper_pearson(k, n: int, confidence: float, two_sided: bool = True):
    """The exact interval of a binomial proportion seen k times in n (Clopper and Pearson 1934): lower L with
    P(X >= k | L) = tail (0 at k = 0), upper U with P(X <= k | U) = tail (1 at k = n), where tail is
    (1 - confidence) / 2 for the two-sided interval (coverage at least `confidence` for every p) and
    1 - confidence for two one-sided bounds (each holds with probability at least `confidence`).
    `k` an int -> (lower, upper) floats; an integer array -> (lower, upper) arrays of its shape. n = 0: (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: expected 0 < confidence < 1")
    if n < 0:
        raise ValueError(f"n = {n}: a count of trials is >= 0")
    counts = np.asarray(k)
    if counts.size and (counts.min() < 0 or counts.max() > n):
        raise ValueError(f"k = {k} must lie in [0, n = {n}]")
    if n == 0:
        lower, upper = np.zeros(1), np.ones(1)
    else:
        lower, upper = _clopper_pearson_table(int(n), (1 - confidence) / 2 if two_sided else 1 - confidence)
    if counts.ndim == 0:
        return float(lower[int(counts)]), float(upper[int(counts)])
    return lower[counts], upper[counts]


def wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval (Wilson 1927) at two-sided `confidence`. n = 0: (0, 1)."""
    if n == 0:
        return 0.0, 1.0
    z = normal_quantile(1 - (1 - confidence) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


INTERVALS = {"clopper_pearson": clopper_pearson, "wilson": wilson}
