"""What every data source returns and shares: the `Dataset`, its errors, and the seeded split and subsample
helpers. A module of its own so that the registry (registry.py) and the sources of your own data (sources.py)
both import it and neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Dataset:
    """Features flattened to [n, d] float32 (images in [0, 1], tables standardized); `label` is the training
    target, `fine_label` the original class index; `group` the declared super-class or attribute.
    `in_shape` is the shape of one sample before flattening ([C, H, W] for images, [d] for tables);
    `image_shape` ([H, W], None for tables) is kept for older readers."""

    name: str
    X: np.ndarray
    label: np.ndarray
    fine_label: np.ndarray
    sample_id: np.ndarray
    split: np.ndarray
    group: np.ndarray
    class_names: list[str]
    fine_class_names: list[str]
    image_shape: tuple[int, int] | None
    meta: dict = field(default_factory=dict)
    in_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.in_shape is None:
            self.in_shape = (1, *self.image_shape) if self.image_shape else (int(self.X.shape[1]),)
        self.in_shape = tuple(int(s) for s in self.in_shape)
        if int(np.prod(self.in_shape)) != self.X.shape[1]:
            raise ValueError(f"{self.name}: in_shape {list(self.in_shape)} does not match {self.X.shape[1]} features")

    @property
    def n_classes(self) -> int:
        return len(self.class_names)


class DatasetMissing(FileNotFoundError):
    pass


class DataError(ValueError):
    """A problem with the team's data or its `prepare.*` settings, found while reading it (missing values,
    duplicate ids, an unknown column, an unreadable image, ...): bad input, reported in one line that names
    the field, the value and the fix (exit code 2)."""


def _subsample(idx: np.ndarray, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    if limit is None or limit >= len(idx):
        return idx
    return np.sort(rng.choice(idx, size=limit, replace=False))


def stratified_split(y: np.ndarray, val_fraction: float, rng: np.random.Generator,
                     ids: np.ndarray | None = None) -> np.ndarray:
    """'train'/'val' per row: the same share of every class goes to val. With `ids`, each class's members
    are ordered by id before the seeded shuffle, so the split does not depend on the row order of the source."""
    split = np.full(len(y), "train", dtype=object)
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        if ids is not None:
            members = members[np.argsort(ids[members], kind="stable")]
        members = rng.permutation(members)
        split[members[: int(round(val_fraction * len(members)))]] = "val"
    return split


def subsample_splits(split: np.ndarray, max_train, max_val, rng: np.random.Generator) -> np.ndarray:
    """Sorted row positions kept after the deterministic `max_train` / `max_val` subsample."""
    return np.sort(np.concatenate([_subsample(np.flatnonzero(split == "train"), max_train, rng),
                                   _subsample(np.flatnonzero(split == "val"), max_val, rng)]))
