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
  inverted by bisection. Bounds: a bootstrap of mu over the references (both samples resampled, one resample of
  the models for every row), each end mapped through the same curve (eps is increasing in mu): the percentile
  upper bound, and the bias-corrected (basic) lower bound, valid at N = 16 where the percentile one is not.

A batch aggregates its rows' eps (`batch_epsilon`, gate.epsilon.aggregate) by a high quantile of the rows' values
and bounds (a batch is only as private as its worst rows), or by their capped mean, bounded by the joint bootstrap
over the models (the average row). Confidence is one-sided for each bound. The max over thresholds of per-threshold bounds is not a
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

from unlearning.stats import clopper_pearson

from ._arrays import as_f64, as_split_labels, require_finite

ESTIMATORS = ("threshold", "gaussian")


@dataclass(frozen=True)
class RowEpsilon:
    """Per-row eps: the point estimate and its one-sided lower and upper bounds, float64 [n] each. `boot_mu`
    [B, n]: the Gaussian estimator's bootstrap of mu, one resample of the models shared by every row (what a
    batch aggregate is bootstrapped from, `batch_epsilon`); None for the threshold estimator."""

    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    boot_mu: np.ndarray | None = None


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

def clopper_pearson_bounds(n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds (unlearning/stats.py clopper_pearson) of a proportion seen k times in n,
    for every k = 0..n: lower[k] with P(X >= k | lower) = 1 - confidence (0 at k = 0), upper[k] with
    P(X <= k | upper) = 1 - confidence (1 at k = n). float64 [n + 1] each."""
    if n < 1:
        raise ValueError(f"n = {n}: a proportion needs at least one trial")
    return clopper_pearson(np.arange(n + 1), n, confidence, two_sided=False)


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
    with one-sided bounds at `confidence` from `n_bootstrap` resamples of the references (raised to
    2 / (1 - confidence) so the percentile is resolved), each mapped through the same curve:
    - upper: the `confidence` percentile of the bootstrap mu;
    - lower: the basic (bias-corrected) bootstrap bound 2 mu - q_confidence(mu*), floored at 0. |mean difference|
      / sd is biased upward, most at small N, and the bootstrap sees that bias once more on top of the data's:
      reflecting the upper percentile about the estimate removes it (Efron and Tibshirani 1993, §13.4; Davison
      and Hinkley 1997, §5.2). The plain percentile lower bound fails on 1.3-4 % of rows at N = 16 for a nominal
      0.25 % (docs/certificate.md, "Bounds at every look")."""
    _check_delta(delta)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: expected 0 < confidence < 1")
    U, R = _samples(u, r)
    mu = gaussian_mu(U, R)
    n_boot = max(int(n_bootstrap), math.ceil(2 / (1 - confidence)))
    boot = _bootstrap_mu(U, R, n_boot, seed)
    mu_hi = _quantile(boot, confidence, axis=0)
    return RowEpsilon(gdp_epsilon(mu, delta), gdp_epsilon(reflected_lower(mu, mu_hi), delta),
                      gdp_epsilon(mu_hi, delta), boot)


def reflected_lower(estimate: Any, upper_percentile: Any) -> np.ndarray:
    """The basic bootstrap's lower bound: 2 x estimate - the bootstrap's upper percentile, floored at 0 (a
    statistic >= 0). An infinite estimate stays infinite; a finite one under an infinite percentile is 0."""
    t = np.asarray(estimate, np.float64)
    q = np.asarray(upper_percentile, np.float64)
    with np.errstate(invalid="ignore"):
        low = np.where(np.isinf(t), np.inf, 2 * t - np.where(np.isinf(q), np.inf, q))
    return np.maximum(np.nan_to_num(low, nan=0.0, posinf=np.inf, neginf=0.0), 0.0)


MU_GRID = (20.0, 20_001)  # eps(mu) tabulated on [0, 20] every 0.001 (`epsilon_of_mu`)


@lru_cache(maxsize=8)
def _gdp_table(delta: float) -> tuple[np.ndarray, np.ndarray]:
    grid = np.linspace(0.0, MU_GRID[0], MU_GRID[1])
    return grid, gdp_epsilon(grid, delta)


def epsilon_of_mu(mu: Any, delta: float) -> np.ndarray:
    """`gdp_epsilon` of any array of mu, for the B x n values a batch bootstrap maps: linear interpolation of the
    exact curve tabulated every 0.001 up to mu = 20 (error below 1e-6: the curve is smooth), exact beyond."""
    m = np.asarray(mu, np.float64)
    grid, table = _gdp_table(float(delta))
    out = np.interp(m, grid, table)
    far = m > grid[-1]
    if far.any():
        out[far] = gdp_epsilon(m[far], delta)
    return out


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

AGGREGATES = ("quantile", "mean")


@dataclass(frozen=True)
class BatchEpsilon:
    """One split's epsilon (docs/certificate.md, "Two aggregates"): `point`, the gated statistic's estimate; `mean`,
    the rows' mean point estimate (logged beside it); `lower` and `upper`, its one-sided bounds."""

    point: float
    mean: float
    lower: float
    upper: float


def aggregate(eps: Any, quantile: float) -> dict[str, float]:
    """A batch's eps from its rows': {"mean", "quantile"} (the `quantile`-quantile, linear interpolation);
    NaN for no rows. An infinite row makes both infinite where it counts."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile = {quantile}: expected 0 < quantile <= 1 (e.g. 0.95)")
    e = as_f64(eps, "eps").ravel()
    if e.size == 0:
        return {"mean": math.nan, "quantile": math.nan}
    return {"mean": float(e.mean()), "quantile": float(_quantile(e, quantile))}


def batch_epsilon(rows: RowEpsilon, how: str, quantile: float, confidence: float, delta: float,
                  row_cap: float = math.inf) -> BatchEpsilon:
    """The batch statistic of `rows` and its bounds at one-sided `confidence`:
    - `quantile`: the `quantile` over the rows of their point estimates, and the same quantile of their lower and
      upper bounds (every row but 1 - quantile of them within the budget);
    - `mean`: the mean over the rows of min(point, row_cap) (one row moves it by at most row_cap / n), bounded by
      the joint bootstrap over the models (rows.boot_mu: one resample of the models for every row at once, so the
      rows' dependence through the shared models is kept): upper = the `confidence` percentile of the resampled
      means, lower = the basic bound 2 x mean - that percentile (bias-corrected, as the rows' own). Gaussian
      estimator only."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate {how!r} is not known; allowed: {list(AGGREGATES)}")
    q = aggregate(rows.point, quantile)
    if how == "quantile":
        return BatchEpsilon(q["quantile"], q["mean"], aggregate(rows.lower, quantile)["quantile"],
                            aggregate(rows.upper, quantile)["quantile"])
    if rows.boot_mu is None:
        raise ValueError("aggregate 'mean' needs the joint bootstrap of the gaussian estimator; the threshold "
                         "estimator has none (set gate.epsilon.estimator: gaussian, or aggregate: quantile)")
    if rows.point.size == 0:
        return BatchEpsilon(math.nan, math.nan, math.nan, math.nan)
    mean = float(np.minimum(rows.point, row_cap).mean())
    resampled = np.minimum(epsilon_of_mu(rows.boot_mu, delta), row_cap).mean(axis=1)  # [B]
    upper = float(_quantile(resampled, confidence))
    return BatchEpsilon(mean, q["mean"], float(reflected_lower(mean, upper)), upper)


def epsilon_metrics(u: Any, r: Any, splits: Any, estimator: str, delta: float, quantile: float,
                    confidence: float = 0.95, *, n_bootstrap: int = 200, seed: int = 0, how: str = "quantile",
                    row_cap: float = math.inf) -> tuple[dict[str, BatchEpsilon], RowEpsilon]:
    """The certificate's eps per split present (`batch_epsilon` of the split's rows, aggregated `how`).
    -> ({split: BatchEpsilon}, per row)."""
    U, R = _samples(u, r)
    labels = as_split_labels(splits, U.shape[1])
    rows = row_epsilon(U, R, estimator, delta, confidence, n_bootstrap=n_bootstrap, seed=seed)
    out: dict[str, BatchEpsilon] = {}
    for s in dict.fromkeys(labels.tolist()):
        mask = labels == s
        part = RowEpsilon(rows.point[mask], rows.lower[mask], rows.upper[mask],
                          None if rows.boot_mu is None else rows.boot_mu[:, mask])
        out[s] = batch_epsilon(part, how, quantile, confidence, delta, row_cap)
    return out, rows
