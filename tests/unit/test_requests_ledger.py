import json

import pandas as pd
import pytest

from unlearning.data import initial_state_manifest, load_dataset, manifest_of
from unlearning.io import commit_dir, recover_dir, staging_dir
from unlearning.privacy.ledger import LEDGER_FIELDS, LedgerError, appended, hash_sample_id, ledger_text, read_ledger
from unlearning.requests import (
    RequestValidationError, batch_objective, coerce_requests, list_request_files, read_request_file,
    structural_problems,
)


def frame(**cols):
    base = {"request_id": ["r1", "r2"], "sample_id": ["digits-0001", "digits-0002"],
            "requested_at": ["2026-11-01T10:00:00Z", "2026-11-02"], "reason": ["gdpr", "ccpa"]}
    base.update(cols)
    return pd.DataFrame(base)


def test_good_frame_has_no_problems_and_coerces_timestamps():
    df = frame()
    assert structural_problems(df) == []
    out = coerce_requests(df)
    assert str(out["requested_at"].dt.tz) == "UTC"


def test_every_problem_is_listed_at_once():
    df = frame(request_id=["r1", "r1"], requested_at=["yesterday", "2026-11-02"], extra=[1, 2])
    problems = structural_problems(df)
    text = "\n".join(problems)
    assert "'r1' appears more than once" in text
    assert "'yesterday' is not a valid timestamp" in text
    assert "unexpected column 'extra'" in text
    assert len(problems) == 3


def test_missing_columns_and_empty_batch():
    problems = structural_problems(pd.DataFrame({"sample_id": []}))
    assert any("empty" in p for p in problems)
    assert any("missing column" in p and "request_id" in p for p in problems)


def test_objective_column():
    df = frame(objective=["suppression", "suppression"])
    assert structural_problems(df) == []
    assert batch_objective(df, "retrain_equivalence") == "suppression"
    assert any("not allowed" in p for p in structural_problems(frame(objective=["forget-it", None])))
    with pytest.raises(RequestValidationError, match="mixes"):
        batch_objective(frame(objective=["suppression", "retrain_equivalence"]), "retrain_equivalence")


def test_read_csv_parquet_and_bad_suffix(tmp_path):
    frame().to_csv(tmp_path / "a.csv", index=False)
    frame().to_parquet(tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text("x")
    assert read_request_file(tmp_path / "a.csv")["sample_id"].tolist() == ["digits-0001", "digits-0002"]
    assert read_request_file(tmp_path / "b.parquet")["request_id"].tolist() == ["r1", "r2"]
    with pytest.raises(RequestValidationError, match="not supported"):
        read_request_file(tmp_path / "c.txt")
    assert [p.name for p in list_request_files(tmp_path)] == ["a.csv", "b.parquet"]


def test_csv_ids_stay_text(tmp_path):
    (tmp_path / "a.csv").write_text("request_id,sample_id,requested_at,reason\n007,0012,2026-01-01,x\n")
    df = read_request_file(tmp_path / "a.csv")
    assert df["request_id"].tolist() == ["007"] and df["sample_id"].tolist() == ["0012"]


def entry(rid, **kw):
    e = {f: "x" for f in LEDGER_FIELDS}
    e.update(request_id=rid, **kw)
    return e


def test_ledger_is_append_only_and_keyed_by_request_id(tmp_path):
    entries = appended([], [entry("r1"), entry("r2")])
    path = tmp_path / "ledger.jsonl"
    path.write_text(ledger_text(entries))
    again = read_ledger(path)
    assert again == entries
    grown = appended(again, [entry("r3")])
    assert grown[:2] == entries  # earlier entries untouched
    with pytest.raises(LedgerError, match="already in the ledger"):
        appended(grown, [entry("r2")])
    with pytest.raises(LedgerError, match="lacks fields"):
        appended([], [{"request_id": "r9"}])


def test_corrupt_ledger_is_reported(tmp_path):
    (tmp_path / "l.jsonl").write_text(json.dumps(entry("r1")) + "\n{oops\n")
    with pytest.raises(LedgerError, match=":2: corrupt"):
        read_ledger(tmp_path / "l.jsonl")


def test_hashed_ids_are_salted_and_stable():
    assert hash_sample_id("a", "digits") == hash_sample_id("a", "digits")
    assert hash_sample_id("a", "digits") != hash_sample_id("a", "fashion")


def test_commit_dir_swaps_atomically_and_recovers(tmp_path):
    target = tmp_path / "state"
    target.mkdir()
    (target / "f").write_text("old")
    stage = staging_dir(target)
    assert (stage / "f").read_text() == "old"  # staging starts as a copy
    (stage / "f").write_text("new")
    assert (target / "f").read_text() == "old"  # nothing visible before the commit
    commit_dir(stage, target)
    assert (target / "f").read_text() == "new" and not stage.exists()
    # A crash between the two renames of a commit: the previous folder is restored.
    (tmp_path / ".state.previous").mkdir()
    (tmp_path / ".state.previous" / "f").write_text("prev")
    target.rename(tmp_path / "gone")
    staging_dir(target)  # an abandoned staging folder
    recover_dir(target)
    assert (target / "f").read_text() == "prev"
    assert not list(tmp_path.glob(".state.staging-*"))


def test_state_manifest_schema():
    m = initial_state_manifest(manifest_of(load_dataset("digits", max_train=20, max_val=5)))
    assert set(m["status"]) == {"retained"}
