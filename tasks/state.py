"""The pipeline's live state (a DVC output): production model, live manifest, ledger, champion info.

state/model.pt, state/manifest.csv, state/ledger.jsonl, state/champion.json. A batch writes a complete
new state into a staging folder and swaps it in at the end (all or nothing)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import task

from unlearning.config import Params
from unlearning.data import initial_state_manifest, load_prepared, read_state_manifest
from unlearning.data.store import Prepared, manifest_csv_bytes
from unlearning.io import atomic_save, atomic_write_bytes, atomic_write_json, atomic_write_text, recover_dir
from unlearning.ledger import ledger_text, read_ledger
from unlearning.models import StackedModel, load_model, save_model

ORIGINAL = "original.pt"


@dataclass
class State:
    prepared: Prepared
    model: StackedModel
    manifest: pd.DataFrame
    ledger: list[dict]
    champion: dict


def original_path(params: Params) -> Path:
    return params.path("models_dir") / ORIGINAL


@task(name="load-state", retries=2, retry_delay_seconds=[1, 3])
def load_state(params: Params, device: str) -> State:
    """Read the state folder; on the first batch, start from the trained original and the prepared manifest."""
    state_dir = params.path("state_dir")
    recover_dir(state_dir)
    prepared = load_prepared(params.path("prepared_dir"))
    if (state_dir / "model.pt").exists():
        model, _ = load_model(state_dir / "model.pt", device)
        manifest = read_state_manifest(state_dir / "manifest.csv")
        champion = json.loads((state_dir / "champion.json").read_text())
    else:
        if not original_path(params).exists():
            raise FileNotFoundError(f"{original_path(params)} not found: run the train stage first "
                                    f"(`dvc repro train` or `python -m flows.train`)")
        model, extra = load_model(original_path(params), device)
        manifest = initial_state_manifest(prepared.manifest)
        champion = {"model_version": extra.get("model_version"), "method": "original", "batch_id": None}
    return State(prepared=prepared, model=model, manifest=manifest, ledger=read_ledger(state_dir / "ledger.jsonl"),
                 champion=champion)


def write_state(folder: Path, model: StackedModel, manifest: pd.DataFrame, ledger: list[dict], champion: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_save(folder / "model.pt", lambda tmp: save_model(model, tmp, {"model_version": champion.get("model_version")}))
    atomic_write_bytes(folder / "manifest.csv", manifest_csv_bytes(manifest))
    atomic_write_text(folder / "ledger.jsonl", ledger_text(ledger))
    atomic_write_json(folder / "champion.json", champion)
