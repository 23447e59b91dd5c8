"""Oracle coverage: does the production model behave like a sample from the oracle distribution?"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_f64, as_model_by_sample, require_finite


def oracle_coverage(production_margins: Any, oracle_margins: Any, level: float = 0.95) -> float:
    """Share of samples whose production margin lies inside the oracles' central `level` interval.

    The interval per sample is [quantile((1 - level) / 2), quantile((1 + level) / 2)] of the N oracle
    margins (numpy's default linear quantile), bounds included; for level = 0.95: 2.5% and 97.5%.
    production_margins: [n]; oracle_margins: [N, n]. A model drawn from the oracle distribution covers
    about `level` of the samples (less with few oracles, whose empirical interval is narrower).
    """
    x = as_f64(production_margins, "production_margins")
    if x.ndim != 1:
        raise ValueError(f"production_margins: expected shape [n], got {list(x.shape)}")
    require_finite(x, "production_margins")
    o = as_model_by_sample(oracle_margins, "oracle_margins")
    if o.shape[1] != x.shape[0]:
        raise ValueError(f"production_margins has {x.shape[0]} samples but oracle_margins has {o.shape[1]}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level: expected 0 < level < 1, got {level}")
    if x.shape[0] == 0:
        raise ValueError("production_margins: no samples")
    # Rounded so that level=0.95 gives exactly the 2.5% / 97.5% quantiles ((1 - 0.95) / 2 is 0.025000000000000022).
    tail = round((1.0 - level) / 2.0, 12)
    lo, hi = np.quantile(o, [tail, 1.0 - tail], axis=0)
    return float(np.mean((x >= lo) & (x <= hi)))
