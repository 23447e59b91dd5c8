"""Own-data inputs no other test covers (found by running scaffolded projects on generated tables)."""

from __future__ import annotations

import decimal

import numpy as np
import pandas as pd
import pytest

from unlearning.data.registry import DataError
from unlearning.data.sources import load_table


def _table(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 2
    return pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x": rng.normal(size=n) + y, "label": y})


def test_parquet_decimal_column_is_a_number_not_a_category(tmp_path):
    # A database's NUMERIC column arrives from Parquet as Decimal objects: it was one-hot encoded as text (or,
    # with many distinct values, refused as "text feature column ... identifies rows").
    df = _table()
    df["price"] = [decimal.Decimal(f"{i}.25") for i in range(len(df))]
    df.to_parquet(tmp_path / "t.parquet", index=False)
    ds = load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label")
    names = ds.meta["preprocessing"]["feature_names"]
    assert names == ["x", "price"]
    col = ds.X[:, 1]
    assert np.isfinite(col).all() and len(np.unique(col)) == len(df)  # standardized, one value per row


def test_parquet_decimal_with_gaps_is_dropped_like_a_number(tmp_path):
    df = _table()
    df["price"] = [decimal.Decimal("1.5") if i % 10 else None for i in range(len(df))]
    df.to_parquet(tmp_path / "t.parquet", index=False)
    ds = load_table(path=tmp_path / "t.parquet", id_column="id", label_column="label", missing="drop")
    assert ds.meta["preprocessing"]["feature_names"] == ["x", "price"]
    assert len(ds.sample_id) == len(df) - 6


@pytest.mark.parametrize("missing", ["error", "drop"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_all_missing_column_is_named(tmp_path, fmt, missing):
    # `missing: drop` said only "no rows left (of 60) after dropping rows with missing values", naming no column;
    # `missing: error` listed every row and suggested `missing: drop`, which cannot work.
    df = _table()
    df["empty"] = np.nan
    path = tmp_path / f"t.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path, index=False)
    with pytest.raises(DataError) as e:
        load_table(path=path, id_column="id", label_column="label", missing=missing)
    msg = str(e.value)
    assert "'empty'" in msg and "no value in any" in msg and "feature_columns" in msg
    assert "no rows left" not in msg


def test_all_missing_column_left_out_via_feature_columns_loads(tmp_path):
    df = _table()
    df["empty"] = np.nan
    df.to_csv(tmp_path / "t.csv", index=False)
    ds = load_table(path=tmp_path / "t.csv", id_column="id", label_column="label", feature_columns=["x"])
    assert ds.X.shape == (len(df), 1)
