"""Accuracy per split (forget, adjacent, remote, validation, ...) of a single model or an ensemble."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_f64, as_labels, as_split_labels, require_finite
from .summary import splits_present


def _correct(logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Correctness [N, n] (N = 1 for [n, C] input) of argmax predictions (ties -> lowest class index)."""
    z = as_f64(logits, "logits")
    if z.ndim == 2:
        z = z[None]
    if z.ndim != 3:
        raise ValueError(f"logits: expected shape [n, C] or [N, n, C], got {list(z.shape)}")
    require_finite(z, "logits")
    y = as_labels(labels, z.shape[1], z.shape[2])
    return z.argmax(axis=-1) == y[None, :], y


def accuracy_by_split_per_member(logits: Any, labels: Any, split_labels: Any) -> dict[str, np.ndarray]:
    """For each split present: accuracy of each member, float64 [N] (N = 1 for [n, C] logits)."""
    correct, y = _correct(logits, labels)
    splits = as_split_labels(split_labels, y.shape[0])
    return {s: correct[:, splits == s].mean(axis=1) for s in splits_present(splits)}


def accuracy_by_split(logits: Any, labels: Any, split_labels: Any) -> dict[str, float]:
    """For each split present: accuracy averaged over members (and samples of the split).

    logits: [n, C] or [N, n, C] (numpy or torch); labels: [n]; split_labels: [n] split names.
    """
    return {s: float(a.mean()) for s, a in accuracy_by_split_per_member(logits, labels, split_labels).items()}
