"""Erasure after a promoted batch: search every store for the forgotten raw rows (feature bytes) and, with
`deletion.hash_sample_ids`, for the plain forgotten ids; then `unlearn verify-erasure` agrees."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import make_project

pytestmark = pytest.mark.flow

# Where the pipeline keeps data, models and tracking (the request files themselves are not searched: they
# are the requests, and hold ids only).
STORES = ("data", "models", "state", "cache", "mlartifacts", "mlflow.db")


def files_of(root):
    for name in STORES:
        p = root / name
        if p.is_file():
            yield p
        elif p.is_dir():
            yield from (f for f in p.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def erased(tmp_path_factory, prefect_harness):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train
    from unlearning.data import load_prepared

    root = tmp_path_factory.mktemp("erasure")
    params_path = make_project(root, {"deletion": {"hash_sample_ids": True}, "diagnostics": {"enabled": False}})
    prepare(str(params_path))
    train(str(params_path))
    request = next((root / "requests" / "inbox").glob("*.csv"))
    ids = pd.read_csv(request, dtype=str)["sample_id"].tolist()
    before = load_prepared(root / "data" / "prepared")
    rows = np.asarray(before.X)[before.rows(ids)].astype(np.float32)
    features_before = root / "features_before.npy"
    np.save(features_before, np.asarray(before.X))
    results = run(None, str(params_path))
    assert [r["status"] for r in results] == ["applied"]
    return root, params_path, ids, rows, features_before


def test_no_store_holds_forgotten_rows_or_plain_ids(erased):
    root, _, ids, rows, _ = erased
    holding_rows, holding_ids = set(), set()
    needles = [r.tobytes() for r in rows]
    plain = [s.encode() for s in ids]
    for f in files_of(root):
        data = f.read_bytes()
        if any(n in data for n in needles):
            holding_rows.add(str(f.relative_to(root)))
        if f.name != "features_before.npy" and any(p in data for p in plain):
            holding_ids.add(str(f.relative_to(root)))
    assert holding_rows == set(), holding_rows  # the "stores still holding forgotten raw rows": 0
    # hash_sample_ids: the ledger, tombstones, MLflow artifacts, params and tags carry hashed ids only
    assert holding_ids == set(), holding_ids


def test_every_store_reported_and_verified(erased, capsys):
    import json

    from flows.cli import main

    root, params_path, *_ = erased
    (report,) = (root / "state" / "erasure").glob("*.json")
    stores = {s["store"] for s in json.loads(report.read_text())["stores"]}
    assert {"prepared", "state manifest", "tombstones", "ensemble cache", "models", "MLflow registry"} <= stores
    assert main(["--params", str(params_path), "verify-erasure"]) == 0
    assert "erasure verified" in capsys.readouterr().out


def test_a_second_pass_keeps_what_the_first_removed(erased):
    """`unlearn erase` after `dvc repro`'s pass rewrites the report: the earlier pass's stores stay in it, and the
    batch's MLflow run gets the new report (its run id is kept)."""
    import json

    import mlflow

    from flows.common import tracker_for
    from tasks.erasure import erase
    from tasks.stores.base import ErasureSettings
    from unlearning.config import load_params
    from unlearning.privacy.salt import id_salt

    root, params_path, *_ = erased
    (path,) = (root / "state" / "erasure").glob("*.json")
    first = json.loads(path.read_text())
    params = load_params(params_path)
    champion = json.loads((root / "state" / "champion.json").read_text())["model_version"]
    tracker = tracker_for(params)
    erase(ErasureSettings.of(params), first["batch_id"], None, id_salt(params), champion, tracker)
    second = json.loads(path.read_text())
    assert second["run_id"] == first["run_id"] is not None
    assert second["earlier_passes"][-1]["stores"] == first["stores"]
    logged = mlflow.MlflowClient(params.mlflow_tracking_uri()).download_artifacts(
        first["run_id"], "erasure_report.json", str(root / "dl"))
    assert json.loads(Path(logged).read_text())["erased_at"] == second["erased_at"]


def test_re_prepare_keeps_erased_rows_out_and_state_loads(erased):
    from flows.prepare import prepare
    from tasks.state import StateSettings, load_state
    from unlearning.config import load_params

    root, params_path, ids, *_ = erased
    prepare(str(params_path))
    m = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    assert not set(m["sample_id"]) & set(ids)
    state = load_state.fn(StateSettings.of(load_params(params_path)), "cpu")  # the fingerprint survives the erasure
    assert len(state.manifest) == len(state.prepared.manifest)


def test_verify_fails_when_a_forgotten_row_is_back(erased, capsys):
    from flows.cli import main

    root, params_path, _, _, features_before = erased
    planted = root / "mlartifacts" / "planted.npy"
    shutil.copy(features_before, planted)
    try:
        assert main(["--params", str(params_path), "verify-erasure"]) == 1
        assert "forgotten raw row(s) remain" in capsys.readouterr().err
    finally:
        planted.unlink()
