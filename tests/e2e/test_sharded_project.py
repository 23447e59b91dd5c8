"""Done-when of sharded originals (docs/sharding.md), from nothing but the installed package: a team's table
sharded by its customer column (`unlearn init --shard-by customer`), `dvc repro` (prepare -> train: S constituents
in slices -> deletion), then one customer's rows deleted through the inbox. The deletion is `sisa`, retrains
exactly one shard, `unlearn erase` + `unlearn verify-erasure` are clean over every slice checkpoint, and the
champion's accuracy is reported (dvc metrics, the champion's history)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def sh(cmd, cwd, env, timeout=900) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr


def orders(n: int = 300, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    label = rng.choice(["kept", "returned"], n)
    x = np.where(label == "returned", 1.5, -1.5) + rng.normal(0, 1, n)
    return pd.DataFrame({"order_id": [f"o{i:04d}" for i in range(n)],
                         "customer": rng.choice([f"cust-{i:02d}" for i in range(15)], n),
                         "price": (50 + 10 * x).round(2), "items": rng.integers(1, 5, n),
                         "channel": rng.choice(["web", "store"], n), "label": label})


def test_one_customer_deleted_from_a_sharded_project(tmp_path):
    (tmp_path / "crm").mkdir()
    table = orders()
    table.to_csv(tmp_path / "crm" / "orders.csv", index=False)
    proj = tmp_path / "shop"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        env.pop(key, None)
    out = sh([sys.executable, "-m", "flows.cli", "init", str(proj), "--dataset", "table",
              "--path", str(tmp_path / "crm" / "orders.csv"), "--id-column", "order_id", "--label-column", "label",
              "--shard-by", "customer", "--shards", "5", "--slices", "3"], ROOT, env)
    assert "5 shards x 3 slices by column 'customer'" in out
    params_file = proj / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["train"]["epochs"] = 12
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    sh([sys.executable, "-m", "flows.session", sys.executable, "-m", "dvc", "repro"], proj, env)
    assert len(list((proj / "models" / "shards").glob("shard*-slice*.pt"))) == 15

    from unlearning.config import load_params
    from unlearning.data import load_prepared

    p = load_params(params_file)
    manifest = load_prepared(p.path("prepared_dir")).manifest
    train_ids = set(manifest.loc[manifest.split == "train", "sample_id"])
    gone = [i for i in table.loc[table.customer == "cust-07", "order_id"] if i in train_ids]
    inbox = proj / "requests" / "inbox"
    pd.DataFrame({"request_id": [f"r{i}" for i in range(len(gone))], "sample_id": gone,
                  "requested_at": "2026-12-01T08:00:00Z", "reason": "customer asked"}).to_csv(
        inbox / "2026-12-02T0900_cust-07.csv", index=False)
    out = sh([sys.executable, "-m", "flows.cli", "plan", str(inbox / "2026-12-02T0900_cust-07.csv")], proj, env)
    assert "sisa: exact" in out and "of a full retrain" in out, out  # planned as exact, at its share of a retrain
    out = sh([sys.executable, "-m", "flows.session", sys.executable, "-m", "dvc", "repro", "deletion"], proj, env)
    assert "sisa: retrained shard(s)" in out and "promoted" in out, out[-3000:]

    ledger = [json.loads(line) for line in (proj / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == len(gone) and {e["method"] for e in ledger} == {"sisa"}
    assert len(ledger[0]["retrained"]["shards"]) == 1  # one customer, one shard
    sh([sys.executable, "-m", "flows.cli", "erase"], proj, env)
    out = sh([sys.executable, "-m", "flows.cli", "verify-erasure"], proj, env)
    assert "erasure verified" in out and "shard checkpoints" in out, out
    metrics = json.loads(sh([sys.executable, "-m", "dvc", "metrics", "show", "--json"], proj, env))
    files = {f: d["data"] for rev in metrics.values() for f, d in rev["data"].items()}
    assert files["metrics/train.json"]["shards"] == 5 and files["metrics/train.json"]["val_accuracy"] > 0.6
    assert "sisa" in sh([sys.executable, "-m", "flows.cli", "status"], proj, env)
    champion = json.loads((proj / "state" / "champion.json").read_text())
    assert champion["method"] == "sisa" and champion["history"][-1]["champion_validation_accuracy"] > 0.6
