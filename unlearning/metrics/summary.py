"""Per-split summaries of per-sample metrics (docs/design.md §4.2: 95th percentile and mean for each split)."""

from __future__ import annotations

from typing import Any

import numpy as np

from unlearning.stats import SPLITS  # noqa: F401  (the canonical split names, in report order: defined once)

from ._arrays import as_f64, as_split_labels


def splits_present(split_labels: np.ndarray) -> list[str]:
    """Canonical splits present in `split_labels` (in SPLITS order), then any other labels, sorted."""
    present = set(np.unique(split_labels).tolist())
    ordered = [s for s in SPLITS if s in present]
    return ordered + sorted(present - set(SPLITS))


def split_summary(values: Any, split_labels: Any) -> dict[str, dict[str, float]]:
    """For each split present: {"p95", "mean", "n", "n_undefined"} of `values` [n] over its samples.

    `p95` is numpy's default (linear) 95th percentile. Undefined (nan) sample values are not dropped:
    they make that split's p95 and mean nan (fail closed: a comparison `p95 <= threshold` is then False),
    and `n_undefined` says how many there were.
    """
    v = as_f64(values, "values")
    if v.ndim != 1:
        raise ValueError(f"values: expected shape [n], got {list(v.shape)}")
    labels = as_split_labels(split_labels, v.shape[0])
    out: dict[str, dict[str, float]] = {}
    for split in splits_present(labels):
        vs = v[labels == split]
        out[split] = {
            "p95": float(np.percentile(vs, 95.0)),
            "mean": float(np.mean(vs)),
            "n": int(vs.size),
            "n_undefined": int(np.count_nonzero(np.isnan(vs))),
        }
    return out
