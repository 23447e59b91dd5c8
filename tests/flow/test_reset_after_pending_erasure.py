"""`unlearn reset` while an erasure is pending (a batch inside `dvc repro` leaves the rewrite of the prepared
store and of models/original.pt to `unlearn erase`).

Found on a team's own table: reset archived the state, and the fresh state started from models/original.pt,
the very model the erased rows had been forgotten from. The tombstones then refused the same ids as "erased
already", so the rows could never be forgotten again, and `unlearn verify-erasure` (reading the now empty
ledger) said every store was clean. Now reset finishes the pending erasure first, no state starts from an
original trained on tombstoned rows, the train stage refuses a prepared store that still holds them, and
verify-erasure reads the tombstones as well as the ledger."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
import torch

from tests.helpers import make_project

pytestmark = pytest.mark.flow


@pytest.fixture(scope="module")
def pending(tmp_path_factory, prefect_harness):
    """A project after one applied batch whose erasure was left pending (as inside `dvc repro`)."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train

    root = tmp_path_factory.mktemp("pending")
    params_path = make_project(root, {"diagnostics": {"enabled": False}})
    prepare(str(params_path))
    train(str(params_path))
    ids = pd.read_csv(next((root / "requests" / "inbox").glob("*.csv")), dtype=str)["sample_id"].tolist()
    os.environ["DVC_STAGE"] = "deletion"
    try:
        results = run(None, str(params_path))
    finally:
        del os.environ["DVC_STAGE"]
    assert [r["status"] for r in results] == ["applied"]
    return root, ids


def copy_of(pending, tmp_path):
    root, ids = pending
    dest = tmp_path / "project"
    shutil.copytree(root, dest)
    from unlearning.config import load_params

    return load_params(dest / "params.yaml"), ids


def prepared_ids(params) -> set[str]:
    return set(pd.read_csv(params.path("prepared_dir") / "manifest.csv", dtype=str)["sample_id"])


def test_reset_finishes_the_pending_erasure_first(pending, tmp_path, capsys):
    from flows.cli import main
    from tasks.state import StateSettings, load_state
    from tasks.stores.base import ErasureSettings

    params, ids = copy_of(pending, tmp_path)
    champion = torch.load(params.path("state_dir") / "model.pt", weights_only=False)
    assert set(ids) <= prepared_ids(params)  # pending: the prepared store still holds the rows
    assert main(["--params", str(params.root / "params.yaml"), "reset", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "finished 1 pending erasure(s) first" in out
    assert not set(ids) & prepared_ids(params)
    state = load_state.fn(StateSettings.of(params), "cpu")  # the fresh state starts from the champion, not the old original
    for name, value in champion["state_dict"].items():
        assert torch.equal(state.model.state_dict()[name], value), name
    problems, _ = __import__("tasks.erasure", fromlist=["verify_erasure"]).verify_erasure(ErasureSettings.of(params))
    assert problems == []


def test_no_state_starts_from_an_original_trained_on_erased_rows(pending, tmp_path):
    # What reset did before: archive the state with the erasure still pending.
    from tasks.erasure import verify_erasure
    from tasks.state import StateSettings, archive_state, load_state
    from tasks.stores.base import ErasureSettings
    from unlearning.privacy.fingerprint import StateMismatch

    params, ids = copy_of(pending, tmp_path)
    archive_state(params.project_paths)
    with pytest.raises(StateMismatch, match=r"original.pt was trained before rows that are erased now \(12 "
                                            r"tombstoned id\(s\).*dvc repro -f prepare"):
        load_state.fn(StateSettings.of(params), "cpu")
    problems, _ = verify_erasure(ErasureSettings.of(params))  # the archived ledger is gone; the tombstones still name the rows
    assert any("prepared store" in p and "12 forgotten id(s)" in p for p in problems), problems
    assert any("models" in p and "original.pt" in p for p in problems), problems


def test_train_refuses_a_prepared_store_that_holds_erased_rows_and_retrains_clean_after_prepare(pending, tmp_path):
    from flows.prepare import prepare
    from flows.train import train
    from tasks.state import StateSettings, archive_state, load_state
    from unlearning.privacy.erasure import read_tombstones, tombstones_digest
    from unlearning.privacy.fingerprint import StateMismatch

    params, ids = copy_of(pending, tmp_path)
    archive_state(params.project_paths)
    path = str(params.root / "params.yaml")
    with pytest.raises(StateMismatch, match=r"still holds 12 erased row\(s\).*unlearn erase"):
        train.fn(path)
    prepare(path)  # leaves the tombstoned rows out
    train(path)
    digest = tombstones_digest(read_tombstones(params.path("tombstones")))
    assert torch.load(params.path("models_dir") / "original.pt", weights_only=False)["extra"]["clean_of"] == digest
    state = load_state.fn(StateSettings.of(params), "cpu")
    assert state.champion["started_clean_of"] == digest
    assert not set(ids) & set(state.manifest["sample_id"])
