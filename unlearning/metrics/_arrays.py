"""Input coercion shared by the metrics: numpy or torch in, float64 / int64 numpy out, clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def as_f64(x: Any, name: str) -> np.ndarray:
    """Return `x` (numpy array, torch tensor or nested list) as a float64 numpy array (a copy for torch)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64).numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected a numeric array or tensor, got {type(x).__name__}") from err


def as_labels(labels: Any, n: int, n_classes: int | None = None, name: str = "labels") -> np.ndarray:
    """Class labels as int64 [n]; checks the length and, when n_classes is given, the range."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name}: expected shape [{n}], got {list(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{name}: expected integer class labels, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if n_classes is not None and arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        bad = arr[(arr < 0) | (arr >= n_classes)][0]
        raise ValueError(f"{name}: label {bad} outside [0, {n_classes})")
    return arr


def as_split_labels(split_labels: Any, n: int, name: str = "split_labels") -> np.ndarray:
    """Split names as a numpy array of str [n] (accepts lists, numpy arrays, pandas Series/Categorical)."""
    arr = np.asarray(split_labels).astype(str)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name}: expected shape [{n}], got {list(arr.shape)}")
    return arr


def require_finite(x: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(x)):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise ValueError(f"{name}: {bad} non-finite value(s) (nan or inf)")


def as_model_by_sample(x: Any, name: str) -> np.ndarray:
    """[n_models, n_samples] float64, at least one model, finite."""
    arr = as_f64(x, name)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected shape [n_models, n_samples], got {list(arr.shape)}")
    if arr.shape[0] < 1:
        raise ValueError(f"{name}: needs at least one model, got shape {list(arr.shape)}")
    require_finite(arr, name)
    return arr
