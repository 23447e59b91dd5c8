"""Helpers shared by the tests: a project copy in a temp folder with small, fast params (bench/project_copy.py, which
the benches share), a trained project on the session's Prefect harness, a fabricated state."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.project_copy import FAST, ROOT, copy_project, make_project, sample_requests  # noqa: F401  (the tests' names)


def trained_project(dest: Path, overrides: dict | None = None, inbox_files: bool = True) -> Path:
    """`make_project`, then its prepare and train flows (on the session's Prefect harness): a project with an
    original, ready for deletion batches. Returns its params.yaml."""
    from flows.prepare import prepare
    from flows.train import train

    params_path = make_project(dest, overrides, inbox_files)
    prepare(str(params_path))
    train(str(params_path))
    return params_path


def fabricated_state(params_path: Path, manifest_rows: str, ledger: str = "") -> tuple[dict, Path]:
    """A state as a batch leaves it, without running one: an empty champion checkpoint, champion.json of version 2,
    the manifest (`manifest_rows`: CSV lines after the header) and the ledger's text. -> (params, state folder)."""
    import json

    params = yaml.safe_load(params_path.read_text())
    state = params_path.parent / params["base"]["paths"]["state_dir"]
    state.mkdir(parents=True)
    (state / "model.pt").write_bytes(b"")
    (state / "champion.json").write_text(json.dumps({"model_version": "2", "method": "retrain", "batch_id": "b1",
                                                     "history": []}))
    (state / "manifest.csv").write_text("sample_id,split,label,group,class_name,status,deleted_in_batch\n"
                                        + manifest_rows)
    (state / "ledger.jsonl").write_text(ledger)
    return params, state


REQUEST_HEADER = "request_id,sample_id,requested_at,reason\n"


def request_csv(prefix: str, ids: list[str]) -> str:
    """A request file's text erasing `ids` (request ids `<prefix>-<i>`, one timestamp, GDPR Art. 17)."""
    return REQUEST_HEADER + "".join(f"{prefix}-{i},{s},2026-11-28T08:00:00Z,gdpr_art17_erasure\n"
                                    for i, s in enumerate(ids))
