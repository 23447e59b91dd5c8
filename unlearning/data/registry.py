"""Dataset registry: every sample gets a stable id that never changes across dataset versions.

- `digits`: scikit-learn's 8x8 digits (ships with scikit-learn, 1,797 samples), seeded stratified
  train/val split; ids `digits-<index in load_digits>`.
- `fashion_mnist`: the IDX .gz files of the Debian package `dataset-fashion-mnist`; train split from the
  train files, val from the t10k files; ids `fmnist-train-<index>` / `fmnist-test-<index>`.
- `table` and `image_folder`: your own data (unlearning/data/sources.py); ids come from the data itself
  (the id column, the image's relative path), never from row positions.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

# The shared types live in dataset.py, which every source imports: sources.py imports them from there, not from
# this registry, so the registry's lazy imports of sources.py close no cycle.
from unlearning.data.dataset import (  # noqa: F401  (re-exported: callers import them from here)
    DataError, Dataset, DatasetMissing, _subsample, stratified_split, subsample_splits,
)

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
# Super-classes of Fashion-MNIST ("Machine Unlearning under Retain-Forget Entanglement" setting).
FASHION_GROUPS = {"tops": ["T-shirt/top", "Pullover", "Coat", "Shirt"], "bottoms": ["Trouser"],
                  "dresses": ["Dress"], "footwear": ["Sandal", "Sneaker", "Ankle boot"], "bags": ["Bag"]}


def digits_csv() -> Path | None:
    """scikit-learn's copy of the UCI digits (sklearn/datasets/data/digits.csv.gz), found without importing
    scikit-learn (`import sklearn.datasets` pulls in scipy: 2.5 s of a 3 s prepare stage)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits as `load_digits` returns them: X [1797, 64] float64 in 0..16, y [1797] int."""
    path = digits_csv()
    if path is None:  # another layout of scikit-learn: its own loader
        from sklearn.datasets import load_digits

        raw = load_digits()
        return raw.data, raw.target
    data = np.loadtxt(path, delimiter=",")  # the same call load_digits makes: 64 pixel columns, then the label
    return data[:, :-1], data[:, -1].astype(int)


def load_digits_dataset(seed: int = 0, val_fraction: float = 0.2, max_train=None, max_val=None,
                        targets: str = "fine", **_) -> Dataset:
    data, target = read_digits()
    X = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    rng = np.random.default_rng(seed)
    split = stratified_split(y, val_fraction, rng)
    keep = subsample_splits(split, max_train, max_val, rng)
    names = [f"digit_{c}" for c in range(10)]
    return Dataset(
        name="digits", X=X[keep], label=y[keep], fine_label=y[keep],
        sample_id=np.array([f"digits-{i:04d}" for i in keep], dtype=object), split=split[keep].astype(str),
        group=np.array([names[c] for c in y[keep]], dtype=object), class_names=names, fine_class_names=names,
        image_shape=(8, 8), in_shape=(1, 8, 8),
        meta={"source": {"type": "digits", "loader": "sklearn.datasets.load_digits"}})


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped): magic (0, 0, dtype, ndim), big-endian dims, then data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype_code != 0x08:
            raise DataError(f"{path}: not an unsigned-byte IDX file (magic {zero}, type {dtype_code:#x})")
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).exists():
            return folder / name
    raise DatasetMissing(
        f"prepare.fashion_mnist_dir = '{folder}': {stem}(.gz) not found. Install the Debian package "
        f"'dataset-fashion-mnist' (apt-get install -y dataset-fashion-mnist) or point prepare.fashion_mnist_dir "
        f"at a folder holding the IDX files.")


def load_fashion_mnist(fashion_mnist_dir: str = "/usr/share/datasets/fashion-mnist", seed: int = 0,
                       max_train=None, max_val=None, targets: str = "fine", **_) -> Dataset:
    folder = Path(fashion_mnist_dir)
    if not folder.is_dir():
        raise DatasetMissing(
            f"prepare.fashion_mnist_dir = '{folder}' does not exist. Install the Debian package "
            f"'dataset-fashion-mnist' (apt-get install -y dataset-fashion-mnist) or set the folder in params.yaml.")
    rng = np.random.default_rng(seed)
    parts = []
    for split, prefix, id_prefix, limit in (("train", "train", "fmnist-train", max_train),
                                            ("val", "t10k", "fmnist-test", max_val)):
        images = read_idx(_find_idx(folder, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find_idx(folder, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        keep = _subsample(np.arange(len(labels)), limit, rng)
        parts.append((images[keep].reshape(len(keep), -1).astype(np.float32) / 255.0, labels[keep],
                      np.array([f"{id_prefix}-{i:05d}" for i in keep], dtype=object), np.full(len(keep), split)))
    X = np.concatenate([p[0] for p in parts])
    fine = np.concatenate([p[1] for p in parts])
    group_names = list(FASHION_GROUPS)
    class_to_group = {FASHION_CLASSES.index(c): g for g, cs in FASHION_GROUPS.items() for c in cs}
    group = np.array([class_to_group[c] for c in fine], dtype=object)
    if targets == "super":
        label, class_names = np.array([group_names.index(g) for g in group], dtype=np.int64), group_names
    else:
        label, class_names = fine, FASHION_CLASSES
    return Dataset(
        name="fashion_mnist", X=X, label=label, fine_label=fine, sample_id=np.concatenate([p[2] for p in parts]),
        split=np.concatenate([p[3] for p in parts]).astype(str), group=group, class_names=list(class_names),
        fine_class_names=FASHION_CLASSES, image_shape=(28, 28), in_shape=(1, 28, 28),
        meta={"source": {"type": "fashion_mnist", "path": str(folder)}, "targets": targets})


def load_table(**kwargs) -> Dataset:
    from unlearning.data.sources import load_table as load  # lazy: pandas/pyarrow only when used

    return load(**kwargs)


def load_image_folder(**kwargs) -> Dataset:
    from unlearning.data.sources import load_image_folder as load  # lazy: Pillow only when used

    return load(**kwargs)


DATASETS = {"digits": load_digits_dataset, "fashion_mnist": load_fashion_mnist, "table": load_table,
            "image_folder": load_image_folder}


def load_dataset(name: str, **kwargs) -> Dataset:
    if name not in DATASETS:
        raise ValueError(f"prepare.dataset = {name!r} is not known; allowed: {sorted(DATASETS)}")
    return DATASETS[name](**kwargs)
