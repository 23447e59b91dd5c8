"""A first run whose every file is held or rejected still leaves a state (the deletion stage's DVC output), so
`dvc repro` does not fail with "output 'state' does not exist" and the held file waits in requests/held/."""

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
    assert [r["status"] for r in results] == ["held"] and results[0]["reason"] == "gate"
    assert (tmp_path / "state" / "model.pt").exists() and (tmp_path / "state" / "ledger.jsonl").read_text() == ""
    assert list((tmp_path / "requests" / "held").glob("*.held.json"))


def test_the_dvc_stage_exits_like_unlearn_run_when_a_file_is_not_applied(tmp_path, prefect_harness, monkeypatch,
                                                                          capsys):
    # `dvc repro` ended 0 ("Completed with rejections") where `unlearn run` exits 2 or 3: a scheduler running
    # the DVC stage saw a green run for a batch that was not applied.
    import sys

    from flows import deletion_batch
    from flows.prepare import prepare
    from flows.train import train

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    params = str(make_project(tmp_path, {"diagnostics": {"enabled": False}, "deletion": {"method": "retrain"},
                                         "gate": {"retrain_equivalence": {"min_validation_accuracy": 1.0}}}))
    prepare(params)
    train(params)
    monkeypatch.setattr(sys, "argv", ["flows.deletion_batch", "--params", params])
    with pytest.raises(SystemExit) as gate:
        deletion_batch.main()  # the inbox's request: no candidate passes, the batch is held for review
    assert gate.value.code == 5
    assert "1 file(s) held for review in requests/held/" in capsys.readouterr().err
    (tmp_path / "requests" / "inbox" / "notes.txt").write_text("not a request\n")
    with pytest.raises(SystemExit) as bad:
        deletion_batch.main()
    assert bad.value.code == 2
    deletion_batch.main()  # the inbox is empty now: nothing to do, exit 0 (no SystemExit)
