"""Membership-inference metrics: a population loss-threshold attack and the per-example epsilon of the
NeurIPS 2023 Machine Unlearning challenge.

Per-example epsilon follows DeepMind's scorer for that challenge (`unlearning_metric.py`: functions
`compute_logit_scaled_confidence`, `_get_single_threshold_rates`, `_get_double_threshold_rates`,
`_get_epsilons`, `compute_forget_score_from_confs`; DELTA = 1e-5, EPSILON_CAP = 50,
NUM_THRESHOLDS_PER_UNIT = 100), read from a public copy (UCR-Vision-and-Learning-Group/
certified-unlearning-surr-data, src/unlearning_metric.py, whose commented-out `_get_epsilons` is the
original). For one forget example, the confidences of the unlearned models and of the oracle (retrained)
models are two samples, and:

* "peaky" rule: if one side's range is below 1% of the other's (e.g. every unlearned model gives the same
  output), epsilon = cap;
* single-threshold rule: positive = the side with the larger median (oracle iff strictly larger); predict
  positive iff s >= t, for t = linspace(min, max, ceil((max - min) * 100)) over both sides;
* double-threshold rule: positive = the peakier side (smaller range; when the single rule's positive side
  has range >= the other's, the other side), w = its range; predict positive iff l <= s <= r for
  r = linspace(pmin + w - 2, pmax + 2, ceil((pmax + 2 - (pmin + w - 2)) * 100)) and, for each r,
  l = linspace(r - w - 2, r - w + 2, 400) (pmin/pmax: min/max of the positive side);
* per threshold: FPR, FNR as fractions of each side's models (the sides may hold different counts);
  FPR = FNR = 0 -> inf (perfect separation); exactly one of them 0 -> threshold discarded; otherwise
  max(log(1 - delta - FPR) - log(FNR), log(1 - delta - FNR) - log(FPR)) skipping undefined terms
  (1 - delta - x <= 0), floored at 0; a threshold with both terms undefined is discarded;
* epsilon = max over kept thresholds, clipped to [0, cap].

Differences from the official code: rates are exact float64 fractions (the official code averages float32
indicators) and counts come from binary search on sorted values instead of a [models x thresholds] mask
(same numbers, O(T log N) instead of O(T N)); when no threshold is kept (both sides constant and equal) the
official code fails an assertion, we return 0 (indistinguishable).

Note: the estimator reads the tails of N samples, so even two samples from one distribution give epsilon
around 1-2 for N = 50..300; compare a method with the oracle-vs-oracle value, not with 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._arrays import as_f64, as_model_by_sample, require_finite

DELTA = 1e-5
EPSILON_CAP = 50.0
PEAKY_RATIO = 0.01
THRESHOLDS_PER_UNIT = 100
BUFFER = 2.0
MAX_SPREAD = 1e4


def loss_threshold_auc(forget_losses: Any, validation_losses: Any) -> float:
    """AUC of the population loss-threshold membership attack: "member iff loss < tau", swept over tau.

    Positives = forget samples (were members of the original training set), negatives = validation
    samples (never members). AUC = P(loss_forget < loss_validation) + 0.5 P(equal), computed exactly as the
    normalized Mann-Whitney U statistic with average ranks for ties. 0.5: losses carry no membership signal;
    compare with the retrained oracle's value, which need not be 0.5. Inputs of any shape are pooled (raveled).
    """
    f = as_f64(forget_losses, "forget_losses").ravel()
    v = as_f64(validation_losses, "validation_losses").ravel()
    if f.size == 0 or v.size == 0:
        raise ValueError(f"loss_threshold_auc: needs both sets non-empty, got {f.size} forget, {v.size} validation")
    require_finite(f, "forget_losses")
    require_finite(v, "validation_losses")
    both = np.concatenate([f, v])
    uniq, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    # Average rank (1-based) of each distinct value: ranks before it + (count + 1) / 2.
    avg_rank = np.cumsum(counts) - counts + (counts + 1) / 2.0
    ranks = avg_rank[inverse]
    n_f, n_v = f.size, v.size
    # U of the validation losses = #(v > f) + 0.5 #(v == f): pairs where the forget loss is the lower one.
    u_v = ranks[n_f:].sum() - n_v * (n_v + 1) / 2.0
    return float(u_v / (n_f * n_v))


def _threshold_epsilons(tp: np.ndarray, fp: np.ndarray, n_pos: int | np.ndarray, n_neg: int | np.ndarray,
                        delta: float) -> np.ndarray:
    """Epsilon of each threshold from counts of predicted positives among positives (tp) and negatives (fp).

    Returns float64 of tp's shape: inf for perfect separation, nan for discarded thresholds.
    """
    fnr = (n_pos - tp) / n_pos
    fpr = fp / n_neg
    fn_zero = tp == n_pos
    fp_zero = fp == 0
    a = 1.0 - delta - fpr
    b = 1.0 - delta - fnr
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.where((a > 0) & ~fn_zero, np.log(np.where(a > 0, a, 1.0)) - np.log(np.where(fn_zero, 1.0, fnr)), np.nan)
        e2 = np.where((b > 0) & ~fp_zero, np.log(np.where(b > 0, b, 1.0)) - np.log(np.where(fp_zero, 1.0, fpr)), np.nan)
    eps = np.fmax(e1, e2)  # nan only where both are undefined
    eps = np.where(np.isnan(eps), np.nan, np.maximum(eps, 0.0))
    eps = np.where(fn_zero ^ fp_zero, np.nan, eps)  # exactly one rate is 0: discarded
    return np.where(fn_zero & fp_zero, np.inf, eps)


def _count_ge(sorted_x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Number of values >= t (sorted_x ascending)."""
    return sorted_x.size - np.searchsorted(sorted_x, t, side="left")


def _count_between(sorted_x: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Number of values c with left <= c <= right (0 when left > right)."""
    n_in = np.searchsorted(sorted_x, right, side="right") - np.searchsorted(sorted_x, left, side="left")
    return np.maximum(n_in, 0)


def _epsilon_table(n_pos: int, n_neg: int, delta: float) -> np.ndarray:
    """Epsilon of every possible threshold outcome: [n_pos + 1, n_neg + 1], indexed by (tp, fp) counts."""
    tp, fp = np.meshgrid(np.arange(n_pos + 1), np.arange(n_neg + 1), indexing="ij")
    return _threshold_epsilons(tp, fp, n_pos, n_neg, delta)


def _epsilon_one(u: np.ndarray, o: np.ndarray, delta: float, cap: float, peaky_ratio: float | None,
                 tables: dict[tuple[int, int], np.ndarray]) -> float:
    """Official epsilon of one example: u [N_u], o [N_o] confidences (see module docstring).

    Each threshold only matters through its counts (tp, fp), so we mark the outcomes the thresholds reach
    and take the max of the precomputed per-outcome epsilons (same numbers as evaluating every threshold).
    """
    range_u, range_o = float(np.ptp(u)), float(np.ptp(o))
    largest, smallest = max(range_u, range_o), min(range_u, range_o)
    if peaky_ratio is not None and largest > 0 and smallest < peaky_ratio * largest:
        return cap
    oracle_pos = float(np.median(o)) > float(np.median(u))
    pos, neg = (np.sort(o), np.sort(u)) if oracle_pos else (np.sort(u), np.sort(o))

    # Single-threshold rule: predict positive iff s >= t.
    lo, hi = min(pos[0], neg[0]), max(pos[-1], neg[-1])
    t = np.linspace(lo, hi, int(np.ceil((hi - lo) * THRESHOLDS_PER_UNIT)))
    reached_single = (_count_ge(pos, t), _count_ge(neg, t))

    # Double-threshold rule: predict the peakier side iff l <= s <= r.
    pos2, neg2 = (neg, pos) if np.ptp(pos) >= np.ptp(neg) else (pos, neg)
    width = smallest
    r_min, r_max = pos2[0] + width - BUFFER, pos2[-1] + BUFFER
    right = np.linspace(r_min, r_max, int(np.ceil((r_max - r_min) * THRESHOLDS_PER_UNIT)))  # [R]
    n_left = int(np.ceil(2 * BUFFER * THRESHOLDS_PER_UNIT))
    left = np.linspace(right - width - BUFFER, right - width + BUFFER, n_left, axis=1)  # [R, L]
    right = np.broadcast_to(right[:, None], left.shape)
    reached_double = (_count_between(pos2, left, right), _count_between(neg2, left, right))

    kept = []
    for (tp, fp), n_pos, n_neg in ((reached_single, pos.size, neg.size), (reached_double, pos2.size, neg2.size)):
        key = (n_pos, n_neg)
        if key not in tables:
            tables[key] = _epsilon_table(n_pos, n_neg, delta)
        reached = np.zeros((n_pos + 1) * (n_neg + 1), dtype=bool)
        reached[(tp * (n_neg + 1) + fp).ravel()] = True
        eps = tables[key].ravel()[reached]
        kept.append(eps[~np.isnan(eps)])
    all_kept = np.concatenate(kept)
    if all_kept.size == 0:
        return 0.0  # no informative threshold: the two samples are indistinguishable
    return float(np.clip(all_kept.max(), 0.0, cap))


def per_example_epsilon(
    unlearned_conf: Any,
    oracle_conf: Any,
    delta: float = DELTA,
    cap: float = EPSILON_CAP,
    *,
    peaky_ratio: float | None = PEAKY_RATIO,
) -> np.ndarray:
    """Per-example epsilon of the NeurIPS 2023 unlearning challenge (see module docstring). float64 [n].

    unlearned_conf: [N_u, n] logit-scaled confidences (`logit_scaled_confidence`) of the shadow-unlearned
    models on the n forget examples; oracle_conf: [N_o, n] the same for the oracles. Lower is better;
    0 = no attack of the two families tells them apart, cap = perfectly separated.
    peaky_ratio=None disables the official "peaky" cap rule. Cost: about 160k thresholds per example
    (binary searches, a few ms), looped over examples.
    """
    u = as_model_by_sample(unlearned_conf, "unlearned_conf")
    o = as_model_by_sample(oracle_conf, "oracle_conf")
    if u.shape[1] != o.shape[1]:
        raise ValueError(f"unlearned_conf has {u.shape[1]} examples but oracle_conf has {o.shape[1]}")
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta: expected 0 <= delta < 1, got {delta}")
    if not cap > 0:
        raise ValueError(f"cap: expected > 0, got {cap}")
    spread = max(u.max(), o.max()) - min(u.min(), o.min()) if u.size else 0.0
    if spread > MAX_SPREAD:
        # 100 thresholds per unit: a spread of 1e4 already means 1e6 single thresholds per example.
        raise ValueError(
            f"unlearned_conf/oracle_conf: confidences span {spread:.3g} units (> {MAX_SPREAD:g}); the official "
            "scorer saturates at about +-103.6 (log 1e-45), clip them to that range first"
        )
    tables: dict[tuple[int, int], np.ndarray] = {}  # per (n_pos, n_neg): epsilon of each (tp, fp) outcome
    return np.array([_epsilon_one(u[:, i], o[:, i], delta, cap, peaky_ratio, tables) for i in range(u.shape[1])])


def forget_quality_score(epsilons: Any, n_models: int) -> float:
    """Aggregate per-example epsilons into the challenge's forgetting score (`compute_forget_score_from_confs`).

    Buckets of width 0.5 starting at 0 are worth 1, 1/2, 1/4, ... points; there are 2 * ceil(log(n_models - 1))
    of them (the scorer's bound on a measurable epsilon with n_models samples); an epsilon beyond the last
    bucket scores 0. Returns the mean points over examples, in [0, 1] (1 = every epsilon below 0.5).
    n_models = number of unlearned models, as in the official code.
    """
    eps = as_f64(epsilons, "epsilons").ravel()
    if eps.size == 0:
        raise ValueError("epsilons: empty")
    if n_models < 3:
        raise ValueError(f"n_models: the score needs at least 3 models, got {n_models}")
    if np.any(np.isnan(eps)) or np.any(eps < 0):
        raise ValueError("epsilons: expected non-negative, non-nan values")
    n_buckets = int(2 * math.ceil(math.log(n_models - 1)))
    k = np.floor(eps / 0.5)
    points = np.where(k < n_buckets, 0.5 ** np.minimum(k, n_buckets), 0.0)
    return float(points.mean())
