"""With deletion.hash_sample_ids the kept request files and the problem lines name no forgotten id in plain
text (an audit found the applied files moved as they were, a rejected resubmission of an erased id quoting it
in its error report, MLflow and Prefect); the verifier reads the kept files and says when one still does;
the team's own source table is checked and reported as a note."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flows.deletion_batch import processed
from tasks import erasure as E
from adapters.request_check import check_request_file
from unlearning.config import parse_params
from unlearning.privacy.erasure import id_key
from unlearning.privacy.salt import write_salt
from unlearning.requests import kept_request_suffix, plain_forgotten_ids, read_request_file, redacted_request_bytes

H = "request_id,sample_id,requested_at,reason"
SALT = "hmac-sha256:" + "7a" * 32  # the project's id key (a layer of unlearning/privacy/salt.py)
KEY = id_key(True, SALT)


def write(path, *ids):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(H + "".join(f"\nq{i},{s},2026-11-30T09:00:00Z,gdpr" for i, s in enumerate(ids)) + "\n")
    return path


def project(tmp_path, hashed=True):
    params = parse_params({"deletion": {"hash_sample_ids": hashed}}, root=tmp_path)
    prepared = params.path("prepared_dir")
    prepared.mkdir(parents=True)
    (prepared / "dataset.json").write_text(json.dumps({"name": "table"}))
    write_salt(params.path("salt"), SALT)  # the project's id key: KEY hashes with it
    return params


def test_redacted_bytes_key_every_id_or_only_the_forgotten_ones(tmp_path):
    f = write(tmp_path / "a.csv", "ZZSECRET-1", "ZZSECRET-2", KEY("ZZSECRET-3"))
    every = tmp_path / "every.csv"
    every.write_bytes(redacted_request_bytes(f, KEY))
    assert read_request_file(every)["sample_id"].tolist() == [KEY("ZZSECRET-1"), KEY("ZZSECRET-2"), KEY("ZZSECRET-3")]
    assert read_request_file(every)["reason"].tolist() == ["gdpr"] * 3  # the rest of the file as it was
    some = tmp_path / "some.csv"
    some.write_bytes(redacted_request_bytes(f, KEY, {KEY("ZZSECRET-2")}))
    assert read_request_file(some)["sample_id"].tolist() == ["ZZSECRET-1", KEY("ZZSECRET-2"), KEY("ZZSECRET-3")]
    assert redacted_request_bytes(every, KEY) is None  # nothing left to key
    assert plain_forgotten_ids(f, KEY, {KEY("ZZSECRET-2"), KEY("ZZSECRET-3")}) == 1  # the keyed one is no leak


def test_parquet_and_kept_copies_are_request_files_too(tmp_path):
    pq = tmp_path / "b.parquet"
    pd.DataFrame({"request_id": ["q1"], "sample_id": ["ZZSECRET-9"], "requested_at": ["2026-11-30T09:00:00Z"],
                  "reason": ["gdpr"]}).to_parquet(pq)
    out = tmp_path / "out.parquet"
    out.write_bytes(redacted_request_bytes(pq, KEY))
    assert pd.read_parquet(out)["sample_id"].tolist() == [KEY("ZZSECRET-9")]
    copy = write(tmp_path / "a.csv.2", "ZZSECRET-1")  # the second file of one name (move_unique)
    assert kept_request_suffix(copy) == ".csv" and plain_forgotten_ids(copy, KEY, {KEY("ZZSECRET-1")}) == 1
    assert redacted_request_bytes(tmp_path / "notes.txt", KEY) is None


def test_an_applied_file_is_kept_with_keyed_ids_and_once(tmp_path):
    params = project(tmp_path)
    inbox = params.path("inbox")
    dest = processed(write(inbox / "r.csv", "ZZSECRET-1"), params)
    assert "ZZSECRET-1" not in dest.read_text() and KEY("ZZSECRET-1") in dest.read_text()
    again = processed(write(inbox / "r.csv", "ZZSECRET-1"), params)  # the same file dropped again
    assert again == dest and sorted(p.name for p in dest.parent.iterdir()) == ["r.csv"]
    plain = project(tmp_path / "plain", hashed=False)
    kept = processed(write(plain.path("inbox") / "r.csv", "ZZSECRET-1"), plain)
    assert "ZZSECRET-1" in kept.read_text()  # without hashing the applied file is the reference, as it was


def test_erasure_rewrites_kept_files_that_name_an_erased_id_and_verify_reads_them(tmp_path):
    params = project(tmp_path)
    rejected = write(params.path("rejected") / "late.csv", "ZZSECRET-1", "ZZSECRET-7")  # 7 is not erased
    forgotten = {KEY("ZZSECRET-1")}
    stores = E._redact_request_files(params, KEY, forgotten)
    assert {s["store"]: s["redacted_files"] for s in stores}["rejected request files"] == ["late.csv"]
    ids = read_request_file(rejected)["sample_id"].tolist()
    assert ids == [KEY("ZZSECRET-1"), "ZZSECRET-7"]  # only the erased id: the rest is the team's to correct
    write(params.path("processed") / "old.csv", "ZZSECRET-1")  # left plain (e.g. moved before this release)
    found = {store: sum(plain_forgotten_ids(f, KEY, forgotten) for f in files)
             for store, _, files in E.kept_request_files(params)}
    assert found == {"processed request files": 1, "rejected request files": 0}


def test_a_rejected_resubmission_of_an_erased_id_does_not_quote_it(tmp_path):
    """The id was erased by an earlier batch (tombstoned): the problem line names its row and its keyed form."""
    manifest = pd.DataFrame({"sample_id": ["ZZSECRET-2"], "split": ["train"], "label": [0], "status": ["retained"]})
    f = write(tmp_path / "again.csv", "ZZSECRET-1")
    fc = check_request_file(f, manifest, [], hash_ids=True, salt=SALT, tombstoned={KEY("ZZSECRET-1")})
    text = " ".join(fc.problems)
    assert fc.status == "invalid" and "erased already" in text, fc.problems
    assert "ZZSECRET-1" not in text and repr(KEY("ZZSECRET-1")) in text and "row 1" in text
    plain = check_request_file(f, manifest, [], salt=SALT, tombstoned={"ZZSECRET-1"})
    assert "'ZZSECRET-1'" in " ".join(plain.problems)  # without hashing the line quotes the id as written


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_the_source_table_is_checked_and_only_reported(tmp_path, fmt):
    source = tmp_path / f"t.{fmt}"
    frame = pd.DataFrame({"id": ["007", "ZZSECRET-1", "x"], "y": [0, 1, 0]})
    frame.to_csv(source, index=False) if fmt == "csv" else frame.to_parquet(source)
    prepared = type("P", (), {"info": {"source": {"type": "table", "path": str(source), "id_column": "id"}}})()
    params = parse_params({}, root=tmp_path)
    plain = id_key(False, SALT)
    assert E.source_table_checks(params, prepared, plain, {"ZZSECRET-1", "7"}) == [
        {"store": "source table", "path": str(source), "forgotten_rows_at_the_source": 1}]  # '007' is not '7'
    assert E.source_table_checks(params, prepared, KEY, {KEY("007")})[0]["forgotten_rows_at_the_source"] == 1
    digits = type("P", (), {"info": {"source": {"type": "digits"}}})()
    assert E.source_table_checks(params, digits, plain, {"x"}) == []


def test_the_source_image_folder_is_checked_and_only_reported(tmp_path):
    # verify-erasure counted forgotten rows left in a source table, but said nothing of a source image folder
    import numpy as np
    from PIL import Image

    from flows.cli import _source_note

    root = tmp_path / "images"
    for name in ["cats/a.png", "cats/ZZSECRET b.png", "dogs/c.png"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((2, 2), dtype=np.uint8)).save(root / name)
    prepared = type("P", (), {"info": {"source": {"type": "image_folder", "path": str(root)}}})()
    params = parse_params({}, root=tmp_path)
    [check] = E.source_folder_checks(params, prepared, KEY, {KEY("cats/ZZSECRET b"), KEY("dogs/gone")})
    assert check == {"store": "source image folder", "path": str(root), "forgotten_rows_at_the_source": 1,
                     "first_files": ["cats/ZZSECRET b.png"]}
    assert "1 forgotten image(s) (cats/ZZSECRET b.png)" in _source_note(check)
    assert "prepare.image_folder.path" in _source_note(check)
    assert E.source_folder_checks(params, prepared, KEY, {KEY("dogs/gone")})[0]["forgotten_rows_at_the_source"] == 0
    table = type("P", (), {"info": {"source": {"type": "table", "path": str(root)}}})()
    assert E.source_folder_checks(params, table, KEY, {KEY("cats/a")}) == []
