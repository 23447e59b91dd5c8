"""The retraining-debt rule on three real batches: approximate, then forced retrain, then
approximate again (the retrain cleared the debt); the champion's history is kept across them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers import make_project
from unlearning.config import load_params

pytestmark = pytest.mark.flow

# do_nothing explicitly, and a gate that lets it pass (alpha and the accuracy interval made lenient, no
# floor): without the debt rule every batch would be applied by do_nothing. alpha = 0.001 needs >= 999
# permutations (config refuses a test that cannot reach alpha); with 4 + 4 models (70 relabelings) the KLoM
# p-value stays above ~1/70, so the test passes do_nothing.
OVERRIDES = {"deletion": {"method": "do_nothing", "debt": {"max_forgotten_fraction": None,
                                                           "max_batches_since_retrain": 1}},
             "diagnostics": {"enabled": False},
             "gate": {"retrain_equivalence": {"alpha": 0.001, "n_permutations": 1000, "accuracy_z": 50.0, "min_validation_accuracy": None}}}


def test_debt_forces_retrain_at_the_declared_threshold(tmp_path, prefect_harness, capsys):
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train
    from adapters.tracking import Tracker

    params_path = make_project(tmp_path, OVERRIDES, inbox_files=False)
    prepare(str(params_path))
    train(str(params_path))
    m = pd.read_csv(tmp_path / "data" / "prepared" / "manifest.csv", dtype=str)
    ids = m.loc[m.split == "train", "sample_id"].tolist()[:6]
    inbox = tmp_path / "requests" / "inbox"
    for k in range(3):
        (inbox / f"2026-12-01T10{k}0_b{k}.csv").write_text(
            "request_id,sample_id,requested_at,reason\n" +
            "".join(f"d{k}-{j},{ids[2 * k + j]},2026-11-30T10:00:00Z,gdpr\n" for j in range(2)))
    results = run(None, str(params_path))
    assert [r["status"] for r in results] == ["applied"] * 3
    # Batch 1: one approximate batch is allowed. Batch 2 would be the second: exact retrain alone.
    # Batch 3: the retrain cleared the debt.
    assert [r["method"] for r in results] == ["do_nothing", "retrain", "do_nothing"]

    params = load_params(params_path)
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    second = tracker.client.get_run(results[1]["run_id"])
    note = second.data.tags["mlflow.note.content"]
    assert "Retrain forced by the retraining debt" in note and "max_batches_since_retrain = 1" in note
    sel = json.loads(tracker.client.download_artifacts(results[1]["run_id"], "selection.json", str(tmp_path)) and
                     (tmp_path / "selection.json").read_text())
    assert sel["candidates"] == ["retrain"] and sel["rules_would_have_tried"] == ["do_nothing", "retrain"]

    history = json.loads((tmp_path / "state" / "champion.json").read_text())["history"]
    n_train = int((m.split == "train").sum())
    assert [p["step"] for p in history] == [1, 2, 3]
    assert [p["method"] for p in history] == ["do_nothing", "retrain", "do_nothing"]
    assert [p["forgotten_fraction"] for p in history] == pytest.approx([2 / n_train, 4 / n_train, 6 / n_train])
    assert [p["batches_since_retrain"] for p in history] == [1, 0, 1]
    for p in history:
        print(f"history step {p['step']}: {p['method']:10s} forgotten {p['forgotten_fraction']:.4f} "
              f"val acc {p['champion_validation_accuracy']:.4f} output gap {p['champion_output_gap']:.5f}")
    # Each batch run's debt metrics end at the value after the batch (step 1), the one the UI shows; the value
    # the selection read before it stays at step 0.
    for r, before, after in zip(results, [0, 1, 0], [1, 0, 1]):
        steps = {m.step: m.value for m in tracker.client.get_metric_history(r["run_id"], "debt/batches_since_retrain")}
        assert steps == {0: before, 1: after}
        assert tracker.client.get_run(r["run_id"]).data.metrics["debt/batches_since_retrain"] == after
    assert "Retraining debt after this batch:** 1 approximate batch(es)" in tracker.client.get_run(
        results[2]["run_id"]).data.tags["mlflow.note.content"]
    # The latest batch run carries the whole history, step-indexed.
    last = results[2]["run_id"]
    assert [x.step for x in tracker.client.get_metric_history(last, "history/forgotten_fraction")] == [1, 2, 3]
    assert "champion_history.png" in {a.path for a in tracker.client.list_artifacts(last)}

    # `unlearn status` reads the debt and the history back.
    from flows.cli import main

    capsys.readouterr()
    assert main(["--params", str(params_path), "status"]) == 0
    out = capsys.readouterr().out
    assert "retraining debt: 1 approximate batch(es) and 2 sample(s)" in out
    assert "batch 2: 2026-12-01T1010_b1.csv -> retrain" in out
