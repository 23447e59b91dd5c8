"""The DVC metrics outputs exist before every `dvc commit` of their stages (adapters/dvc_metrics.py)."""

import json

import torch

from tests.helpers import make_project
from unlearning.config import load_params


def test_ensure_metrics_writes_what_dvc_commit_needs(tmp_path):
    from adapters.dvc_metrics import ensure_metrics

    params = load_params(make_project(tmp_path, inbox_files=False))
    metrics = params.path("metrics_dir")
    ensure_metrics(params)  # no state, no original yet: the deletion files exist, empty
    assert json.loads((metrics / "deletion.json").read_text())["n_batches"] == 0
    assert json.loads((metrics / "history.json").read_text()) == []
    assert not (metrics / "train.json").exists()
    # An original trained before the metrics were declared: train.json comes from its checkpoint.
    params.path("models_dir").mkdir(parents=True, exist_ok=True)
    torch.save({"extra": {"metrics": {"val_accuracy": 0.93, "n_train": 100, "note": "text is left out"}}},
               params.path("models_dir") / "original.pt")
    ensure_metrics(params)
    assert json.loads((metrics / "train.json").read_text()) == {"val_accuracy": 0.93, "n_train": 100}


def strict(text: str):
    """json.loads that refuses NaN and Infinity (not JSON: `dvc plots`, jq and browsers reject them)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_history_json_is_strict_json_with_null_for_no_output_gap(tmp_path):
    from adapters.dvc_metrics import write_deletion_metrics
    from unlearning.policy.history import history_point

    params = load_params(make_project(tmp_path, inbox_files=False))
    # an exact batch (retrain) trains no oracles: its output gap is NaN in the state
    point = history_point([], batch_id="b", request_file="r.csv", method="retrain", n_forgotten=2, n_train=100,
                          validation_accuracy=0.9, output_gap=float("nan"), model_version="2", processed_at="t")
    state = params.path("state_dir")
    state.mkdir(parents=True)
    (state / "champion.json").write_text(json.dumps({"model_version": "2", "history": [point]}))
    write_deletion_metrics(params)
    [back] = strict((params.path("metrics_dir") / "history.json").read_text())
    assert back["champion_output_gap"] is None and back["champion_validation_accuracy"] == 0.9
    strict((params.path("metrics_dir") / "deletion.json").read_text())
