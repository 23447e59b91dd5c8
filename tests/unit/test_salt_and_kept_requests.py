"""The project's secret id key (unlearning/privacy/salt.py) and how long an applied request file keeps its plain ids
(erasure.keep_request_files; docs/erasure.md)."""

from __future__ import annotations

import json
import os
import stat
import time
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT
from flows.deletion_batch import RequestFileSettings, _expire_request_files, processed
from tasks.stores.base import ErasureSettings
from tasks.stores.requests import RequestFiles, redact_request_files
from unlearning.config import ConfigError, load_params, parse_params
from unlearning.privacy.erasure import add_tombstones, id_key
from unlearning.io import StateCorrupt
from unlearning.privacy.salt import SaltLost, create_salt, id_salt, project_salt, remove_state_copy, write_salt

H = "request_id,sample_id,requested_at,reason"
PARAMS = ROOT / "params.yaml"


def project(tmp_path, **overrides):
    params = parse_params(overrides, root=tmp_path)
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "data" / "prepared" / "dataset.json").write_text(json.dumps({"name": "digits"}))
    return params


def drop(params, name: str, *ids: str):
    inbox = params.path("inbox")
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / name).write_text(H + "".join(f"\nq{i},{s},2026-11-30T09:00:00Z,gdpr" for i, s in enumerate(ids)) + "\n")
    return inbox / name


def test_the_key_is_random_private_made_once_and_never_in_the_state(tmp_path):
    params = project(tmp_path)
    assert params.deletion.hash_sample_ids  # on by default
    key = id_salt(params)
    path = params.path("salt")
    assert path == tmp_path / ".unlearning" / "salt" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # its folder lists no name to another user either
    assert key.startswith("hmac-sha256:") and len(key) == len("hmac-sha256:") + 64 and id_salt(params) == key
    assert id_salt(project(tmp_path / "other")) != key  # per project
    assert create_salt(path) == key  # a second creator (a concurrent first run) gets the same key
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "salt").write_text("an older version's copy\n")
    assert remove_state_copy(stage) and not (stage / "salt").exists()  # a state folder never carries it


def test_no_salt_is_made_for_plain_ids(tmp_path):
    params = project(tmp_path, deletion={"hash_sample_ids": False})
    assert id_salt(params) == "" and not params.path("salt").exists()


def test_a_lost_key_is_refused_never_replaced(tmp_path, monkeypatch):
    params = project(tmp_path)
    key = id_salt(params)
    add_tombstones(params.path("tombstones"), [id_key(True, key)("s1")])
    params.path("salt").unlink()
    with pytest.raises(SaltLost, match="id key is missing.*hold ids hashed with it.*Restore it from your backup"):
        project_salt(params)
    assert not params.path("salt").exists()  # not silently replaced: the tombstones would match nothing
    monkeypatch.setenv("UNLEARNING_ID_KEY", key)  # the key from the environment (a secret store) instead
    assert project_salt(params) == key and not params.path("salt").exists()
    write_salt(params.path("salt"), "hmac-sha256:" + "0" * 64)
    with pytest.raises(StateCorrupt, match="UNLEARNING_ID_KEY and .* hold different id keys"):
        project_salt(params)


def test_keep_request_files_is_validated():
    with pytest.raises(ConfigError, match=r"erasure.keep_request_files = 'forever'.*allowed: until_applied"):
        load_params(PARAMS, {"erasure": {"keep_request_files": "forever"}})
    with pytest.raises(ConfigError, match="erasure.keep_request_files = -1"):
        load_params(PARAMS, {"erasure": {"keep_request_files": -1}})
    assert load_params(PARAMS, {"erasure": {"keep_request_files": 7}}).erasure.request_file_days() == 7
    assert load_params(PARAMS).erasure.request_file_days() == 0


def test_by_default_an_applied_file_keeps_hashed_ids_only(tmp_path):
    params = project(tmp_path)
    dest = processed(drop(params, "a.csv", "ZZSECRET-1"), RequestFileSettings.of(params))
    text = dest.read_text()
    assert "ZZSECRET-1" not in text and id_key(True, id_salt(params))("ZZSECRET-1") in text


def test_kept_days_then_hashed(tmp_path):
    params = project(tmp_path, erasure={"keep_request_files": 3})
    key = id_key(True, id_salt(params))
    dest = processed(drop(params, "a.csv", "ZZSECRET-1", "ZZSECRET-2"), RequestFileSettings.of(params))
    assert "ZZSECRET-1" in dest.read_text()  # kept as it came, for 3 days
    add_tombstones(params.path("tombstones"), [key("ZZSECRET-1"), key("ZZSECRET-2")])
    tomb = {key("ZZSECRET-1"), key("ZZSECRET-2")}
    redact_request_files(params.project_paths, params.erasure, key, tomb)  # an erasure pass within the days: left alone
    assert "ZZSECRET-1" in dest.read_text()
    scope = type("S", (), {"settings": ErasureSettings.of(params), "hash_ids": True, "key": key, "forgotten": tomb,
                           "tombstones": tomb})()
    (processed_finding, _) = RequestFiles().verify(scope)
    assert processed_finding.problems == () and "a.csv" in processed_finding.counts["plain_ids_kept_until"]
    assert _expire_request_files(RequestFileSettings.of(params)) == []
    old = time.time() - 4 * 86400
    os.utime(dest, (old, old))  # the days are over
    assert _expire_request_files(RequestFileSettings.of(params)) == ["a.csv"]
    text = dest.read_text()
    assert "ZZSECRET" not in text and key("ZZSECRET-2") in text
    (processed_finding, _) = RequestFiles().verify(scope)
    assert processed_finding.problems == () and "plain_ids_kept_until" not in processed_finding.counts


def test_plain_tombstones_from_before_the_default_still_erase(tmp_path):
    """A project that erased with plain ids (hash_sample_ids was false by default) keeps those rows out after the
    switch to hashed ids: prepare and the erasure read a plain tombstone as erased."""
    from unlearning.privacy.erasure import is_erased

    params = project(tmp_path)
    key = id_key(True, id_salt(params))
    erased = is_erased({"old-plain-id", key("new-id")}, True, id_salt(params))
    assert erased("old-plain-id") and erased("new-id") and not erased("kept-id")
    assert not is_erased({key("new-id")}, True, id_salt(params))("sha256:whatever")


def test_a_rejected_file_never_keeps_an_erased_id_and_expires_after_its_days(tmp_path):
    """A rejected file keeps its ids (to be fixed and dropped again), but an erased one is hashed at once: at the
    rejection, and by every run's and `unlearn erase`'s pass (`redact_erased_ids`), so verify-erasure never waits
    for a batch that will not come; with keep_request_files N days, every id is hashed N days after the rejection."""
    from flows.intake import reject
    from tasks.inbox_ops import redact_erased_ids

    params = project(tmp_path, erasure={"keep_request_files": 3})
    key = id_key(True, id_salt(params))
    assert redact_erased_ids(RequestFileSettings.of(params)) == []  # nothing erased yet
    add_tombstones(params.path("tombstones"), [key("ZZSECRET-1")])  # an earlier batch erased it
    dest = reject(drop(params, "a.csv", "ZZSECRET-1", "ZZSECRET-2"), params, "not deleted already: row 1")
    assert redact_erased_ids(RequestFileSettings.of(params), [dest]) == ["a.csv"]  # the rejection's own pass
    text = dest.read_text()
    assert "ZZSECRET-1" not in text and key("ZZSECRET-1") in text and "ZZSECRET-2" in text  # not erased: kept
    # an older version's rejected file, plain erased ids and all: the next run or `unlearn erase` rewrites it
    older = params.path("rejected") / "b.csv"
    older.write_text(H + "\nq0,ZZSECRET-1,2026-11-30T09:00:00Z,gdpr\n")
    tomb = {key("ZZSECRET-1")}
    scope = SimpleNamespace(settings=ErasureSettings.of(params), hash_ids=True, key=key, forgotten=tomb,
                            tombstones=tomb)
    rejected_finding = RequestFiles().verify(scope)[1]
    assert rejected_finding.problems and "`unlearn erase` rewrites them" in rejected_finding.problems[0]
    requests = RequestFileSettings.of(params)
    assert redact_erased_ids(requests) == ["b.csv"] and "ZZSECRET-1" not in older.read_text()
    assert RequestFiles().verify(scope)[1].problems == ()
    # within its 3 days the rejected file keeps its other ids; then every id is hashed
    assert _expire_request_files(RequestFileSettings.of(params)) == []
    report = dest.with_name(dest.name + ".error.json")
    data = json.loads(report.read_text())
    report.write_text(json.dumps({**data, "rejected_at": "2020-01-01T00:00:00+00:00"}))
    assert _expire_request_files(RequestFileSettings.of(params)) == ["a.csv"]
    assert "ZZSECRET" not in dest.read_text() and key("ZZSECRET-2") in dest.read_text()
