"""A whole-class erasure (every training row of digit 7) is never refused for the model's quality: the exact
path's validation floors compare the validation rows the batch does not entangle, so it is applied directly; a
floor that still fails holds the batch for a person (requests/held/), `unlearn status` lists it and exits 5, and
`unlearn approve FILE` promotes the exact retrain and finishes the erase. verify-erasure is clean after either
route (docs/erasure.md, "Held batches")."""

from __future__ import annotations

import json
import os
import shutil

import pandas as pd
import pytest
import yaml

from tests.helpers import make_project

pytestmark = pytest.mark.flow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, prefect_harness):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.prepare import prepare
    from flows.train import train

    root = tmp_path_factory.mktemp("class7")
    params_path = make_project(root, {"diagnostics": {"enabled": False}}, inbox_files=False)
    prepare(str(params_path))
    train(str(params_path))
    return root


def _class_request(root, digit: int = 7) -> tuple[str, list[str]]:
    manifest = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    ids = manifest[(manifest["split"] == "train") & (manifest["label"] == str(digit))]["sample_id"].tolist()
    name = f"2026-12-01T0900_class{digit}.csv"
    pd.DataFrame({"request_id": [f"c{digit}-{i}" for i in range(len(ids))], "sample_id": ids,
                  "requested_at": "2026-12-01T09:00:00Z", "reason": "gdpr"}).to_csv(
        root / "requests" / "inbox" / name, index=False)
    return name, ids


def _copy(trained, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(trained, root)
    return root, root / "params.yaml"


def test_every_training_row_of_a_class_is_erased_directly(trained, tmp_path):
    """Default params: the exact retrain loses digit 7's validation rows by construction (reported: the summary,
    `drop/<split>` metrics), and its remote validation accuracy stays within the floor: applied."""
    from flows.common import tracker_for
    from flows.deletion_batch import run
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from unlearning.config import load_params

    root, params_path = _copy(trained, tmp_path)
    name, ids = _class_request(root)
    results = run(None, str(params_path))
    assert [r["status"] for r in results] == ["applied"], results
    m = results[0]["metrics"]
    assert m["n/validation_remote"] > 0 and m["n/validation_adjacent"] > 0  # digit 7's validation rows: entangled
    assert m["acc/validation_remote"] >= m["original_acc/validation_remote"] - 0.05  # the floor it is gated by
    assert m["acc/validation_adjacent"] < 0.05  # a class without training rows is not predicted: reported only
    params = load_params(params_path)
    tracker = tracker_for(params)
    run_ = tracker.client.get_run(results[0]["run_id"])
    assert run_.data.metrics["drop/validation_adjacent"] > 0.9
    summary = run_.data.tags["mlflow.note.content"]
    assert "validation rows entangled with them" in summary and "gated by the validation floors" in summary
    assert "**Erasure:** done" in summary
    problems, _ = verify_erasure(ErasureSettings.of(params), None, tracker)
    assert problems == []
    state = pd.read_csv(root / "state" / "manifest.csv", dtype=str)
    assert not set(state["sample_id"]) & set(ids)
    # the erasure deleted the original's version (erasure.keep_versions 0): no page links it any more (a 404)
    name = params.tracking.registered_model
    alive = {str(v.version) for v in tracker.client.search_model_versions(f"name = '{name}'")}
    assert alive == {results[0]["model_version"]}
    for logged in tracker.client.search_logged_models(experiment_ids=[tracker.experiment_id]):
        links = json.loads((logged.tags or {}).get("mlflow.modelVersions", "[]"))
        assert {str(v["version"]) for v in links if v["name"] == name} <= alive, logged.tags
    marked = tracker.client.search_runs([tracker.experiment_id], "tags.model_version_deleted LIKE 'v1:%'")
    assert len(marked) == 1 and "deleted by an erasure" in marked[0].data.tags["model_version_deleted"]


def test_a_floor_that_still_fails_holds_the_batch_until_it_is_approved(trained, tmp_path, capsys):
    """An unreachable floor: the batch is held (not rejected), its run tagged for review with the drops, the
    champion keeps serving (said by status, exit 5, and by the registry tag); `unlearn approve` applies it."""
    from flows.cli import main
    from flows.common import tracker_for
    from flows.deletion_batch import run
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from unlearning.config import load_params

    root, params_path = _copy(trained, tmp_path)
    data = yaml.safe_load(params_path.read_text())
    data["gate"]["retrain_equivalence"]["min_validation_accuracy"] = 1.0  # what no retrain reaches
    params_path.write_text(yaml.safe_dump(data, sort_keys=False))
    name, ids = _class_request(root)
    before = (root / "state" / "champion.json").read_text() if (root / "state" / "champion.json").exists() else None
    results = run(None, str(params_path))
    assert [r["status"] for r in results] == ["held"], results
    held = root / "requests" / "held"
    report = json.loads((held / f"{name}.held.json").read_text())
    assert report["batch_id"] == results[0]["batch_id"] and report["approve"] == f"unlearn approve {name}"
    assert any("is below the floor" in c for c in report["failing_checks"])
    assert "keeps serving" in report["meanwhile"]
    params = load_params(params_path)
    tracker = tracker_for(params)
    held_run = tracker.client.get_run(report["run_id"])
    assert held_run.data.tags["review"] == "required" and held_run.data.tags["gate"] == "held"
    assert "drop/validation_adjacent" in held_run.data.metrics
    assert "HELD for review" in held_run.data.tags["mlflow.note.content"]
    champion = json.loads((root / "state" / "champion.json").read_text())
    assert champion == (json.loads(before) if before else champion)  # nothing applied
    version = tracker.client.get_model_version(params.tracking.registered_model, champion["model_version"])
    assert version.tags["serves_held_rows"].startswith(f"yes: {name}")

    capsys.readouterr()
    assert main(["--params", str(params_path), "status"]) == 5
    out, err = capsys.readouterr()
    assert f"held for review 0 min: {name}" in out and "keeps serving" in out and "unlearn approve" in err

    assert main(["--params", str(params_path), "approve", name]) == 0
    approved = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert approved[0]["status"] == "applied" and approved[0]["approved"] is True
    assert not (held / name).exists() and not (held / f"{name}.held.json").exists()
    assert (root / "requests" / "processed" / name).exists()
    new_run = tracker.client.get_run(approved[0]["run_id"])
    assert new_run.data.tags["review"] == "approved" and new_run.data.tags["approved_hold_of"] == report["batch_id"]
    assert "Approved by `unlearn approve`" in new_run.data.tags["mlflow.note.content"]
    assert tracker.client.get_run(report["run_id"]).data.tags["review"] == "approved"

    def candidate(parent):  # the batch's exact retrain, as its child run logged it
        [child] = tracker.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent}' and "
                                                                      f"tags.mlflow.runName = 'unlearn-retrain'")
        return child.data.metrics

    held_model, approved_model = candidate(report["run_id"]), candidate(approved[0]["run_id"])
    assert approved_model["cost/from_cache"] == 1.0  # the same rows and seed: the held model, from the cache
    assert {k: v for k, v in approved_model.items() if k.startswith("acc/")} == \
        {k: v for k, v in held_model.items() if k.startswith("acc/")}
    problems, _ = verify_erasure(ErasureSettings.of(params), None, tracker)
    assert problems == []
    assert main(["--params", str(params_path), "status"]) == 0
    assert main(["--params", str(params_path), "approve", name]) == 2  # nothing held any more: one line
    assert "not a held request file" in capsys.readouterr().err
