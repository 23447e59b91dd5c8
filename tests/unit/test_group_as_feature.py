"""prepare.table.group_as_feature: the group column's role is explicit. Default false: it groups rows only (a
group is often who a row belongs to, or a protected attribute); true: it is also a model input. dataset.json's
feature_columns lists the model's inputs either way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from unlearning.config import ConfigError, parse_params
from unlearning.data.registry import DataError, load_dataset
from unlearning.data.store import load_prepared, write_prepared


def census(tmp_path):
    rng = np.random.default_rng(0)
    n = 60
    df = pd.DataFrame({"id": [f"p{i}" for i in range(n)], "age": rng.integers(18, 80, n),
                       "race": rng.choice(["A", "B", "C"], n), "hours": rng.normal(40, 5, n).round(1),
                       "income": rng.choice(["<=50K", ">50K"], n)})
    path = tmp_path / "census.csv"
    df.to_csv(path, index=False)
    return path


def prepared(tmp_path, **table):
    ds = load_dataset("table", path=census(tmp_path), id_column="id", label_column="income", group_column="race",
                      seed=0, **table)
    write_prepared(ds, tmp_path / "prepared")
    return load_prepared(tmp_path / "prepared").info


def test_by_default_the_group_column_is_no_model_input_and_dataset_json_says_so(tmp_path):
    info = prepared(tmp_path)
    assert info["feature_columns"] == ["age", "hours"]
    assert info["source"]["group_column"] == "race" and info["source"]["group_as_feature"] is False
    assert info["n_features"] == 2


def test_group_as_feature_feeds_it_to_the_model(tmp_path):
    info = prepared(tmp_path, group_as_feature=True)
    assert info["feature_columns"] == ["age", "race", "hours"]  # the table's order
    assert info["source"]["group_as_feature"] is True
    assert info["n_features"] == 2 + 3  # race one-hot: A, B, C
    listed = prepared(tmp_path, group_as_feature=True, feature_columns=["hours"])
    assert listed["feature_columns"] == ["hours", "race"]  # listed features, then the group


def test_listing_the_group_column_without_group_as_feature_names_the_key(tmp_path):
    with pytest.raises(DataError, match="lists the group column 'race'; set prepare.table.group_as_feature: true"):
        prepared(tmp_path, feature_columns=["age", "race"])


def test_group_as_feature_needs_a_group_column():
    table = {"path": "t.csv", "id_column": "id", "label_column": "y"}
    assert parse_params({"prepare": {"dataset": "table", "table": table}}).prepare.table.group_as_feature is False
    with pytest.raises(ConfigError, match="group_as_feature = true needs prepare.table.group_column"):
        parse_params({"prepare": {"dataset": "table", "table": {**table, "group_as_feature": True}}})
