"""How far a candidate is from retraining, in differential privacy's unit: a per-row epsilon with confidence
bounds, from the shadow-unlearned models' and the oracles' statistics on that row (docs/design.md §4.7;
docs/certificate.md, "Two questions: gate.criterion").

For one row x let U be the statistic (the margin, log(p/(1-p)) of the true label: metrics/margins.py) over the
N_u shadow-unlearned models, and R the same over the N_o oracles. If the two distributions are (eps, delta)-
indistinguishable, every test "U or R?" has FPR + e^eps FNR >= 1 - delta, and the same with the roles swapped.
Two estimators read eps(x) from the samples:

- `threshold_epsilon`: the NeurIPS 2023 unlearning challenge's estimator: eps(x) = max over thresholds t of
  log((1 - delta - FPR(t)) / FNR(t)) and its mirror (roles swapped, both directions of the test). A threshold
  where the denominator's rate is 0 gives no finite value and is skipped, so the point estimate is capped at
  log(N (1 - delta)) (a fully separated row: FPR = 0, FNR = 1/N). Upper bound: the one-sided Clopper-Pearson
  lower bounds of both rates plugged in (smallest plausible errors); lower bound: their upper bounds. It reads
  the tails of N samples, so identical distributions give a floor of about 1.4 at N = 80.
  (unlearning/metrics/mia.py `per_example_epsilon` is the challenge scorer itself, with its double thresholds
  and a cap of 50 at perfect separation; this one is the single-threshold scan with the cap above.)
- `gaussian_epsilon`: a parametric fit, as LiRA (Carlini et al. 2022) and U-LiRA (Hayes et al. 2024) fit
  Gaussians to the margin: mu = |mean(U) - mean(R)| / pooled sd, then eps(delta) of the mu-Gaussian-DP
  trade-off curve (Dong, Roth and Su 2019): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),
  inverted by bisection. Bounds: the percentile bootstrap of mu over the references (both samples resampled),
  each end mapped through the same curve (eps is increasing in mu).

A batch aggregates its rows' eps by the mean and a high quantile (`aggregate`): a batch is only as private as its
worst rows. Confidence is one-sided for each bound. The max over thresholds of per-threshold bounds is not a
simultaneous bound (the scan picks its best threshold), which bench/calibration.py measures rather than corrects.

Pure: numpy and torch (the normal CDF in float64), no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from unlearning import metric_keys as K

from ._arrays import as_f64, as_split_labels, require_finite

ESTIMATORS = ("threshold", "gaussian")


@dataclass(frozen=True)
class RowEpsilon:
    """Per-row eps: the point estimate and its one-sided lower and upper bounds, float64 [n] each."""

    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


def _samples(u: Any, r: Any) -> tuple[np.ndarray, np.ndarray]:
    """U [N_u, n] and R [N_o, n] as float64, checked: at least 2 models per side, the same rows, finite."""
    U, R = as_f64(u, "unlearned"), as_f64(r, "oracles")
    if U.ndim == 1:
        U, R = U[:, None], R[:, None] if R.ndim == 1 else R
    if U.ndim != 2 or R.ndim != 2 or U.shape[1] != R.shape[1]:
        raise ValueError(f"unlearned/oracles: expected [N_u, n] and [N_o, n] with the same n, got "
                         f"{list(U.shape)} and {list(R.shape)}")
    if U.shape[0] < 2 or R.shape[0] < 2:
        raise ValueError(f"unlearned/oracles: at least 2 models per side are needed, got {U.shape[0]} and {R.shape[0]}")
    require_finite(U, "unlearned")
    require_finite(R, "oracles")
    return U, R


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta}: expected 0 < delta < 1 (e.g. 1e-3)")


# --- Clopper-Pearson bounds of a binomial proportion, for every count at once ---------------------------------

def _log_pmf(n: int, p: np.ndarray) -> np.ndarray:
    """log Binomial(n, p) pmf of every count j = 0..n: [len(p), n + 1] (p strictly inside (0, 1))."""
    j = np.arange(n + 1)
    log_comb = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in j])
    return log_comb[None, :] + j[None, :] * np.log(p)[:, None] + (n - j)[None, :] * np.log1p(-p)[:, None]


@lru_cache(maxsize=64)
def clopper_pearson_bounds(n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds (Clopper and Pearson 1934) of a proportion seen k times in n, for every
    k = 0..n: lower[k] with P(X >= k | lower) = 1 - confidence (0 at k = 0), upper[k] with
    P(X <= k | upper) = 1 - confidence (1 at k = n). float64 [n + 1] each, by bisection (60 halvings)."""
    if n < 1:
        raise ValueError(f"n = {n}: a proportion needs at least one trial")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: expected 0 < confidence < 1")
    tail = 1 - confidence
    k = np.arange(n + 1)
    ge_k = k[None, :] >= k[:, None]  # [k, j]: j >= k

    def solve(sf_minus_tail_increasing) -> np.ndarray:
        lo, hi = np.full(n + 1, 1e-300), np.full(n + 1, 1 - 1e-16)
        for _ in range(60):
            mid = (lo + hi) / 2
            below = sf_minus_tail_increasing(mid) < 0
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return (lo + hi) / 2

    # P(X >= k | p) grows with p: the lower bound is where it reaches the tail
    lower = solve(lambda p: (np.exp(_log_pmf(n, p)) * ge_k).sum(1) - tail)
    # P(X <= k | p) falls with p: the upper bound is where it falls to the tail
    le_k = ~ge_k | (k[None, :] == k[:, None])  # [k, j]: j <= k
    upper = solve(lambda p: tail - (np.exp(_log_pmf(n, p)) * le_k).sum(1))
    lower[0], upper[n] = 0.0, 1.0
    return lower, upper


# --- the threshold estimator --------------------------------------------------------------------------------

def _forms(a: np.ndarray, b: np.ndarray, n_u: int, n_o: int) -> list[tuple[np.ndarray, int, np.ndarray, int]]:
    """The four tests of one threshold, as (FN count, its n, FP count, its n): from the counts a = #{U < t},
    b = #{R >= t} of "U iff s >= t", its mirror "U iff s < t", and both with the roles of U and R swapped."""
    return [(a, n_u, b, n_o), (n_u - a, n_u, n_o - b, n_o), (b, n_o, a, n_u), (n_o - b, n_o, n_u - a, n_u)]


def _eps_of(fn_rate: np.ndarray, fp_rate: np.ndarray, valid: np.ndarray, delta: float) -> np.ndarray:
    """log((1 - delta - FPR) / FNR) where valid and the numerator is positive, NaN elsewhere."""
    num = 1.0 - delta - fp_rate
    ok = valid & (num > 0) & (fn_rate > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.log(np.where(ok, num, 1.0)) - np.log(np.where(ok, fn_rate, 1.0)), np.nan)


def _max_over(eps_list: list[np.ndarray]) -> np.ndarray:
    """Max over thresholds (axis 0) and forms, floored at 0 (no informative threshold: 0)."""
    stacked = np.stack(eps_list)  # [forms, T, n]
    best = np.nanmax(np.where(np.isnan(stacked), -np.inf, stacked), axis=(0, 1))
    return np.maximum(best, 0.0)


def threshold_epsilon(u: Any, r: Any, delta: float, confidence: float = 0.95, *,
                      rows_per_chunk: int = 256) -> RowEpsilon:
    """The challenge's threshold estimator per row (module docstring), with Clopper-Pearson bounds at one-sided
    `confidence`. u [N_u, n], r [N_o, n]: the statistic of each model on each row. Thresholds: every pooled
    value and +inf (every distinct outcome of the scan)."""
    _check_delta(delta)
    U, R = _samples(u, r)
    n_u, n_o, n = U.shape[0], R.shape[0], U.shape[1]
    cp = {n_u: clopper_pearson_bounds(n_u, confidence), n_o: clopper_pearson_bounds(n_o, confidence)}
    out = {k: np.zeros(n) for k in ("point", "lower", "upper")}
    for s in range(0, n, rows_per_chunk):
        Uc, Rc = U[:, s:s + rows_per_chunk], R[:, s:s + rows_per_chunk]
        T = np.concatenate([Uc, Rc, np.full((1, Uc.shape[1]), np.inf)])  # [N_u + N_o + 1, m]
        a = (Uc[None, :, :] < T[:, None, :]).sum(1)  # [T, m]: U models the test "U iff s >= t" calls R
        b = (Rc[None, :, :] >= T[:, None, :]).sum(1)  # [T, m]: R models it calls U
        point, lower, upper = [], [], []
        for fn, nf, fp, np_ in _forms(a, b, n_u, n_o):
            point.append(_eps_of(fn / nf, fp / np_, fn > 0, delta))
            upper.append(_eps_of(cp[nf][0][fn], cp[np_][0][fp], fn > 0, delta))
            lower.append(_eps_of(cp[nf][1][fn], cp[np_][1][fp], np.ones_like(fn, bool), delta))
        out["point"][s:s + rows_per_chunk] = _max_over(point)
        out["lower"][s:s + rows_per_chunk] = _max_over(lower)
        out["upper"][s:s + rows_per_chunk] = _max_over(upper)
    return RowEpsilon(out["point"], out["lower"], out["upper"])


# --- the Gaussian estimator ---------------------------------------------------------------------------------

def gdp_delta(eps: Any, mu: Any) -> np.ndarray:
    """delta(eps) of mu-Gaussian DP (Dong, Roth and Su 2019, Corollary 2.13), float64, elementwise:
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (the second term in logs: it is inf * 0 for large eps)."""
    e = torch.as_tensor(np.asarray(eps, np.float64))
    m = torch.as_tensor(np.asarray(mu, np.float64))
    first = torch.special.ndtr(-e / m + m / 2)
    second = torch.exp(e + torch.special.log_ndtr(-e / m - m / 2))
    return (first - second).clamp_min(0.0).numpy()


def gdp_epsilon(mu: Any, delta: float, iters: int = 200) -> np.ndarray:
    """The eps at which mu-Gaussian DP gives `delta`, elementwise over `mu` (float64): 0 where mu = 0 or
    delta(0) <= delta; inf where mu is inf. delta(eps) falls with eps; bisection on [0, mu z + mu^2 / 2]
    (z = Phi^-1(1 - delta): there Phi(-eps/mu + mu/2) alone is delta)."""
    _check_delta(delta)
    mu = np.atleast_1d(np.asarray(mu, np.float64))
    if (mu < 0).any() or np.isnan(mu).any():
        raise ValueError("mu: expected values >= 0")
    out = np.zeros_like(mu)
    out[np.isinf(mu)] = np.inf
    live = np.isfinite(mu) & (mu > 0)
    m = mu[live]
    if m.size:
        z = NormalDist().inv_cdf(1 - delta)
        lo, hi = np.zeros_like(m), m * z + m * m / 2
        for _ in range(iters):
            mid = (lo + hi) / 2
            above = gdp_delta(mid, m) > delta  # still more than delta: eps is larger
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        e = (lo + hi) / 2
        e[gdp_delta(np.zeros_like(m), m) <= delta] = 0.0
        out[live] = e
    return out


def _mu(mean_u: np.ndarray, var_u: np.ndarray, n_u: int, mean_r: np.ndarray, var_r: np.ndarray, n_r: int
        ) -> np.ndarray:
    """|mean difference| / pooled sd (ddof 1 variances); 0 when both are 0, inf for a difference over sd 0."""
    pooled = np.sqrt(np.maximum(((n_u - 1) * var_u + (n_r - 1) * var_r) / (n_u + n_r - 2), 0.0))
    diff = np.abs(mean_u - mean_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pooled > 0, diff / np.where(pooled > 0, pooled, 1.0), np.where(diff > 0, np.inf, 0.0))


def gaussian_mu(u: Any, r: Any) -> np.ndarray:
    """Per row: mu = |mean(U) - mean(R)| / pooled sd, float64 [n]."""
    U, R = _samples(u, r)
    return _mu(U.mean(0), U.var(0, ddof=1), U.shape[0], R.mean(0), R.var(0, ddof=1), R.shape[0])


def _bootstrap_mu(U: np.ndarray, R: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """mu of `n_boot` bootstrap resamples of the models of each side: [n_boot, n]. A resample is a multinomial
    weight per model, so its means are weights @ values ([B, N] x [N, n]); values are centered per row first
    (the variance as E[x^2] - E[x]^2 stays exact in float64)."""
    rng = np.random.default_rng(seed)
    centre = np.concatenate([U, R]).mean(0)
    U, R = U - centre, R - centre

    def moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        N = X.shape[0]
        W = rng.multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(np.float64)  # [B, N]
        mean = W @ X / N
        var = np.maximum(W @ (X * X) / N - mean * mean, 0.0) * N / (N - 1)
        return mean, var

    mu_, vu = moments(U)
    mr, vr = moments(R)
    return _mu(mu_, vu, U.shape[0], mr, vr, R.shape[0])


def gaussian_epsilon(u: Any, r: Any, delta: float, confidence: float = 0.95, *, n_bootstrap: int = 200,
                     seed: int = 0) -> RowEpsilon:
    """The Gaussian-fit estimator per row (module docstring): eps(delta) of the mu-GDP curve at the fitted mu,
    and at the (1 - confidence) and `confidence` percentiles of mu over `n_bootstrap` resamples of the
    references (raised to 2 / (1 - confidence) so the percentile is resolved)."""
    _check_delta(delta)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: expected 0 < confidence < 1")
    U, R = _samples(u, r)
    point = gdp_epsilon(gaussian_mu(U, R), delta)
    n_boot = max(int(n_bootstrap), math.ceil(2 / (1 - confidence)))
    boot = _bootstrap_mu(U, R, n_boot, seed)
    mu_lo = _quantile(boot, 1 - confidence, axis=0)
    mu_hi = _quantile(boot, confidence, axis=0)
    return RowEpsilon(point, gdp_epsilon(mu_lo, delta), gdp_epsilon(mu_hi, delta))


BIG = 1e300  # stands for inf inside a quantile (linear interpolation between two infs is inf - inf = NaN)


def _quantile(x: np.ndarray, q: float, axis=None) -> np.ndarray | float:
    """np.quantile (linear) that keeps infinite values infinite."""
    out = np.quantile(np.nan_to_num(x, posinf=BIG), q, axis=axis)
    return np.where(out >= BIG, np.inf, out) if isinstance(out, np.ndarray) else (np.inf if out >= BIG else out)


def row_epsilon(u: Any, r: Any, estimator: str, delta: float, confidence: float = 0.95, *,
                n_bootstrap: int = 200, seed: int = 0) -> RowEpsilon:
    """`threshold_epsilon` or `gaussian_epsilon` by name (`gate.epsilon.estimator`)."""
    if estimator == "threshold":
        return threshold_epsilon(u, r, delta, confidence)
    if estimator == "gaussian":
        return gaussian_epsilon(u, r, delta, confidence, n_bootstrap=n_bootstrap, seed=seed)
    raise ValueError(f"estimator {estimator!r} is not known; allowed: {list(ESTIMATORS)}")


# --- the batch ------------------------------------------------------------------------------------------------

def aggregate(eps: Any, quantile: float) -> dict[str, float]:
    """A batch's eps from its rows': {"mean", "quantile"} (the `quantile`-quantile, linear interpolation);
    NaN for no rows. An infinite row makes both infinite where it counts."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile = {quantile}: expected 0 < quantile <= 1 (e.g. 0.95)")
    e = as_f64(eps, "eps").ravel()
    if e.size == 0:
        return {"mean": math.nan, "quantile": math.nan}
    return {"mean": float(e.mean()), "quantile": float(_quantile(e, quantile))}


def epsilon_metrics(u: Any, r: Any, splits: Any, estimator: str, delta: float, quantile: float,
                    confidence: float = 0.95, *, n_bootstrap: int = 200, seed: int = 0
                    ) -> tuple[dict[str, float], RowEpsilon]:
    """The certificate's eps per split present: `epsilon/<split>` (the `quantile` of the rows' point
    estimates: the gated statistic), `epsilon_mean/<split>`, `epsilon_lower/<split>` and
    `epsilon_upper/<split>` (the same quantile of the rows' lower and upper bounds). -> (metrics, per row)."""
    U, R = _samples(u, r)
    labels = as_split_labels(splits, U.shape[1])
    rows = row_epsilon(U, R, estimator, delta, confidence, n_bootstrap=n_bootstrap, seed=seed)
    out: dict[str, float] = {}
    for s in dict.fromkeys(labels.tolist()):
        mask = labels == s
        point = aggregate(rows.point[mask], quantile)
        out[K.key("epsilon", s)], out[K.key("epsilon_mean", s)] = point["quantile"], point["mean"]
        out[K.key("epsilon_lower", s)] = aggregate(rows.lower[mask], quantile)["quantile"]
        out[K.key("epsilon_upper", s)] = aggregate(rows.upper[mask], quantile)["quantile"]
    return out, rows
