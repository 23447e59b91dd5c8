"""A user's table sharded by a customer column (train.sharding, docs/sharding.md) through the whole pipeline:
prepare -> train (S constituents in slices, a checkpoint per (shard, slice)) -> one customer's deletion with
`sisa`, picked by the default policy. It retrains exactly one shard, the ledger says which, verify-erasure is
clean over every slice checkpoint, and the champion (the aggregate) is registered with its accuracy."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from tests.helpers import make_project

pytestmark = pytest.mark.flow


def customers_table(n: int = 240, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    customer = rng.choice([f"cust-{i:02d}" for i in range(12)], n)
    label = rng.choice(["a", "b", "c"], n)
    centre = {"a": 0.0, "b": 2.0, "c": 4.0}
    x = np.array([centre[v] for v in label]) + rng.normal(0, 0.7, n)
    return pd.DataFrame({"row_id": [f"r{i:04d}" for i in range(n)], "customer": customer, "x1": x,
                         "x2": -x + rng.normal(0, 0.7, n), "amount": rng.normal(0, 1, n), "label": label})


def test_one_customers_deletion_retrains_one_shard_exactly(tmp_path, prefect_harness):
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from tasks.sharding import check_folder, original_shards, state_shards
    from unlearning.config import load_params

    root = tmp_path / "shop"
    (root / "data").mkdir(parents=True)
    df = customers_table()
    df.to_csv(root / "data" / "orders.csv", index=False)
    make_project(root, {"prepare": {"dataset": "table", "table": {"path": "data/orders.csv", "id_column": "row_id",
                                                                  "label_column": "label",
                                                                  "feature_columns": ["x1", "x2", "amount"]}},
                        "train": {"epochs": 6, "batch_size": 16,
                                  "sharding": {"shards": 4, "slices": 2, "by": "column", "column": "customer"}}},
                 inbox_files=False)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    params_path = str(root / "params.yaml")
    prepare(params_path)
    metrics = train(params_path)
    assert metrics["shards"] == 4 and metrics["slices"] == 2 and metrics["val_accuracy"] > 0.5
    plan = json.loads((root / "models" / "shards" / "plan.json").read_text())
    assert len(list((root / "models" / "shards").glob("shard*-slice*.pt"))) == 8
    assert not set(df["row_id"]) & set(plan["sample_ids"])  # the plan names rows by hash, never by id
    manifest = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    train_ids = set(manifest.loc[manifest.split == "train", "sample_id"])
    gone = [i for i in df.loc[df.customer == "cust-03", "row_id"] if i in train_ids]
    inbox = root / "requests" / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"request_id": [f"req-{i}" for i in range(len(gone))], "sample_id": gone,
                  "requested_at": "2026-11-30T08:00:00Z", "reason": "gdpr_art17_erasure"}).to_csv(
        inbox / "2026-12-01T0900_customer.csv", index=False)
    results = run(None, params_path)
    assert [r["status"] for r in results] == ["applied"], results
    ledger = [json.loads(line) for line in (root / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == len(gone) and {e["method"] for e in ledger} == {"sisa"}
    retrained = ledger[0]["retrained"]
    assert len(retrained["shards"]) == 1  # one customer sits in one shard
    assert {k for k, _ in retrained["slices"]} == set(retrained["shards"])
    params = load_params(params_path)
    assert check_folder(state_shards(params.project_paths), set()) == []
    # the erasure replaced the original's checkpoints by the champion's: none trained on the customer's rows
    assert json.loads((original_shards(params.project_paths) / "plan.json").read_text())["sample_ids"] == \
        json.loads((state_shards(params.project_paths) / "plan.json").read_text())["sample_ids"]
    problems, _ = verify_erasure(ErasureSettings.of(params))
    assert problems == [], problems
    champion = json.loads((root / "state" / "champion.json").read_text())
    assert champion["method"] == "sisa" and champion["history"][-1]["champion_validation_accuracy"] > 0.5
