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
