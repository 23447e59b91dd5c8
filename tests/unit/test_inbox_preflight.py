"""Inbox scanning (nothing skipped silently, symlinks leaving the inbox refused), the tombstone list, the
prepared-store rewrite that keeps the state fingerprint, and the fail-fast preflight."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from unlearning.privacy.erasure import add_tombstones, is_erased, npy_rows_found, read_tombstones, row_digests
from unlearning.requests import scan_inbox


def test_scan_inbox_reports_everything_that_is_not_a_request_file(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in ("b.csv", "A.CSV", "c.Parquet", "notes.txt", ".tmp.csv", ".gitkeep"):
        (inbox / name).write_text("x")
    (inbox / "dir.csv").mkdir()
    (tmp_path / "outside.csv").write_text("x")
    os.symlink(tmp_path / "outside.csv", inbox / "leave.csv")
    os.symlink(inbox / "b.csv", inbox / "inside.csv")
    os.symlink(tmp_path / "missing.csv", inbox / "dangling.csv")
    os.symlink(inbox / ".tmp.csv", inbox / "staged.csv")  # the only listed name of a staged dot-file
    files, odd = scan_inbox(inbox)
    assert [p.name for p in files] == ["A.CSV", "b.csv", "c.Parquet", "staged.csv"]
    why = {p.name: w for p, w in odd}
    assert set(why) == {"notes.txt", "dir.csv", "leave.csv", "dangling.csv", "inside.csv"}
    assert "leaving the inbox" in why["leave.csv"] and "dangling" in why["dangling.csv"]
    assert "a symlink to b.csv, which is in the inbox itself" in why["inside.csv"]
    assert "directory" in why["dir.csv"] and "'.txt'" in why["notes.txt"]


def test_tombstones_are_idempotent_and_hashed(tmp_path):
    path = tmp_path / "t.txt"
    assert add_tombstones(path, ["a", "b"]) == 2 and add_tombstones(path, ["b"]) == 0
    assert read_tombstones(path) == {"a", "b"}
    from unlearning.privacy.ledger import hash_sample_id

    hashed = {hash_sample_id("a", "ds")}
    assert is_erased(hashed, True, "ds")("a") and not is_erased(hashed, True, "ds")("b")


def test_tombstones_keep_any_id(tmp_path):
    # ids starting with "#", holding a line break or a tab, with spaces at the ends: the first version wrote
    # them bare and read lines stripped, skipping "#" lines, so "#000" was never tombstoned (and came back)
    path, odd = tmp_path / "t.txt", ["#000", "a\nb", "x\ty ", " lead", "ünï-7", 'q"6,x', ""]
    assert add_tombstones(path, odd) == len(odd)
    assert read_tombstones(path) == set(odd)
    assert all(is_erased(read_tombstones(path), False, "ds")(s) for s in odd)
    assert add_tombstones(path, ["#000"]) == 0


def test_first_version_tombstones_are_read_and_rewritten(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# erased sample ids ...\ndigits-0003\ndigits-0008\n")  # bare ids, no format line
    assert read_tombstones(path) == {"digits-0003", "digits-0008"}
    assert add_tombstones(path, ["#9"]) == 1
    assert read_tombstones(path) == {"digits-0003", "digits-0008", "#9"}
    assert '"digits-0003"' in path.read_text()


def test_a_hand_edited_tombstone_line_is_named(tmp_path):
    from unlearning.io import StateCorrupt

    path = tmp_path / "t.txt"
    add_tombstones(path, ["a"])
    path.write_text(path.read_text() + "b\n")
    with pytest.raises(StateCorrupt, match="line 4 is not a JSON string"):
        read_tombstones(path)


def test_atomic_writes_get_the_usual_file_modes(tmp_path):
    # mkstemp's 0600 would make a rejected file's report unreadable to anyone but its writer
    from unlearning.io import DIR_MODE, FILE_MODE, atomic_write_json, staging_dir

    atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == FILE_MODE
    assert staging_dir(tmp_path / "state").stat().st_mode & 0o777 == DIR_MODE


def test_rewrite_without_keeps_the_dataset_identity(tmp_path):
    from unlearning.data import load_dataset, load_prepared, write_prepared
    from unlearning.data.store import rewrite_without
    from unlearning.privacy.fingerprint import read_dataset_identity

    ds = load_dataset("digits", max_train=40, max_val=10)
    write_prepared(ds, tmp_path / "p")
    before = load_prepared(tmp_path / "p")
    identity = read_dataset_identity(tmp_path / "p")
    gone = before.manifest.loc[before.manifest.split == "train", "sample_id"].tolist()[:3]
    digests = row_digests(np.asarray(before.X)[before.rows(gone)])
    assert npy_rows_found(tmp_path / "p" / "features.npy", digests, before.X.shape[1]) == 3
    assert rewrite_without(tmp_path / "p", tmp_path / "q", lambda s: s in gone) == 3
    after = load_prepared(tmp_path / "q")
    assert len(after.manifest) == len(before.manifest) - 3 and not after.manifest.sample_id.isin(gone).any()
    assert npy_rows_found(tmp_path / "q" / "features.npy", digests, before.X.shape[1]) == 0
    assert read_dataset_identity(tmp_path / "q") == identity  # the state fingerprint survives the erasure
    # prepare with the same tombstones writes the same store
    write_prepared(ds, tmp_path / "r", erased=lambda s: s in gone)
    assert (tmp_path / "r" / "features.npy").read_bytes() == (tmp_path / "q" / "features.npy").read_bytes()
    assert read_dataset_identity(tmp_path / "r") == identity


def test_unreachable_tracking_server_fails_fast_with_one_line(tmp_path, monkeypatch, capsys):
    from flows.cli import main
    from tests.helpers import make_project

    params = make_project(tmp_path, inbox_files=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    start = time.perf_counter()
    assert main(["--params", str(params), "run"]) == 2
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "http://127.0.0.1:9" in err and "MLFLOW_TRACKING_URI" in err
    assert not (tmp_path / "state").exists()


def test_tracking_preflight_sqlite_not_writable(tmp_path):
    from adapters.tracking import TrackingUnavailable, preflight

    with pytest.raises(TrackingUnavailable, match="not writable"):
        preflight(f"sqlite:///{tmp_path}/missing-folder/mlflow.db")


@pytest.mark.parametrize("damage", ["truncated", "not_a_database"])
def test_a_damaged_sqlite_store_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, damage):
    """A truncated or overwritten mlflow.db: `unlearn run` answers in one line with the fix (exit 2) before the
    Prefect server starts or MLflow is imported; the flows' own preflight says the same."""
    import sqlite3

    from flows.cli import main
    from adapters.tracking import TrackingUnavailable, preflight
    from tests.helpers import make_project

    params = make_project(tmp_path, inbox_files=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE t (x TEXT);" + "INSERT INTO t VALUES (hex(randomblob(500)));" * 50)
    con.close()
    raw = db.read_bytes()
    db.write_bytes(raw[:4096] if damage == "truncated" else b"garbage, not SQLite" * 100)
    start = time.perf_counter()
    assert main(["--params", str(params), "run"]) == 2
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable SQLite database" in err and "base.paths.mlflow_db" in err
    assert not (tmp_path / "state").exists()
    with pytest.raises(TrackingUnavailable, match="not a readable SQLite database"):
        preflight(f"sqlite:///{db}")
    db.unlink()
    preflight(f"sqlite:///{db}")  # no file yet: MLflow creates the store


def test_prefect_api_preflight_fails_in_seconds_with_the_fix(tmp_path, monkeypatch):
    import time

    from flows.deletion_batch import preflight
    from tests.helpers import make_project
    from unlearning.config import load_params

    params = load_params(make_project(tmp_path, inbox_files=False))
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens on port 9
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"Prefect API http://127.0.0.1:9/api is unreachable.*prefect server start"):
        preflight(params)
    assert time.perf_counter() - start < 10


def test_leftover_dot_files_are_reported_after_a_while(tmp_path):
    from unlearning.requests import leftover_dot_files

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in (".old.csv", ".new.csv", ".gitkeep", "a.csv"):
        (inbox / name).write_text("x")
    old = time.time() - 3600
    os.utime(inbox / ".old.csv", (old, old))
    os.utime(inbox / ".gitkeep", (old, old))
    assert [(p.name, round(age / 60)) for p, age in leftover_dot_files(inbox)] == [(".old.csv", 60)]
