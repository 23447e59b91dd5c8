"""Metrics and plot data for DVC (`dvc metrics show`, `dvc plots show`, `dvc exp show`): small JSON files under
base.paths.metrics_dir, declared in dvc.yaml with `cache: false`, written atomically by the stage that owns them.

- train: metrics/train.json, the original's training metrics (validation accuracy, sizes, ...);
- deletion: metrics/deletion.json, the state after the stage (batches, forgotten, the champion, the
  retraining debt) and metrics/history.json, the champion's history per batch (x = step) for `dvc plots`.
"""

from __future__ import annotations

import json
import math

from unlearning.config import Params
from unlearning.io import atomic_write_json

HISTORY_FIELDS = ("step", "forgotten_fraction", "champion_validation_accuracy", "champion_output_gap",
                  "batches_since_retrain", "n_forgotten")


def _numbers(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v))}


def write_train_metrics(params: Params, metrics: dict) -> None:
    folder = params.path("metrics_dir")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "train.json", _numbers(metrics))


def write_deletion_metrics(params: Params) -> None:
    """From the state folder (champion.json with its history, the ledger): always written, also when the
    inbox was empty, so the stage's declared outputs exist after every run."""
    from unlearning.data import read_state_manifest
    from unlearning.policy.history import n_original_train, retraining_debt
    from unlearning.privacy.ledger import read_ledger

    state_dir = params.path("state_dir")
    champion_file = state_dir / "champion.json"
    champion = json.loads(champion_file.read_text()) if champion_file.exists() else {}
    ledger = read_ledger(state_dir / "ledger.jsonl")
    history = champion.get("history", [])
    manifest_file = state_dir / "manifest.csv"
    n_train = n_original_train(read_state_manifest(manifest_file), ledger) if manifest_file.exists() else len(ledger)
    debt = retraining_debt(ledger, n_train)
    last = history[-1] if history else {}
    summary = {"n_batches": debt["n_batches"], "n_forgotten": debt["forgotten_total"],
               "forgotten_fraction": debt["forgotten_total"] / max(debt["n_train"], 1),
               "champion_version": int(champion["model_version"]) if str(champion.get("model_version", "")).isdigit()
               else None,
               "champion_validation_accuracy": last.get("champion_validation_accuracy"),
               "champion_output_gap": last.get("champion_output_gap"),
               "debt_batches_since_retrain": debt["batches_since_retrain"],
               "debt_forgotten_fraction_since_retrain": debt["forgotten_fraction_since_retrain"]}
    folder = params.path("metrics_dir")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "deletion.json", _numbers(summary))
    atomic_write_json(folder / "history.json", [{k: _finite_or_null(p[k]) for k in HISTORY_FIELDS if k in p}
                                                for p in history])


def _finite_or_null(v):
    """NaN (an exact batch trains no oracles: no output gap) and infinities are not JSON: null, which `dvc plots`
    and any strict parser read as a gap in the line."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def ensure_metrics(params: Params) -> None:
    """Before a `dvc commit` of the train and deletion stages: every declared metrics output exists. The
    deletion files are (re)written from the state; a missing train.json (an original trained before metrics
    were declared) is written from the metrics its checkpoint recorded."""
    train_file = params.path("metrics_dir") / "train.json"
    original = params.path("models_dir") / "original.pt"
    if not train_file.exists() and original.exists():
        import torch

        extra = torch.load(original, map_location="cpu", weights_only=False).get("extra", {})
        write_train_metrics(params, extra.get("metrics", {}))
    write_deletion_metrics(params)
