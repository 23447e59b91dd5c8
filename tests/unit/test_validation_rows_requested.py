"""A request naming a validation row is honoured, not refused (docs/requests.md): the row is erased from the
stores and recorded in the ledger as erased, not trained on; the batch's validation metrics and gate use the
remaining validation rows; the training rows of the same file are unlearned as usual."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd

from adapters.request_check import check_request_file, validation_mask
from tasks.stages import ledger_entries, split_by_kind, unlearned_mask
from unlearning.batch.rows import validation_rows
from unlearning.policy.history import n_original_train, retraining_debt
from unlearning.privacy.ledger import ERASED_NOT_TRAINED_ON, UNLEARNED

H = "request_id,sample_id,requested_at,reason"


def manifest() -> pd.DataFrame:
    ids = [f"d-{i}" for i in range(10)]
    return pd.DataFrame({"sample_id": ids, "split": ["train"] * 7 + ["val"] * 3, "label": [0, 1] * 5,
                         "status": ["retained"] * 10, "deleted_in_batch": [None] * 10})


def requests(ids) -> pd.DataFrame:
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(ids))], "sample_id": ids, "reason": ["gdpr"] * len(ids),
                         "requested_at": [pd.Timestamp("2026-11-28", tz="UTC")] * len(ids)})


def test_a_mixed_file_is_valid_and_counts_its_validation_rows(tmp_path):
    f = tmp_path / "mixed.csv"
    f.write_text(H + "\nr1,d-1,2026-11-30,gdpr\nr2,d-8,2026-11-30,gdpr\nr3,d-2,2026-11-30,gdpr\n")
    fc = check_request_file(f, manifest(), [])
    assert fc.status == "ok" and fc.problems == [] and fc.n_validation == 1
    assert "3 request(s) to apply; 1 name validation rows: erased from the stores, not unlearned" in fc.summary()
    assert validation_mask(manifest(), fc.pending).tolist() == [False, True, False]


def test_the_batch_computes_on_the_remaining_validation_rows():
    import dataclasses

    @dataclasses.dataclass
    class S:
        manifest: pd.DataFrame

    before = S(manifest())
    after, reqs = split_by_kind(before, requests(["d-1", "d-8", "d-2"]), "batch-x")
    assert reqs["kind"].tolist() == [UNLEARNED, ERASED_NOT_TRAINED_ON, UNLEARNED]
    assert unlearned_mask(reqs).tolist() == [True, False, True]
    # V: the validation rows less the one the file names; the state the batch started from is untouched
    assert validation_rows(before.manifest).tolist() == [7, 8, 9]
    assert validation_rows(after.manifest).tolist() == [7, 9]
    assert after.manifest.loc[8, "deleted_in_batch"] == "batch-x" and before.manifest["status"].eq("retained").all()
    # a file without validation rows leaves the state as it is
    same, plain = split_by_kind(before, requests(["d-1"]), "b")
    assert same is before and plain["kind"].tolist() == [UNLEARNED]


def test_the_ledger_records_validation_rows_as_erased_not_trained_on(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("x\n")
    batch = types.SimpleNamespace(path=f, batch_id="batch-x")
    reqs = requests(["d-1", "d-8"]).assign(kind=[UNLEARNED, ERASED_NOT_TRAINED_ON])
    entries = ledger_entries(reqs, batch, False, "salt", objective="retrain_equivalence", method="retrain",
                             before="1", after="2", now="now", fingerprint="fp", verdict="passed")
    assert [(e["kind"], e["method"], e["verdict"]) for e in entries] == [
        (UNLEARNED, "retrain", "passed"), (ERASED_NOT_TRAINED_ON, "none", "not_trained_on")]
    # never trained on: no retraining debt, not part of the original training set
    m = manifest()
    m.loc[[1, 8], "status"] = "deleted"
    assert n_original_train(m, entries) == 7
    debt = retraining_debt(entries, 7)
    assert debt["forgotten_since_retrain"] == 0 and debt["n_batches"] == 1  # retrain clears; counted once
    approx = [dict(e, method="do_nothing") if e["kind"] == UNLEARNED else e for e in entries]
    assert retraining_debt(approx, 7)["forgotten_since_retrain"] == 1


def test_validation_rows_without_a_status_column_are_every_held_out_row():
    m = manifest().drop(columns=["status"])
    assert np.array_equal(validation_rows(m), [7, 8, 9])
