"""Requests mean what they say (docs/requests.md): a file mixing training and validation rows is applied whole
through the real flow (Prefect, MLflow): the training rows are unlearned and a new champion promoted, the
validation rows erased from the prepared store and the manifests and recorded as erased, not trained on; the
batch's validation metrics use the remaining validation rows. A later file of validation rows only is
honoured without a new model version."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from tests.helpers import trained_project

pytestmark = pytest.mark.flow

H = "request_id,sample_id,requested_at,reason\n"


def rows(prefix: str, ids: list[str]) -> str:
    return H + "".join(f"{prefix}-{i},{s},2026-11-28T08:00:00Z,gdpr_art17_erasure\n" for i, s in enumerate(ids))


@pytest.fixture(scope="module")
def applied(tmp_path_factory, prefect_harness):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.deletion_batch import run
    from unlearning.data import load_prepared

    root = tmp_path_factory.mktemp("valrows")
    params_path = trained_project(root, {"diagnostics": {"enabled": False}}, inbox_files=False)
    before = load_prepared(root / "data" / "prepared").manifest
    train_ids = before.loc[before["split"] == "train", "sample_id"].tolist()[:3]
    val_ids = before.loc[before["split"] == "val", "sample_id"].tolist()[:3]
    inbox = root / "requests" / "inbox"
    (inbox / "2026-11-30T0900_mixed.csv").write_text(rows("mix", [train_ids[0], val_ids[0], train_ids[1], val_ids[1]]))
    first = run(None, str(params_path))
    (inbox / "2026-11-30T1000_val_only.csv").write_text(rows("val", [val_ids[2]]))
    second = run(None, str(params_path))
    return root, params_path, before, train_ids[:2], val_ids, first, second


def test_a_mixed_file_is_applied_whole(applied):
    from unlearning.data import load_prepared, read_state_manifest
    from unlearning.privacy.ledger import read_ledger

    root, _, before, train_ids, val_ids, first, _ = applied
    (r,) = first
    assert r["status"] == "applied" and r["method"], r
    ledger = [e for e in read_ledger(root / "state" / "ledger.jsonl") if e["request_id"].startswith("mix-")]
    kinds = {e["request_id"]: (e["kind"], e["method"], e["verdict"]) for e in ledger}
    assert {k for k, *_ in kinds.values()} == {"unlearned", "erased_not_trained_on"}
    assert kinds["mix-1"] == ("erased_not_trained_on", "none", "not_trained_on")
    assert kinds["mix-3"][0] == "erased_not_trained_on" and kinds["mix-0"] == ("unlearned", r["method"], kinds["mix-0"][2])
    # every named row left the prepared store and the live manifest (the first two validation rows, the training rows)
    gone = set(train_ids) | set(val_ids[:2])
    prepared = load_prepared(root / "data" / "prepared").manifest
    assert not gone & set(prepared["sample_id"]) and not gone & set(read_state_manifest(root / "state" / "manifest.csv")["sample_id"])
    assert (prepared["split"] == "val").sum() == (before["split"] == "val").sum() - 3  # after the second file too
    # the history counts the unlearned training rows only
    champion = json.loads((root / "state" / "champion.json").read_text())
    assert champion["history"][0]["n_forgotten"] == 2 and champion["history"][0]["batch_id"] == r["batch_id"]


def test_the_batch_validated_on_the_remaining_validation_rows(applied):
    """The certificate of the mixed batch (its per-sample KLoM table, one row per evaluated sample) holds every
    validation row but the two the file erased, and the unlearned rows as its forget split."""
    root, _, before, train_ids, val_ids, first, _ = applied
    tables = [json.loads(f.read_text()) for f in (root / "mlartifacts").rglob("per_sample_klom.json")]
    assert tables
    n_val = int((before["split"] == "val").sum())
    for t in tables:
        df = pd.DataFrame(t["data"], columns=t["columns"])
        assert (df["split"] == "forget").sum() == 2
        assert (df["split"] == "validation").sum() == n_val - 2
        assert not set(val_ids[:2]) & set(df["sample_id"])


def test_a_file_of_validation_rows_only_keeps_the_champion(applied):
    from unlearning.privacy.ledger import read_ledger

    root, params_path, _, _, val_ids, first, second = applied
    (r,) = second
    assert r["status"] == "applied" and r["method"] is None and r["erased_not_trained_on"] == 1
    assert r["model_version"] == first[0]["model_version"]  # no new model version
    (entry,) = [e for e in read_ledger(root / "state" / "ledger.jsonl") if e["request_id"] == "val-0"]
    assert entry["kind"] == "erased_not_trained_on" and entry["model_version_after"] == first[0]["model_version"]
    assert (root / "requests" / "processed" / "2026-11-30T1000_val_only.csv").is_file()
    from flows.cli import main

    assert main(["--params", str(params_path), "verify-erasure"]) == 0
    # named again: erased already, nothing to do twice
    (root / "requests" / "inbox" / "again.csv").write_text(rows("again", [val_ids[2]]))
    from adapters.request_check import check_file_for, live_state
    from unlearning.config import load_params

    params = load_params(params_path)
    fc = check_file_for(root / "requests" / "inbox" / "again.csv", params, live_state(params), gx=False)
    assert fc.status == "ok" or "erased already" in " ".join(fc.problems)
    (root / "requests" / "inbox" / "again.csv").unlink()


def test_plan_and_validate_of_a_file_of_validation_rows_only(applied, capsys, tmp_path):
    from flows.cli import main

    root, params_path, before, _, val_ids, *_ = applied
    left = [s for s in before.loc[before["split"] == "val", "sample_id"] if s not in val_ids][:2]
    f = tmp_path / "val_only.csv"
    f.write_text(rows("v", left))
    assert main(["--params", str(params_path), "validate", str(f)]) == 0
    assert "2 name validation rows: erased from the stores, not unlearned" in capsys.readouterr().out
    assert main(["--params", str(params_path), "plan", str(f)]) == 0
    assert "name validation rows only: no model trained on them" in capsys.readouterr().out
