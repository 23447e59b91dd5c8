"""`unlearn status` repeats the champion's quality warnings, shows an erasure left pending (with the command that
finishes it) and which columns feed the model (prepare.table.group_as_feature)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from flows.cli import main
from tasks import erasure as E
from tasks.stores.base import ErasureSettings
from tests.unit.test_verify_erasure_twins import table_project


def project_with_a_batch(tmp_path, monkeypatch, pending: bool):
    """A prepared table, a state whose champion's batch forgot p1 and warned, erased now or left pending (as
    inside `dvc repro`)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = table_project(tmp_path)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params.model_dump(mode="json")))
    state = params.path("state_dir")
    state.mkdir()
    m = pd.read_csv(params.path("prepared_dir") / "manifest.csv", dtype=str)
    m["status"] = ["deleted" if s == "p1" else "retained" for s in m["sample_id"]]
    m["deleted_in_batch"] = ["batch-a" if s == "p1" else "" for s in m["sample_id"]]
    m.to_csv(state / "manifest.csv", index=False)
    (state / "ledger.jsonl").write_text(json.dumps({"batch_id": "batch-a", "sample_id": "p1", "request_id": "q1",
                                                    "method": "retrain"}) + "\n")
    (state / "champion.json").write_text(json.dumps({
        "model_version": "2", "method": "retrain", "batch_id": "batch-a",
        "quality_warnings": ["the champion can no longer predict '>50K': this batch removed the last 1 training "
                             "row(s) of that class"]}))
    if pending:
        monkeypatch.setenv("DVC_STAGE", "deletion")
    E.erase(ErasureSettings.of(params), "batch-a", ["p1"], "table", None)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    return params_file


@pytest.mark.parametrize("pending", [True, False])
def test_status_shows_a_pending_erasure_and_the_command_that_finishes_it(tmp_path, monkeypatch, capsys, pending):
    params_file = project_with_a_batch(tmp_path, monkeypatch, pending)
    code = 4 if pending else 0  # an unfinished erase: `unlearn status` exits 4
    assert main(["--params", str(params_file), "status"]) == code
    out, err = capsys.readouterr()
    # inside `dvc repro` the erase keeps its journal open, with the stores DVC holds pending
    assert ("erasure pending: unfinished erase: batch batch-a: erase started" in out) == pending, out
    held = "pending (a store `dvc repro` held) for `unlearn erase`: models/original.pt, prepared store, state manifest"
    assert (held in out) == pending
    assert ("run `unlearn erase` to finish it" in out) == pending
    assert ("`unlearn erase` finishes it (exit 4)" in err) == pending
    assert main(["--params", str(params_file), "status", "--json"]) == code
    status = json.loads(capsys.readouterr().out)
    assert bool(status["erasure_pending"]) == pending


def test_status_repeats_the_quality_warnings_and_names_the_model_inputs(tmp_path, monkeypatch, capsys):
    params_file = project_with_a_batch(tmp_path, monkeypatch, pending=False)
    assert main(["--params", str(params_file), "status"]) == 0
    out = capsys.readouterr().out
    assert "quality warning (champion's batch): the champion can no longer predict '>50K'" in out
    assert "model inputs: 2 column(s) [x, z]" in out
    assert main(["--params", str(params_file), "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["quality_warnings"][0].startswith("the champion can no longer predict")
    assert status["feature_columns"] == {"feature_columns": ["x", "z"], "group_column": None,
                                         "group_as_feature": False}
