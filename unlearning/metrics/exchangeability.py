"""Is one model exchangeable with an ensemble trained by the declared recipe? (the recipe check)

The gate's KLoM test (docs/design.md §4.2) compares *shadow originals* unlearned by a method with oracles; both are
trained by the declared recipe. It certifies the production model only insofar as that model is itself a
draw from the recipe's distribution: true for an original the pipeline trained, an assumption for a team's
own checkpoint (`train.init_checkpoint`) that nothing else tests.

The test: pool the production model with the N shadows (M = N + 1 models, margins [M, n] on the same rows).
Score every model the same way, T_j = mean_i z_ji^2 with z_ji = (m_ji - mean_k m_ki) / std_k m_ki (mean and
std over the pool, rows where every model agrees left out): how far a model sits from the pool, each row in
units of its own spread. T is a symmetric function of the pool applied to each member, so when the production
model is exchangeable with the shadows its rank among the M scores is uniform on 1..M, and
p = #{j : T_j >= T_production} / M is an exact (conservative under ties) p-value: P(p <= k / M) <= k / M.
The smallest p is 1 / M: with 80 shadows a model the recipe trained lands beyond every shadow 1 time in 81.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_model_by_sample, require_finite


def pool_scores(pool_margins: Any) -> np.ndarray:
    """T_j for each model of the pool: [M, n] margins -> [M] mean squared z-score (float64)."""
    m = as_model_by_sample(pool_margins, "pool_margins")
    require_finite(m, "pool_margins")
    if m.shape[0] < 2:
        raise ValueError(f"pool_margins: need at least 2 models, got {m.shape[0]}")
    sd = m.std(axis=0)
    spread = sd > 0
    if not spread.any():  # every model gives every row the same margin: nothing tells them apart
        return np.zeros(m.shape[0])
    z = (m[:, spread] - m[:, spread].mean(axis=0)) / sd[spread]
    return np.mean(z * z, axis=1)


def exchangeability_test(model_margins: Any, reference_margins: Any) -> dict[str, float]:
    """The recipe check of one model against N reference models trained by the declared recipe.

    model_margins: [n]; reference_margins: [N, n] (same rows). Returns {"pvalue", "rank", "n_pool",
    "statistic", "reference_median"}: rank 1 = closest to the pool, n_pool = farthest (p = 1 / n_pool)."""
    x = np.asarray(model_margins, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"model_margins: expected shape [n], got {list(x.shape)}")
    ref = as_model_by_sample(reference_margins, "reference_margins")
    if ref.shape[1] != x.shape[0]:
        raise ValueError(f"model_margins has {x.shape[0]} rows but reference_margins has {ref.shape[1]}")
    if x.shape[0] == 0:
        raise ValueError("model_margins: no rows")
    scores = pool_scores(np.vstack([x[None, :], ref]))
    t = scores[0]
    n_pool = scores.shape[0]
    at_least = int(np.count_nonzero(scores >= t))  # the model itself included
    return {"pvalue": at_least / n_pool, "rank": float(n_pool - at_least + 1), "n_pool": float(n_pool),
            "statistic": float(t), "reference_median": float(np.median(scores[1:]))}
