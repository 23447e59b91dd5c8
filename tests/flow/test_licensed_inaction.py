"""Licensed inaction through the real flow (docs/certificate.md, "Licensed inaction"; Prefect, MLflow, the stores):
a single row the model did not memorize is licensed: the model stays (no new version), the row leaves every store
(`unlearn verify-erasure` clean), the ledger and the batch run say why with an epsilon figure, and the debt counts
it; a whole class is never licensed, whatever its rows' scores."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.helpers import request_csv, trained_project

pytestmark = pytest.mark.flow

LICENSING = {"validation": {"n_oracles": 80, "n_shadows": 80, "chunk_size": None},
             "licensing": {"audit": {"probability": 0.0}, "map": {"members": 32}},
             "diagnostics": {"enabled": False}}


request = request_csv  # a request file's text (tests/helpers.py)


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_harness):
    """A trained digits project whose map is built (as a first batch would), and the row it scores lowest."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from tasks.licensing import full_rows
    from tasks.batch_settings import BatchSettings
    from tasks.memorization_map import map_for_state
    from tasks.planning import probe
    from tasks.state import StateSettings, load_state
    from unlearning.config import load_params

    root = tmp_path_factory.mktemp("licensed")
    params_path = trained_project(root, LICENSING, inbox_files=False)
    params = load_params(params_path)
    state = load_state.fn(StateSettings.of(params), "cpu")
    settings = BatchSettings.of(params)
    record, line = map_for_state(settings.map_settings, state, "cpu",
                                 lambda: probe(settings.probe_inputs, state, full_rows(state), "cpu")[0])
    assert record is not None and record.cuts.for_rows(1) is not None, line
    ids = state.manifest["sample_id"].to_numpy()
    low, second = np.argsort(record.map.upper)[:2]
    from tasks.id_key import IdKey

    by_key = dict(zip(IdKey.of(params).ledger_keys(ids), ids))
    return root, params_path, by_key[record.ids[low]], record, by_key[record.ids[second]]


def test_a_row_the_model_did_not_memorize_is_licensed_with_the_model_unchanged(project):
    from flows.deletion_batch import run
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from unlearning.config import load_params
    from unlearning.privacy.ledger import read_ledger

    root, params_path, row, record, _ = project
    champion_before = json.loads((root / "state" / "champion.json").read_text()) \
        if (root / "state" / "champion.json").exists() else {}
    (root / "requests" / "inbox" / "2026-12-01T0900_one.csv").write_text(request("one", [row]))
    [result] = run(None, str(params_path))
    assert result["status"] == "applied" and result["method"] == "do_nothing", result
    champion = json.loads((root / "state" / "champion.json").read_text())
    assert champion["model_version"] == result["model_version"]
    if champion_before:
        assert champion["model_version"] == champion_before["model_version"]  # no new model version
    [entry] = [e for e in read_ledger(root / "state" / "ledger.jsonl") if e["request_id"] == "one-0"]
    assert entry["verdict"] == "licensed" and entry["method"] == "do_nothing"
    assert entry["licence"]["model"] == "model unchanged (licensed)"
    assert entry["licence"]["map_epsilon"] <= entry["licence"]["cut"] and entry["licence"]["budget"] == 3.0
    assert row not in json.dumps(entry)  # hashed id only
    assert champion["history"][-1]["licensed"] is True

    params = load_params(params_path)
    from adapters.tracking import Tracker

    t = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    run_ = t.client.get_run(result["run_id"])
    assert run_.data.tags["licensing"] == "licensed" and run_.data.tags["gate"] == "model unchanged (licensed)"
    assert run_.data.metrics["licensing/budget"] == 3.0 and "licensing/cut" in run_.data.metrics
    files = {a.path for a in t.client.list_artifacts(result["run_id"])}
    assert {"licence_epsilon.png", "licensed_rows.json", "licence.json"} <= files
    problems, _ = verify_erasure(ErasureSettings.of(params))
    assert problems == []

    from unlearning.policy.history import retraining_debt

    debt = retraining_debt(read_ledger(root / "state" / "ledger.jsonl"), 1000)
    assert debt["licensed_since_retrain"] == 1 and debt["batches_since_retrain"] >= 1


def test_a_whole_class_is_never_licensed(project):
    from flows.deletion_batch import run
    from tasks.state import StateSettings, load_state
    from unlearning.config import load_params
    from unlearning.batch.rows import retained_train_rows

    root, params_path, _, _, _ = project
    params = load_params(params_path)
    state = load_state.fn(StateSettings.of(params), "cpu")
    train = retained_train_rows(state.manifest)
    labels = state.prepared.label[train]
    ids = state.manifest["sample_id"].to_numpy()[train][labels == labels[0]].tolist()
    (root / "requests" / "inbox" / "2026-12-02T0900_class.csv").write_text(request("cls", ids))
    [result] = run(None, str(params_path))
    # the exact path: a retrain (applied), or refused by the retrain's validation floor (a class's validation rows
    # go with it): never the unchanged model
    assert result.get("method") != "do_nothing", result
    from adapters.tracking import Tracker

    t = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    [batch_run] = [r for r in t.client.search_runs([t.client.get_experiment_by_name(params.tracking.experiment)
                                                    .experiment_id], "tags.request_file = '2026-12-02T0900_class.csv'")]
    assert batch_run.data.tags["licensing"] == "exact"
    path = t.client.download_artifacts(batch_run.info.run_id, "licence.json", str(root))
    licence = json.loads(open(path).read())
    assert not licence["licensed"] and any("class-level" in r for r in licence["reasons"])


def test_unlearn_plan_says_which_path_a_request_takes_and_why(project, tmp_path):
    from flows.plan_cli import batch_plan_for
    from unlearning.config import load_params

    root, params_path, _, _, row = project
    path = tmp_path / "one.csv"
    path.write_text(request("plan", [row]))
    _, _, _, notes = batch_plan_for(path, load_params(params_path), "cpu")
    assert notes[0].startswith("licensing: licensed: model unchanged"), notes[0]
