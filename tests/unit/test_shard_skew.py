"""Skewed shards (unlearning/sharding.py skew_warning): said at `unlearn init --shard-by` and at train, past
train.sharding.max_skew; the size-weighted aggregate (unlearning/models/aggregate.py) in float64."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from unlearning.config import ConfigError, parse_params
from unlearning.models import build_model, load_model, save_model
from unlearning.sharding import Aggregate, ShardState, assign_shards, make_plan, shard_skew, skew_warning

SPEC = {"arch": "mlp", "in_shape": [4], "n_classes": 3, "kwargs": {"hidden": [5]}}


def adult_like_countries(n_us=350, others=20, per_other=2) -> np.ndarray:
    """One value holding ~90% of the rows (Adult's native_country: United-States)."""
    return np.asarray(["United-States"] * n_us + [f"c{i}" for i in range(others) for _ in range(per_other)])


def test_a_dominant_value_is_warned_with_its_share_and_what_to_do():
    keys = adult_like_countries()
    sizes = np.bincount(assign_shards(keys, 4, 0), minlength=4)
    assert sizes.max() == 350 and shard_skew(sizes) == pytest.approx(350 / (390 / 4))
    line = skew_warning(sizes, 3.0, keys, "column 'native_country'")
    assert "350 rows down to" in line and "3.6 x the mean" in line and "max_skew = 3" in line
    assert "'United-States' alone holds 350 rows (90%)" in line and "size_weighted" in line
    assert skew_warning(sizes, 4.0, keys) is None  # under the stated multiple: silent
    even = np.bincount(assign_shards(np.arange(400).astype(str), 4, 0), minlength=4)
    assert skew_warning(even, 3.0, np.arange(400).astype(str)) is None


def test_max_skew_is_validated_naming_the_key():
    assert parse_params({"train": {"sharding": {"max_skew": 5}}}).train.sharding.max_skew == 5
    with pytest.raises(ConfigError, match="max_skew"):
        parse_params({"train": {"sharding": {"max_skew": 0.5}}})
    assert parse_params({"train": {"sharding": {"aggregate": "size_weighted"}}}).train.sharding.aggregate == \
        "size_weighted"


def test_size_weighted_aggregate_weighs_each_constituent_by_its_rows_float64(tmp_path):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(7, 4, generator=g, dtype=torch.float64)
    members = build_model(SPEC, [1, 2, 3]).double()
    w = torch.tensor([350.0, 30.0, 10.0], dtype=torch.float64)
    agg = Aggregate(members, "size_weighted", weights=w.tolist())
    probs = torch.softmax(members(X), -1).detach()  # [3, 7, C]
    expect = (w[:, None, None] * probs).sum(0) / w.sum()
    assert torch.allclose(torch.softmax(agg(X)[0], -1).detach(), expect, atol=1e-12)
    # an empty shard (every row forgotten) is left out, the others keep their weights
    part = Aggregate(members, "size_weighted", active=[True, False, True], weights=[350.0, 0.0, 10.0])
    expect = (350 * probs[0] + 10 * probs[2]) / 360
    assert torch.allclose(torch.softmax(part(X)[0], -1).detach(), expect, atol=1e-12)
    save_model(agg, tmp_path / "agg.pt", {})
    back, _ = load_model(tmp_path / "agg.pt")
    assert back.aggregate == "size_weighted" and back.weights.tolist() == w.tolist()
    with pytest.raises(ValueError, match="weights"):
        Aggregate(members, "size_weighted", weights=[1.0, -1.0, 1.0])


def test_the_shard_state_weighs_by_the_plan_sizes_after_a_deletion():
    keys = adult_like_countries(20, 4, 2)
    plan = make_plan([f"r{i}" for i in range(len(keys))], keys, 3, 1, 0, 2, [1, 2, 3], "column", "native_country")
    state = ShardState(plan, torch.empty(0), torch.empty(0), {}, "size_weighted")
    members = build_model(SPEC, [1, 2, 3])
    assert state.model(members).weights.tolist() == [float(n) for n in plan.sizes()]
    smaller = ShardState(plan.without(np.flatnonzero(plan.shard == 0)[:5]), torch.empty(0), torch.empty(0), {},
                         "size_weighted")
    assert smaller.model(members).weights.tolist() == [float(n) for n in smaller.plan.sizes()]
    assert smaller.plan.sizes()[0] == plan.sizes()[0] - 5


def test_init_shard_by_a_skewed_column_warns(tmp_path, capsys):
    from flows.cli import main

    keys = adult_like_countries(60, 6, 2)
    n = len(keys)
    csv = tmp_path / "adult.csv"
    rng = np.random.default_rng(0)
    pd.DataFrame({"id": [f"p{i}" for i in range(n)], "y": rng.integers(0, 2, n), "age": rng.integers(18, 90, n),
                  "native_country": keys, "household": [f"h{i // 2}" for i in range(n)]}).to_csv(csv, index=False)
    base = ["init", None, "--dataset", "table", "--path", str(csv), "--id-column", "id", "--label-column", "y",
            "--no-vcs", "--shard-by", "native_country", "--shards", "4"]
    assert main([base[0], str(tmp_path / "skewed"), *base[2:]]) == 0
    out = capsys.readouterr().out
    assert "warning: --shard-by native_country: skewed shards (60 rows down to" in out
    assert "'United-States' alone holds 60 rows" in out
    assert main([base[0], str(tmp_path / "even"), *base[2:-4], "--shard-by", "household", "--shards", "4"]) == 0
    assert "warning: --shard-by" not in capsys.readouterr().out


def test_train_says_the_aggregates_accuracy_against_its_constituents_and_how_to_get_a_single_models():
    from tasks.sharding import sharded_accuracy_lines

    g = torch.Generator().manual_seed(1)
    X = torch.randn(20, 4, generator=g)
    y = (X[:, 0] > 0).long()
    agg = Aggregate(build_model(SPEC, [1, 2, 3]), "size_weighted", weights=[30, 5, 5])
    warn = "train.sharding: skewed shards (30 rows down to 5; ...)"
    lines, metrics = sharded_accuracy_lines(agg, X, y, {"shard_rows": [30, 5, 5], "aggregate": "size_weighted",
                                                        "skew_warning": warn})
    assert lines[0].startswith("sharded original: the aggregate (size_weighted) of 3 constituents has val accuracy")
    assert "dvc exp run -S train.sharding.shards=null" in lines[0] and lines[1] == warn
    assert 0 <= metrics["constituent_val_accuracy_min"] <= metrics["constituent_val_accuracy_max"] <= 1
