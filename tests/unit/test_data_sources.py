"""Your own data: tables (CSV/Parquet) and image folders, the memory-mapped store, and their params."""

import json
import time
import warnings

import numpy as np
import pandas as pd
import pytest

from unlearning.config import ConfigError, parse_params
from unlearning.data import Dataset, apply_preprocessing, load_dataset, load_prepared, write_prepared


def people(n=40, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "pid": [f"p{i:03d}" for i in range(n)],
        "age": rng.normal(40, 10, n).round(2),
        "const": np.full(n, 3.0),
        "city": rng.choice(["oslo", "rome"], n),
        "member": rng.choice([True, False], n),
        "y": np.arange(n) % 3 * 5,  # classes 0, 5, 10: numeric order, not text order
        "fold": ["val" if i % 4 == 0 else "train" for i in range(n)],
    })


def table(tmp_path, df, name="t.csv", **table):
    path = tmp_path / name
    df.to_csv(path, index=False) if name.endswith(".csv") else df.to_parquet(path, index=False)
    return load_dataset("table", path=str(path), **{"id_column": "pid", "label_column": "y", **table})


def test_table_one_hot_and_train_only_scaling(tmp_path):
    df = people()
    df.loc[0, "city"] = "lima"  # row 0 is a val row: the category still exists (fitted on all rows)
    ds = table(tmp_path, df, split_column="fold")
    prep = ds.meta["preprocessing"]
    assert prep["feature_names"] == ["age", "const", "city=lima", "city=oslo", "city=rome",
                                     "member=False", "member=True"]
    assert ds.in_shape == (7,) and ds.X.shape == (40, 7) and ds.X.dtype == np.float32 and ds.image_shape is None
    train = (df["fold"] == "train").to_numpy()
    mean, std = df["age"][train].mean(), df["age"][train].std(ddof=0)
    assert np.allclose(ds.X[:, 0], (df["age"] - mean) / std, atol=1e-5)
    assert abs(ds.X[train, 0].mean()) < 1e-5 and abs(ds.X[~train, 0].mean()) > 1e-3  # fitted on train only
    assert np.all(ds.X[:, 1] == 0) and prep["stds"]["const"] == 1.0  # std 0 -> 1
    assert ds.X[0, 2:5].tolist() == [1, 0, 0] and np.all(ds.X[1:, 2] == 0)
    assert np.array_equal(ds.X[:, 6], df["member"].to_numpy(dtype=np.float32))
    assert ds.fine_class_names == ["0", "5", "10"] and ds.label.tolist()[:4] == [0, 1, 2, 0]
    assert list(ds.sample_id[:2]) == ["p000", "p001"] and list(ds.split[:2]) == ["val", "train"]
    assert list(ds.group[:3]) == ["0", "5", "10"]  # no group column: the class name
    # The recorded preprocessing re-applies to the raw rows exactly; dataset.json carries it.
    assert np.allclose(apply_preprocessing(df, prep), ds.X)
    info = write_prepared(ds, tmp_path / "prep")
    saved = json.loads((tmp_path / "prep" / "dataset.json").read_text())
    assert saved["preprocessing"] == prep and saved["in_shape"] == [7] and saved["n_features"] == 7
    assert saved["image_shape"] is None and info["source"]["format"] == "csv"


def test_table_stratified_split_is_seeded_and_follows_ids_not_rows(tmp_path):
    df = people(60).drop(columns="fold")
    a = table(tmp_path, df, group_column="city")
    b = table(tmp_path, df.iloc[::-1], name="rev.csv", group_column="city")
    assert set(a.split) == {"train", "val"} and (a.split == "val").sum() == 12
    assert dict(zip(a.sample_id, a.split)) == dict(zip(b.sample_id, b.split))
    assert set(a.group) == {"oslo", "rome"}
    c = load_dataset("table", path=str(tmp_path / "t.csv"), id_column="pid", label_column="y", seed=1)
    assert (c.split != a.split).any()
    sup = table(tmp_path, df, group_column="city", targets="super")
    assert sup.class_names == ["oslo", "rome"] and sup.fine_class_names == ["0", "5", "10"]


def test_table_missing_values_error_or_drop(tmp_path):
    df = people()
    df.loc[3, "age"] = np.nan
    df.loc[7, "city"] = None
    with pytest.raises(ValueError) as e:
        table(tmp_path, df)
    msg = str(e.value)
    assert "'p003'" in msg and "'p007'" in msg and "'age'" in msg and "'city'" in msg
    assert "prepare.table.missing: drop" in msg
    ds = table(tmp_path, df, missing="drop")
    assert len(ds.sample_id) == 38 and "p003" not in set(ds.sample_id)
    assert write_prepared(ds, tmp_path / "prep")["n_dropped_missing"] == 2


def test_table_split_column_values(tmp_path):
    df = people()
    ds = table(tmp_path, df, split_column="fold")
    assert (ds.split == df["fold"].to_numpy()).all() and "fold" not in ds.meta["preprocessing"]["columns"]
    df.loc[5, "fold"] = "test"
    with pytest.raises(ValueError, match=r"exactly 'train' or 'val'.*'test'.*'p005'"):
        table(tmp_path, df, split_column="fold")


def test_table_parquet_round_trip(tmp_path):
    df = people()
    a = table(tmp_path, df, split_column="fold")
    b = table(tmp_path, df, name="t.parquet", split_column="fold")
    assert np.allclose(a.X, b.X) and list(a.sample_id) == list(b.sample_id) and b.meta["source"]["format"] == "parquet"
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(ValueError, match=r"\.csv.*\.parquet"):
        load_dataset("table", path=str(tmp_path / "t.xlsx"), id_column="pid", label_column="y")


def test_table_ids_must_be_unique_and_present(tmp_path):
    df = people()
    df.loc[4, "pid"] = "p001"
    with pytest.raises(ValueError, match=r"duplicate ids.*p001"):
        table(tmp_path, df)
    df.loc[4, "pid"] = " "
    with pytest.raises(ValueError, match=r"empty ids in rows 4"):
        table(tmp_path, df)
    with pytest.raises(ValueError, match=r"prepare.table.label_column = 'label'.*columns"):
        table(tmp_path, people(), label_column="label")
    with pytest.raises(ValueError, match="feature_columns"):
        table(tmp_path, people(), feature_columns=["age", "y"])


# ----------------------------------------------------------------------------------------------- images
def png(path, color, size=(6, 5), mode="RGB", fmt=None):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path, format=fmt)


def test_image_folder_class_layout(tmp_path):
    root = tmp_path / "imgs"
    for i in range(5):
        png(root / "cat" / f"c{i}.png", (255, 0, 0))
        png(root / "dog" / f"d{i}.PNG", (0, 0, 255), fmt="PNG")
    png(root / "dog" / "x.JPG", (0, 0, 255), fmt="JPEG")
    (root / "cat" / ".DS_Store").write_text("hidden files are ignored")
    ds = load_dataset("image_folder", path=str(root), image_size=[3, 4], grayscale=False)
    assert ds.in_shape == (3, 3, 4) and ds.X.shape == (11, 36) and ds.image_shape == (3, 4)
    assert ds.sample_id[0] == "cat/c0" and "dog/x" in set(ds.sample_id)
    assert ds.fine_class_names == ["cat", "dog"] and list(ds.group[:1]) == ["cat"]
    red = ds.X[0].reshape(3, 3, 4)  # channel-first
    assert np.allclose(red[0], 1) and np.allclose(red[1:], 0)
    assert set(ds.split) == {"train", "val"} and (ds.split == "val").sum() == 2  # 1 of 5 cats, 1 of 6 dogs
    gray = load_dataset("image_folder", path=str(root), image_size=8, groups={"cat": "pet", "dog": "pet"})
    assert gray.in_shape == (1, 8, 8) and set(gray.group) == {"pet"} and 0 <= gray.X.min() <= gray.X.max() <= 1
    with pytest.raises(ValueError, match=r"\['dog'\] have no group"):
        load_dataset("image_folder", path=str(root), groups={"cat": "pet"})
    (root / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"dog/notes\.txt"):
        load_dataset("image_folder", path=str(root))


def test_image_folder_split_layout(tmp_path):
    root = tmp_path / "imgs"
    for split, n in (("train", 3), ("val", 2)):
        for c in ("a", "b"):
            for i in range(n):
                png(root / split / c / f"{i}.png", 128, mode="L")
    ds = load_dataset("image_folder", path=str(root), image_size=[2, 2])
    assert ds.sample_id.tolist()[:3] == ["train/a/0", "train/a/1", "train/a/2"]
    assert (ds.split == "train").sum() == 6 and (ds.split == "val").sum() == 4
    assert all(s.startswith(sp) for s, sp in zip(ds.sample_id, ds.split))
    assert np.allclose(ds.X, 128 / 255)
    (root / "stray.png").write_bytes(b"")
    with pytest.raises(ValueError, match="stray.png"):
        load_dataset("image_folder", path=str(root))


# ----------------------------------------------------------------------------------------------- store
def test_store_opens_memory_mapped_in_under_a_second(tmp_path):
    n, d = 60_000, 784
    X = np.zeros((n, d), dtype=np.float32)
    X[:, 0] = np.arange(n)
    ds = Dataset(name="big", X=X, label=np.arange(n) % 10, fine_label=np.arange(n) % 10,
                 sample_id=np.array([f"s{i:05d}" for i in range(n)], dtype=object),
                 split=np.where(np.arange(n) % 5 == 0, "val", "train"), group=np.full(n, "g", dtype=object),
                 class_names=[str(c) for c in range(10)], fine_class_names=[str(c) for c in range(10)],
                 image_shape=(28, 28))
    write_prepared(ds, tmp_path)
    assert not (tmp_path / "features.npz").exists()
    start = time.perf_counter()
    prep = load_prepared(tmp_path)
    assert time.perf_counter() - start < 1.0
    assert isinstance(prep.X, np.memmap) and not prep.X.flags.writeable and prep.X.shape == (n, d)
    assert prep.in_shape == [1, 28, 28] and prep.info["n_features"] == d
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch
        assert prep.tensor().shape == (n, d)
        rows = prep.tensor([5, 7])
        rows[0, 0] = -1
        assert rows[:, 0].tolist() == [-1, 7] and prep.X[5, 0] == 5


def test_old_npz_store_still_loads(tmp_path):
    ds = load_dataset("digits", max_train=20, max_val=5)
    write_prepared(ds, tmp_path)
    (tmp_path / "features.npy").unlink()
    np.savez_compressed(tmp_path / "features.npz", X=ds.X, label=ds.label)
    prep = load_prepared(tmp_path)
    assert np.array_equal(prep.X, ds.X) and prep.in_shape == [1, 8, 8] and prep.tensor().shape == (25, 64)


# ----------------------------------------------------------------------------------------------- params
def test_params_of_own_data():
    with pytest.raises(ConfigError) as e:
        parse_params({"prepare": {"dataset": "table", "table": {"id_column": "i", "label_column": "y", "colour": 1}}})
    assert "prepare.table.colour" in str(e.value) and "'split_column'" in str(e.value)
    with pytest.raises(ConfigError, match=r"prepare.dataset = 'table' needs prepare.table.path"):
        parse_params({"prepare": {"dataset": "table"}})
    with pytest.raises(ConfigError, match=r"missing: \['prepare.table.id_column'\]"):
        parse_params({"prepare": {"dataset": "table", "table": {"path": "x.csv", "label_column": "y"}}})
    with pytest.raises(ConfigError, match=r"unknown key 'prepare.source'"):
        parse_params({"prepare": {"source": "x.csv"}})
    with pytest.raises(ConfigError, match=r"needs prepare.image_folder.path"):
        parse_params({"prepare": {"dataset": "image_folder"}})
    p = parse_params({"prepare": {"dataset": "image_folder", "image_folder": {"path": "imgs", "image_size": 32}}})
    assert p.prepare.image_folder.image_size == (32, 32) and p.prepare.image_folder.grayscale is True


def test_prepare_task_resolves_source_against_params_folder(tmp_path):
    from tasks.training import prepare_dataset

    (tmp_path / "data").mkdir()
    people().to_csv(tmp_path / "data" / "p.csv", index=False)
    params = parse_params({"prepare": {"dataset": "table", "table": {"path": "data/p.csv", "id_column": "pid",
                                                                     "label_column": "y", "split_column": "fold"}}},
                          root=tmp_path)
    info = prepare_dataset.fn(params)
    assert info["source"]["path"] == "data/p.csv" and info["n_val"] == 10
    assert load_prepared(tmp_path / "data" / "prepared").manifest["sample_id"].iloc[0] == "p000"


@pytest.mark.parametrize("change, message", [
    (lambda df: df.assign(y=5), r"needs at least two classes"),
    (lambda df: df.assign(y=np.linspace(0.1, 9.9, len(df))), r"non-integer numbers.*bin the target"),
    (lambda df: df.assign(name=[f"person {i}" for i in range(len(df))]), r"'name' has 60 distinct values.*feature_columns"),
    (lambda df: df.assign(seen=pd.date_range("2020-01-01", periods=len(df))), r"'seen' holds dates/times"),
])
def test_table_columns_that_would_be_silently_wrong_are_refused(tmp_path, change, message):
    """A single class, a continuous target, free text and dates would all 'work' and train nonsense."""
    with pytest.raises(ValueError, match=message):
        table(tmp_path, change(people(60)), name="t.parquet")


def test_table_with_an_empty_validation_split_is_refused(tmp_path):
    df = people(12).assign(y=[f"c{i}" for i in range(6)] * 2)  # 6 classes of 2 rows: round(0.2 * 2) = 0 val rows each
    with pytest.raises(ValueError, match=r"validation split is empty.*val_fraction"):
        table(tmp_path, df)
