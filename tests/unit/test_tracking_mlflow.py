"""adapters/tracking.py against a real MLflow store (SQLite in tmp_path): the champion as a pyfunc model that a
fresh process in another folder loads without this repository, metric names with `/`, tables, datasets, and
the root logger left alone.

How the load test keeps the repository out: the package is installed editable into .venv, so a plain
`.venv/bin/python` imports `unlearning` from the checkout whatever its cwd or PYTHONPATH (a `.pth` file in
site-packages installs a finder). The loader runs as `python -I -S` from an empty folder with an empty
environment: `-S` skips `site`, so no `.pth` file runs and the editable finder is never installed; `-I` drops
the script's folder, the cwd and PYTHON* variables from sys.path. The script then appends site-packages alone
(torch, mlflow, pandas), asserts that `unlearning` cannot be found, loads and predicts, and asserts that no
module of the checkout (outside .venv) was imported: `unlearning` came from the model's `code/` folder.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from adapters.tracking import Tracker, fluent_store, frame_digest
from unlearning.models import build_model, train_ensemble

ROOT = Path(__file__).resolve().parents[2]
D, C = 5, 3
CLASSES = ["ash", "birch", "cedar"]
NET = '''
import torch
from torch import nn


class Net(nn.Module):  # a team's own module, with BatchNorm buffers that must travel with the weights
    def __init__(self, d, c):
        super().__init__()
        self.fc, self.bn, self.head = nn.Linear(d, 6), nn.BatchNorm1d(6), nn.Linear(6, c)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.fc(x.flatten(1)))))


def build(in_shape, n_classes):
    return Net(in_shape[0], n_classes)
'''

LOADER = '''
import importlib.util, json, logging, sys
site_packages, repo, tracking_uri, out = sys.argv[1:5]
sys.path.append(site_packages)
for name in ("unlearning", "tasks", "flows", "tracking_test_net"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable before the model loads"
import numpy as np, pandas as pd, mlflow.pyfunc
mlflow.set_tracking_uri(tracking_uri)
X = np.load("X.npy")
level = logging.getLogger().level
result = {}
for key, uri in (("champion", "models:/clf@champion"), ("custom", "models:/custom-clf/1")):
    model = mlflow.pyfunc.load_model(uri)
    frame = model.predict(pd.DataFrame(X.astype("float64"), columns=[f"x{i}" for i in range(X.shape[1])]))
    array = model.predict(X)
    result[key] = {"columns": list(frame.columns), "frame": frame.to_numpy().tolist(),
                   "array": array.to_numpy().tolist()}
venv = repo + "/.venv/"
result["repo_modules"] = sorted(n for n, m in list(sys.modules.items()) if str(getattr(m, "__file__", None) or "")
                                .startswith(repo + "/") and not str(m.__file__).startswith(venv))
result["unlearning_file"] = sys.modules["unlearning"].__file__
result["root_level"] = [level, logging.getLogger().level]
open(out, "w").write(json.dumps(result))
'''


def data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, D, generator=g)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store with two registered pyfunc models: an MLP champion (1 member) and a custom factory's
    module from a project folder (2 members, BatchNorm)."""
    root = tmp_path_factory.mktemp("mlflow")
    project = root / "project"
    project.mkdir()
    (project / "tracking_test_net.py").write_text(NET)
    tracker = Tracker(f"sqlite:///{root}/mlflow.db", "tracking-test", root / "mlartifacts")
    run_id = tracker.start_run("train")
    X, y = data()
    mlp = build_model({"arch": "mlp", "in_shape": [D], "n_classes": C, "kwargs": {"hidden": [8]}}, [3])
    custom = build_model({"arch": "custom", "factory": "tracking_test_net:build", "in_shape": [D], "n_classes": C},
                         [4, 9], search_paths=[project])
    for model in (mlp, custom):
        train_ensemble(model, X, y, epochs=2, batch_size=16, lr=0.05)
    root_logger = logging.getLogger()
    before = (root_logger.level, list(root_logger.handlers))
    version = tracker.log_model(run_id, mlp, "clf", input_example=X[:2].numpy(), class_names=CLASSES)
    after = (root_logger.level, list(root_logger.handlers))
    tracker.set_alias("clf", "champion", version)
    tracker.log_model(run_id, custom, "custom-clf")
    tracker.end_run(run_id)
    return {"root": root, "tracker": tracker, "run_id": run_id, "X": X, "mlp": mlp, "custom": custom,
            "logger": (before, after)}


def load_elsewhere(store) -> dict:
    """The loader in a fresh, isolated process (see the module docstring) from an empty folder."""
    elsewhere = store["root"] / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    np.save(elsewhere / "X.npy", store["X"].numpy())
    (elsewhere / "load.py").write_text(LOADER)
    out = elsewhere / "result.json"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(elsewhere), "MLFLOW_DISABLE_TELEMETRY": "true",
           "DO_NOT_TRACK": "true"}
    proc = subprocess.run([sys.executable, "-I", "-S", "load.py", sysconfig.get_paths()["purelib"], str(ROOT),
                           store["tracker"].tracking_uri, str(out)], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def mean_softmax(model, X) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(model(X), dim=-1).mean(0).numpy()


def test_champion_loads_in_a_fresh_process_without_the_repository(store):
    result = load_elsewhere(store)
    assert result["repo_modules"] == []  # nothing imported from the checkout
    # the package travelled as one zip (one upload): imported from it
    assert "/artifacts/code/unlearning.zip/unlearning/" in result["unlearning_file"] and not \
        result["unlearning_file"].startswith(str(ROOT / "unlearning"))
    X = store["X"]
    champion = result["champion"]
    assert champion["columns"] == CLASSES
    probs = np.array(champion["frame"])
    assert probs.shape == (len(X), C)  # [B, C]: no member dimension
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    with torch.no_grad():
        member0 = torch.softmax(store["mlp"](X)[0], dim=-1).numpy()
    np.testing.assert_allclose(probs, member0, atol=1e-6)
    np.testing.assert_allclose(np.array(champion["array"]), member0, atol=1e-6)  # an array works too
    # the custom factory's module travelled as code; two members: their mean softmax
    custom = result["custom"]
    assert custom["columns"] == [f"class_{i}" for i in range(C)]
    np.testing.assert_allclose(np.array(custom["frame"]), mean_softmax(store["custom"], X), atol=1e-6)
    assert result["root_level"][0] == result["root_level"][1]


def test_model_has_a_signature_and_an_input_example(store):
    import mlflow

    with fluent_store(store["tracker"].tracking_uri):  # `models:/` URIs read the process-wide tracking URI
        info = mlflow.models.get_model_info("models:/clf@champion")
        model = mlflow.pyfunc.load_model("models:/clf@champion")
    assert len(info.signature.inputs.inputs) == D and not info.signature.inputs.has_input_names()
    assert info.signature.outputs.input_names() == CLASSES
    assert info.saved_input_example_info is not None
    example = np.asarray(model.input_example, dtype=np.float32)
    np.testing.assert_allclose(example, store["X"][:2].numpy(), atol=1e-6)
    version = store["tracker"].client.get_model_version("clf", "1")
    assert version.run_id == store["run_id"]
    # under this experiment's artifact root, where `purge_versions` finds it (not the default experiment's)
    tracker = store["tracker"]
    folder = tracker._local_path(tracker.client.get_model_version_download_uri("clf", "1"))
    root = tracker._local_path(tracker.client.get_experiment(tracker.experiment_id).artifact_location)
    assert folder.is_relative_to(root) and (folder / "MLmodel").exists()


def test_log_model_leaves_the_root_logger_alone(store):
    before, after = store["logger"]
    assert before == after  # level and handlers (importing mlflow.pytorch ran logging.basicConfig(level=ERROR))


def test_the_registered_model_has_a_description(store):
    from adapters.tracking import MODEL_DESCRIPTION

    description = store["tracker"].client.get_registered_model("clf").description
    assert description == MODEL_DESCRIPTION and "champion" in description


def test_a_run_ended_with_seconds_shows_that_duration(store):
    """The UI's Duration column (end time - start time) says the duration the run logs (a batch's wall_seconds)."""
    tracker = store["tracker"]
    run_id = tracker.start_run("batch")
    assert tracker.run_seconds(run_id) >= 0  # seconds since the start: never negative (a clock skew is clamped)
    tracker.end_run(run_id, seconds=12.8)
    info = tracker.client.get_run(run_id).info
    assert (info.end_time - info.start_time, info.status) == (12800, "FINISHED")


def test_metric_names_keep_their_slash(store):
    tracker = store["tracker"]
    run_id = tracker.start_run("metrics")
    tracker.log_metrics(run_id, {"klom_p95/forget": 0.25, "acc/validation": 0.9, "n_forgotten": 2})
    tracker.log_series(run_id, [{"step": 1, "f": 0.1}, {"step": 2, "f": 0.2}], {"f": "history/forgotten_fraction"})
    metrics = tracker.client.get_run(run_id).data.metrics
    assert metrics["klom_p95/forget"] == 0.25 and metrics["acc/validation"] == 0.9
    history = tracker.client.get_metric_history(run_id, "history/forgotten_fraction")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2)]
    found = tracker.client.search_runs([tracker.experiment_id], "metrics.`klom_p95/forget` > 0.2")
    assert [r.info.run_id for r in found] == [run_id]


def test_log_table_is_an_mlflow_table_with_redacted_ids(store):
    tracker = store["tracker"]
    run_id = tracker.start_run("table")
    df = pd.DataFrame({"sample_id": ["s-1", "s-2"], "subset": ["adjacent", "remote"], "klom": [0.5, 1.5]})
    tracker.redaction = {"s-1": "h-1", "s-2": "h-2"}
    try:
        tracker.log_table(run_id, df, "per_sample_klom.json")
    finally:
        tracker.redaction = None
    with fluent_store(tracker.tracking_uri):  # MlflowClient.load_table searches runs through the fluent API
        back = tracker.client.load_table(tracker.experiment_id, "per_sample_klom.json", run_ids=[run_id])
    assert back["sample_id"].tolist() == ["h-1", "h-2"] and back["klom"].tolist() == [0.5, 1.5]
    path = Path(tracker.client.download_artifacts(run_id, "per_sample_klom.json", str(store["root"])))
    assert b"s-1" not in path.read_bytes()
    with pytest.raises(ValueError, match="json"):
        tracker.log_table(run_id, df, "per_sample_klom.csv")


def test_log_datasets_lists_forget_and_retain_with_digests(store):
    tracker = store["tracker"]
    run_id = tracker.start_run("batch")
    forget = pd.DataFrame({"sample_id": ["s-1"], "split": ["train"], "label": [2]})
    retain = pd.DataFrame({"sample_id": ["s-2", "s-3"], "split": ["train", "train"], "label": [0, 1]})
    tracker.redaction = {"s-1": "h-1", "s-2": "h-2", "s-3": "h-3"}
    try:
        tracker.log_datasets(run_id, {"forget": forget, "retain": retain}, source="data/prepared", name="trees")
    finally:
        tracker.redaction = None
    inputs = tracker.client.get_run(run_id).inputs.dataset_inputs
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset for i in inputs}
    assert sorted(by_context) == ["forget", "retain"]
    assert by_context["forget"].name == "trees-forget"
    hashed = retain.assign(sample_id=["h-2", "h-3"])
    assert by_context["retain"].digest == frame_digest(hashed) != by_context["forget"].digest
    assert json.loads(by_context["retain"].profile)["num_rows"] == 2
    assert "sample_id" in by_context["retain"].schema
    stored = json.dumps([i.dataset.to_dictionary() for i in inputs])
    assert "s-1" not in stored and "h-1" not in stored  # digest, schema and profile: no rows


def test_reconcile_alias_on_a_store_without_the_version(store, tmp_path):
    """mlflow.db replaced by a new, empty store (docs/troubleshooting.md's fix for a damaged one) while state/champion.json
    still names v2: reconciling changes nothing and raises nothing (the next promotion registers v1 there); on
    the store that has the version, it points the alias at it."""
    fresh = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "tracking-test", tmp_path / "mlartifacts")
    assert fresh.reconcile_alias("clf", "champion", "2") == (None, False)
    assert not fresh.has_version("clf", "1")
    tracker = store["tracker"]
    assert tracker.has_version("clf", "1") and not tracker.has_version("clf", "7")
    assert tracker.reconcile_alias("clf", "champion", "7") == ("1", False)  # no such version: alias stays
    assert tracker.reconcile_alias("clf", "champion", "1") == ("1", False)


def test_two_stores_in_one_process_each_get_their_own_runs_and_models(store, tmp_path, monkeypatch):
    """A Tracker no longer exports its store as MLFLOW_TRACKING_URI (mlflow.set_tracking_uri does, and the
    project reads that variable as an override of every params file): a second project in the same process
    logs its model to its own store, and the first store gains nothing."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = store["tracker"]
    versions_before = {m.version for m in first.client.search_model_versions("name = 'clf'")}
    other = Tracker(f"sqlite:///{tmp_path}/other.db", "tracking-test", tmp_path / "mlartifacts")
    assert "MLFLOW_TRACKING_URI" not in os.environ
    run_id = other.start_run("train")
    version = other.log_model(run_id, store["mlp"], "clf")
    other.end_run(run_id)
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert version == "1" and other.has_version("clf", "1")
    assert {m.version for m in first.client.search_model_versions("name = 'clf'")} == versions_before
    assert other.client.get_run(run_id).info.experiment_id == other.experiment_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", first.tracking_uri)  # a variable the user set stays as it was
    other.log_model(other.start_run("again"), store["mlp"], "clf")
    assert os.environ["MLFLOW_TRACKING_URI"] == first.tracking_uri


def test_reset_alias_to_a_purged_original_removes_the_alias(store):
    """`unlearn reset` after an erasure: the trained original's version (here 7) was purged with the rows it was
    trained on, so the alias cannot go back to it. It used to fail with 'Model Version ... not found' (and
    MLflow had dropped the alias on the way); now the alias is removed and the caller is told why."""
    from adapters.tracking import reset_alias

    uri = store["tracker"].tracking_uri
    try:
        assert reset_alias(uri, "clf", "champion", "7") == ("1", None, True)
        assert store["tracker"].alias_version("clf", "champion") is None
        assert reset_alias(uri, "clf", "champion", "1") == (None, "1", False)
        assert reset_alias(uri, "clf", "champion", "7") == ("1", None, True)
        assert reset_alias(uri, "clf", "champion", "7") == (None, None, True)  # nothing left to remove
    finally:
        store["tracker"].set_alias("clf", "champion", "1")
    assert store["tracker"].alias_version("clf", "champion") == "1"


def test_log_model_prints_no_input_example_validation_line(store):
    """MLflow logged "Validating input example against model signature" (INFO) at every registration."""
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("mlflow.pyfunc")
    handler, level = Keep(level=logging.DEBUG), logger.level
    logger.addHandler(handler)
    try:
        tracker = store["tracker"]
        run_id = tracker.start_run("quiet")
        tracker.log_model(run_id, store["mlp"], "clf-quiet", input_example=store["X"][:2].numpy())
        tracker.end_run(run_id)
    finally:
        logger.removeHandler(handler)
    assert not any("Validating input example" in m for m in seen), seen
    assert logger.level == level
