"""Partition of the retain set into adjacent (entangled with the forget set) and remote (docs/design.md §4.4).

Modes: `group` (a retain sample is adjacent when it shares a declared group with any forget sample),
`leverage` (top fraction of retain samples by cross-leverage row norm), `embedding` (the k nearest
retain neighbours of each forget sample in the model's penultimate features). Every mode returns the
validated table `sample_id, subset, score`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
import torch

PARTITION_SCHEMA = pa.DataFrameSchema(
    {
        "sample_id": pa.Column(str, unique=True),
        "subset": pa.Column(str, pa.Check.isin(["adjacent", "remote"])),
        "score": pa.Column(float, nullable=False),
    },
    strict=True, coerce=True, name="partition",
)


def _table(sample_ids, adjacent: np.ndarray, score: np.ndarray) -> pd.DataFrame:
    return PARTITION_SCHEMA.validate(pd.DataFrame({
        "sample_id": np.asarray(sample_ids, dtype=str), "subset": np.where(adjacent, "adjacent", "remote"),
        "score": np.asarray(score, dtype=float)}))


def _declared_groups(groups) -> np.ndarray:
    """Groups as text, a missing group (None, NaN, empty) as None: "no group" is no group that two samples
    could share (as text, None and NaN would each become a group of their own, "None" and "nan")."""
    return np.array([None if g is None or (isinstance(g, float) and np.isnan(g)) or str(g) == "" else str(g)
                     for g in np.asarray(groups, dtype=object).ravel()], dtype=object)


def partition_by_group(retain_ids, retain_groups, forget_groups) -> pd.DataFrame:
    """score = 1 for a retain sample whose group holds a forget sample, else 0. A sample without a group is
    adjacent to nothing."""
    retain, forget = _declared_groups(retain_groups), _declared_groups(forget_groups)
    shared = {g for g in forget if g is not None}
    adjacent = np.array([g is not None and g in shared for g in retain], dtype=bool)
    return _table(retain_ids, adjacent, adjacent.astype(float))


def partition_by_score(retain_ids, score, top_fraction: float) -> pd.DataFrame:
    """The top `top_fraction` of retain samples by `score` (e.g. cross-leverage row norm) are adjacent."""
    score = np.asarray(score, dtype=float)
    # round first: 0.07 * 100 is 7.000000000000001 in floating point, and its ceiling would mark 8
    k = int(np.ceil(round(top_fraction * len(score), 9)))
    adjacent = np.zeros(len(score), dtype=bool)
    adjacent[np.argsort(-score, kind="stable")[:k]] = True
    return _table(retain_ids, adjacent, score)


def knn_scores(retain_features: torch.Tensor, forget_features: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Embedding mode. retain_features [nR, h], forget_features [nF, h].

    Returns (adjacent mask [nR]: among the k nearest retain neighbours of some forget sample,
    score [nR]: negative distance to the nearest forget sample, so higher = closer). No forget sample:
    nothing is adjacent, every score -inf."""
    if forget_features.shape[0] == 0:
        return np.zeros(retain_features.shape[0], dtype=bool), np.full(retain_features.shape[0], -np.inf)
    d = torch.cdist(forget_features.double(), retain_features.double())  # [nF, nR]
    k = min(k, d.shape[1])
    nearest = d.topk(k, dim=1, largest=False).indices  # [nF, k]
    adjacent = torch.zeros(d.shape[1], dtype=torch.bool)
    adjacent[nearest.reshape(-1)] = True
    return adjacent.numpy(), (-d.min(0).values).numpy()


def partition_by_embedding(retain_ids, retain_features, forget_features, k: int) -> pd.DataFrame:
    adjacent, score = knn_scores(retain_features, forget_features, k)
    return _table(retain_ids, adjacent, score)


def subset_sizes(table: pd.DataFrame) -> dict[str, int]:
    counts = table["subset"].value_counts()
    return {"adjacent": int(counts.get("adjacent", 0)), "remote": int(counts.get("remote", 0))}
