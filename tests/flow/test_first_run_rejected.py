"""A first run whose every file is rejected still leaves a state (the deletion stage's DVC output), so
`dvc repro` does not fail with "output 'state' does not exist" and the rejected file waits in requests/rejected/."""

import os

import pytest

from tests.helpers import make_project

pytestmark = pytest.mark.flow


def test_all_files_rejected_on_the_first_run_still_writes_the_state(tmp_path, prefect_harness):
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    params = str(make_project(tmp_path, {"diagnostics": {"enabled": False}, "deletion": {"method": "retrain"},
                                         "gate": {"retrain_equivalence": {"min_validation_accuracy": 1.0}}}))
    prepare(params)
    train(params)
    results = run(None, params)
    assert [r["status"] for r in results] == ["rejected"] and results[0]["reason"] == "gate"
    assert (tmp_path / "state" / "model.pt").exists() and (tmp_path / "state" / "ledger.jsonl").read_text() == ""
    assert list((tmp_path / "requests" / "rejected").glob("*.error.json"))
