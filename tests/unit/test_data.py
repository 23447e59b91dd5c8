import gzip
import struct

import numpy as np
import pytest

from unlearning.data import DatasetMissing, load_dataset, manifest_of, write_prepared, load_prepared
from unlearning.data.registry import FASHION_GROUPS, read_idx


def test_digits_ids_are_stable_and_split_is_stratified():
    a = load_dataset("digits", seed=0)
    b = load_dataset("digits", seed=0)
    assert list(a.sample_id) == list(b.sample_id)
    assert len(set(a.sample_id)) == len(a.sample_id) == 1797
    assert a.sample_id[0] == "digits-0000"
    val_share = [(a.split[a.label == c] == "val").mean() for c in range(10)]
    assert np.allclose(val_share, 0.2, atol=0.02)
    # A different seed moves samples between splits but never renames a sample.
    c = load_dataset("digits", seed=1)
    assert sorted(c.sample_id) == sorted(a.sample_id)
    assert (c.split != a.split).any()


def test_subsample_keeps_original_ids():
    full = load_dataset("digits", seed=0)
    small = load_dataset("digits", seed=0, max_train=100, max_val=50)
    assert (small.split == "train").sum() == 100 and (small.split == "val").sum() == 50
    lookup = dict(zip(full.sample_id, full.label))
    assert all(lookup[s] == l for s, l in zip(small.sample_id, small.label))


def test_manifest_roundtrip(tmp_path):
    ds = load_dataset("digits", seed=0, max_train=200, max_val=40)
    info = write_prepared(ds, tmp_path)
    prep = load_prepared(tmp_path)
    assert info["n_train"] == 200
    assert list(prep.manifest.columns) == ["sample_id", "split", "label", "group", "class_name"]
    assert np.array_equal(prep.X, ds.X) and np.array_equal(prep.label, ds.label)
    some = list(prep.manifest.sample_id[[5, 2]])
    assert prep.rows(some).tolist() == [5, 2]
    with pytest.raises(KeyError, match="nope"):
        prep.rows(["nope"])


def _write_idx(path, arr):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape))
        f.write(arr.astype(np.uint8).tobytes())


def test_fashion_loader_on_synthetic_idx(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    assert read_idx(tmp_path / "train-labels-idx1-ubyte.gz").tolist()[:3] == [0, 1, 2]
    fine = load_dataset("fashion_mnist", fashion_mnist_dir=str(tmp_path))
    assert fine.X.shape == (40, 784) and fine.X.max() <= 1.0
    assert fine.sample_id[0] == "fmnist-train-00000" and fine.sample_id[-1] == "fmnist-test-00009"
    sup = load_dataset("fashion_mnist", fashion_mnist_dir=str(tmp_path), targets="super")
    assert sup.class_names == list(FASHION_GROUPS)
    shirt = fine.fine_label == 6
    assert set(sup.group[shirt]) == {"tops"} and set(sup.label[shirt]) == {0}
    assert set(manifest_of(sup)["class_name"][shirt]) == {"Shirt"}


def test_missing_fashion_folder_names_the_package(tmp_path):
    with pytest.raises(DatasetMissing, match="dataset-fashion-mnist"):
        load_dataset("fashion_mnist", fashion_mnist_dir=str(tmp_path / "nowhere"))


def test_unknown_dataset():
    with pytest.raises(ValueError, match="allowed"):
        load_dataset("cifar")


def test_digits_are_read_from_scikit_learns_file_as_load_digits_returns_them(monkeypatch):
    import sys

    from sklearn.datasets import load_digits

    from unlearning.data.registry import digits_csv, read_digits

    assert digits_csv() is not None and digits_csv().name == "digits.csv.gz"
    monkeypatch.delitem(sys.modules, "sklearn.datasets", raising=False)
    X, y = read_digits()
    assert "sklearn.datasets" not in sys.modules  # the fast path: no scikit-learn (scipy) import
    ref = load_digits()
    assert X.dtype == ref.data.dtype and np.array_equal(X, ref.data) and np.array_equal(y, ref.target)
