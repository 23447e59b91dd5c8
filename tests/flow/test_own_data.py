"""A team's own data and model through the whole pipeline, from a params file alone.

Each case writes a project folder the way a user would (a data file, maybe a model file, params.yaml, an
inbox request) and runs prepare -> train -> deletion_batch under the shared Prefect harness with a real
SQLite MLflow store. Small N and relaxed gate thresholds: these tests check the data and model paths end
to end, not the gate's calibration (tests/unit and bench/ do that)."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pandas as pd
import pytest

from tests.helpers import ROOT, make_project

pytestmark = pytest.mark.flow

SMALL = {
    "train": {"epochs": 4, "batch_size": 32},
    "validation": {"n_oracles": 4, "n_shadows": 4, "chunk_size": 4},
    "deletion": {"method": "finetune", "fallback": []},
    "gate": {"retrain_equivalence": {"max_accuracy_gap": 1.0, "min_validation_accuracy": 0.0,
                                     "max_klom_to_noise_floor": None}},
}

BN_MODEL = textwrap.dedent('''
    """A team's own model: a plain nn.Module with BatchNorm (and dropout)."""
    from torch import nn


    class TabularNet(nn.Module):
        def __init__(self, n_in, n_classes, width):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(n_in, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(0.1))
            self.classifier = nn.Linear(width, n_classes)

        def forward(self, x):
            return self.classifier(self.encoder(x))


    def build(in_shape, n_classes, width=16):
        return TabularNet(in_shape[0], n_classes, width)
''')


def table(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """Numeric and categorical columns, a two-level class hierarchy (species -> family)."""
    rng = np.random.default_rng(seed)
    species = rng.choice(["ash", "birch", "oak", "pine"], n)
    family = np.where(np.isin(species, ["ash", "oak"]), "broadleaf_a", np.where(species == "birch", "broadleaf_b",
                                                                                   "conifer"))
    centre = {"ash": 0.0, "birch": 1.5, "oak": 3.0, "pine": 4.5}
    height = np.array([centre[s] for s in species]) + rng.normal(0, 0.5, n)
    return pd.DataFrame({
        "tree_id": [f"tree-{i:04d}" for i in range(n)],
        "height": height * 10,
        "girth": height + rng.normal(0, 1.0, n),
        "soil": rng.choice(["clay", "sand", "loam"], n),
        "species": species,
        "family": family,
    })


def request_file(root, ids: list[str], name: str = "2026-12-01T0900_erasure.csv") -> None:
    inbox = root / "requests" / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"request_id": [f"req-{i}" for i in range(len(ids))], "sample_id": ids,
                  "requested_at": "2026-11-30T08:00:00Z", "reason": "gdpr_art17_erasure"}).to_csv(inbox / name,
                                                                                                 index=False)


def train_ids(root, k: int) -> list[str]:
    m = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    return m.loc[m.split == "train", "sample_id"].tolist()[:k]


def run_pipeline(root) -> list[dict]:
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    params = str(root / "params.yaml")
    prepare(params)
    train(params)
    assert run(None, params) == []  # an empty inbox: the state (the deletion stage's DVC output) starts as the original
    assert (root / "state" / "model.pt").exists() and (root / "state" / "ledger.jsonl").read_text() == ""
    request_file(root, train_ids(root, 6))
    return run(None, params)


def assert_applied(root, results: list[dict], n: int = 6) -> None:
    assert [r["status"] for r in results] == ["applied"]
    manifest = pd.read_csv(root / "state" / "manifest.csv", dtype=str)
    ledger = [json.loads(line) for line in (root / "state" / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == n and {e["model_version_after"] for e in ledger} == {results[0]["model_version"]}
    # erased after promotion: gone from the live manifest (and the prepared store), recorded in the ledger by their
    # salted hashes (deletion.hash_sample_ids is on by default)
    from unlearning.config import load_params
    from unlearning.privacy.erasure import id_key
    from unlearning.privacy.salt import HASH_PREFIX, id_salt

    key = id_key(True, id_salt(load_params(root / "params.yaml")))
    assert all(e["sample_id"].startswith(HASH_PREFIX) for e in ledger)
    assert not {key(s) for s in manifest["sample_id"]} & {e["sample_id"] for e in ledger}


def assert_champion_serves_raw(root, raw_rows) -> None:
    """The champion the batch registered (promote) answers raw input for the kept samples (`raw_rows(ids)`: the
    team's rows or images, in the prepared store's order) with the state model's probabilities on the prepared
    features, to 1e-6 (docs/own-data.md, "Serving raw rows")."""
    import mlflow.pyfunc
    import torch

    from adapters.tracking import fluent_store
    from unlearning.config import load_params
    from unlearning.data import load_prepared
    from unlearning.models import load_model

    p = load_params(root / "params.yaml")
    prepared = load_prepared(p.path("prepared_dir"))
    with fluent_store(p.mlflow_tracking_uri()):
        served = mlflow.pyfunc.load_model(f"models:/{p.tracking.registered_model}@{p.tracking.alias}")
    model, _ = load_model(root / "state" / "model.pt", search_paths=[root])
    with torch.no_grad():
        expected = torch.softmax(model.eval()(prepared.tensor()), dim=-1).mean(0).numpy()
    got = served.predict(raw_rows(prepared.manifest["sample_id"].tolist()))
    np.testing.assert_allclose(got.to_numpy(), expected, atol=1e-6)


def test_csv_table_with_a_custom_batchnorm_module(tmp_path, prefect_harness):
    root = tmp_path / "trees"
    (root / "data").mkdir(parents=True)
    table().to_csv(root / "data" / "trees.csv", index=False)
    (root / "my_models.py").write_text(BN_MODEL)
    make_project(root, {**SMALL, "prepare": {"dataset": "table",
                                             "table": {"path": "data/trees.csv", "id_column": "tree_id",
                                                       "label_column": "species", "group_column": "family"}},
                        "train": {**SMALL["train"], "model": {"arch": "custom", "factory": "my_models:build",
                                                              "kwargs": {"width": 12}}},
                        "deletion": {**SMALL["deletion"], "partition": {"mode": "embedding", "k_neighbors": 3}}},
                 inbox_files=False)
    results = run_pipeline(root)
    assert_applied(root, results)
    info = json.loads((root / "data" / "prepared" / "dataset.json").read_text())
    assert info["in_shape"] == [5]  # height, girth, soil=clay/loam/sand one-hot
    from unlearning.models import load_model

    model, _ = load_model(root / "state" / "model.pt", search_paths=[root])
    assert model.module_class == "TabularNet" and model.n_classes == 4
    assert any("running_mean" in name for name, _ in model.named_buffers())
    raw = table()  # the team's own rows: the id and label columns ride along, text categories as text
    assert_champion_serves_raw(root, lambda ids: raw.set_index("tree_id").loc[ids].reset_index())


def run_stage(module: str, root) -> "subprocess.CompletedProcess":
    """`python -m <module> --params root/params.yaml`, as `dvc repro` runs a stage, on the shared test server."""
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "OMP_NUM_THREADS": "1"}
    env.pop("UNLEARN_WARM_WORKER", None)
    return subprocess.run([sys.executable, "-m", module, "--params", str(root / "params.yaml")], cwd=str(ROOT),
                          env=env, capture_output=True, text=True, timeout=300)


def test_parquet_table_with_missing_values_errors_then_drops(tmp_path, prefect_harness):
    from flows.prepare import prepare

    root = tmp_path / "gaps"
    (root / "data").mkdir(parents=True)
    df = table(seed=1)
    df.loc[7, "girth"] = np.nan
    df.loc[11, "soil"] = None
    df.to_parquet(root / "data" / "trees.parquet", index=False)
    prepare_cfg = {"dataset": "table",
                   "table": {"path": "data/trees.parquet", "id_column": "tree_id", "label_column": "species"}}
    make_project(root, {**SMALL, "prepare": prepare_cfg}, inbox_files=False)
    with pytest.raises(ValueError, match=r"tree-0007[\s\S]*girth|girth[\s\S]*tree-0007"):
        prepare(str(root / "params.yaml"))
    # The DVC stage's entry point: bad data is bad input, said once (no Prefect traceback), exit code 2
    stage = run_stage("flows.prepare", root)
    assert stage.returncode == 2, stage.stdout + stage.stderr
    out = stage.stdout + stage.stderr
    assert "Traceback" not in out and out.count("rows with missing values") == 1, out
    assert [line for line in stage.stderr.splitlines() if line.startswith("error:")][0].count("tree-0007") == 1
    make_project(root, {**SMALL, "prepare": {**prepare_cfg, "table": {**prepare_cfg["table"], "missing": "drop"}}},
                 inbox_files=False)
    results = run_pipeline(root)
    assert_applied(root, results)
    manifest = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    # 2 rows dropped for gaps, 6 erased by the batch
    assert len(manifest) == len(df) - 2 - 6 and not manifest.sample_id.isin(["tree-0007", "tree-0011"]).any()


def test_image_folder_of_pngs_with_the_cnn(tmp_path, prefect_harness):
    from PIL import Image

    root = tmp_path / "shapes"
    rng = np.random.default_rng(2)
    for cls, (r0, c0) in {"blob_top": (1, 4), "blob_bottom": (9, 4), "blob_left": (5, 0)}.items():
        folder = root / "data" / "images" / cls
        folder.mkdir(parents=True)
        for i in range(40):
            img = rng.integers(0, 60, (14, 14)).astype(np.uint8)
            img[r0:r0 + 4, c0:c0 + 10 if cls != "blob_left" else c0 + 4] = 255
            Image.fromarray(img).save(folder / f"img_{i:03d}.png")
    make_project(root, {**SMALL, "prepare": {"dataset": "image_folder",
                                             "image_folder": {"path": "data/images", "image_size": 12}},
                        "train": {**SMALL["train"], "model": {"arch": "cnn", "channels": [4]}}}, inbox_files=False)
    results = run_pipeline(root)
    assert_applied(root, results)
    manifest = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    assert manifest.sample_id.str.match(r"^blob_(top|bottom|left)/img_\d{3}$").all()
    images = root / "data" / "images"
    assert_champion_serves_raw(root, lambda ids: pd.DataFrame({"image": [(images / f"{i}.png").read_bytes()
                                                                         for i in ids]}))
