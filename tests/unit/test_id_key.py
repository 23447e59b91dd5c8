"""The id key (unlearning/privacy/salt.py) and its re-keying (unlearning/privacy/rekey.py, tasks/rekey.py): HMAC-SHA256 under a
key nobody but the pipeline reads; an older project, whose salt was backed up with the state into the DVC cache
and remote, re-keyed once, in place, idempotently and crash-safely; and the attack of docs/erasure.md's threat
model: someone who reads only the DVC cache and remote hashes every possible id with everything found there.
Before the migration that recovers every erased id; after it, none."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from tasks import rekey as tasks_rekey
from unlearning.privacy import rekey
from unlearning.config import parse_params
from unlearning.privacy.erasure import add_tombstones, read_tombstones, tombstones_digest
from unlearning.io import StateCorrupt
from unlearning.privacy.salt import (
    HASH_PREFIX, KeyMigrationNeeded, hash_sample_id, id_salt, key_exposure, migration_pending, project_salt,
    read_salt, write_salt,
)

SALT = "ab" * 32  # an older version's salt
IDS = [f"user-{i:04d}@example.com" for i in range(300)]  # every id the table ever had
B0, B1, B2 = IDS[12:15], IDS[:8], IDS[8:12]  # erased before a reset (archived ledger), then by two batches
ERASED = B0 + B1 + B2


def rekeying(params) -> tuple:
    """What tasks.rekey's migrate and rotate read of the params (its `main` passes the same)."""
    return params.project_paths, params.operations, params.erasure, params.mlflow_tracking_uri()


def legacy(sample_id: str) -> str:
    """The older version's salted form, written out here (not through the code under test)."""
    return "sha256:" + hashlib.sha256(f"{SALT}:{sample_id}".encode()).hexdigest()


def test_the_keyed_hash_is_hmac_sha256_of_the_id():
    key = "hmac-sha256:" + "0f" * 32
    expected = hmac.new(bytes.fromhex("0f" * 32), b"user-0001@example.com", hashlib.sha256).hexdigest()
    assert hash_sample_id("user-0001@example.com", key) == HASH_PREFIX + expected
    assert hash_sample_id(HASH_PREFIX + expected, key) == HASH_PREFIX + expected  # keyed already: as it is
    with pytest.raises(StateCorrupt, match="not hmac-sha256:<64 hex digits>"):
        hash_sample_id("x", "hmac-sha256:0f0f")  # a cut key is refused, not used as a weaker one


def test_a_migrated_key_matches_ids_erased_before_and_after_it():
    m = rekey.migration(SALT, "hmac-sha256:" + "11" * 32)
    # an id erased before: its stored legacy form gets the HMAC layer; the same id hashed now gives that form
    stored = m.rewrite(legacy("user-0001@example.com"))
    assert stored == hash_sample_id("user-0001@example.com", m.key)
    assert stored == HASH_PREFIX + hmac.new(bytes.fromhex("11" * 32), legacy("user-0001@example.com").encode(),
                                            hashlib.sha256).hexdigest()
    r = rekey.rotation(m.key, "hmac-sha256:" + "22" * 32)  # then a rotation: one more layer, same rule
    assert r.rewrite(stored) == hash_sample_id("user-0001@example.com", r.key) != stored


def legacy_project(root: Path):
    """An older version's project: its salt in the key file and in state/salt, ids keyed `sha256:` in every
    store, a DVC cache and remote holding the state's objects (the ledger and the salt), an archived state."""
    params = parse_params({}, root=root)
    write_salt(params.path("salt"), SALT)  # a bare salt: the older version's key file
    state, archive = params.path("state_dir"), params.path("archive_dir") / "20260101T000000Z" / "state"
    for folder, batches in ((archive, {"b0": B0}), (state, {"b1": B1, "b2": B2})):
        folder.mkdir(parents=True)
        (folder / "ledger.jsonl").write_text("".join(
            json.dumps({"request_id": f"{b}-{i}", "sample_id": legacy(s), "batch_id": b}) + "\n"
            for b, ids in batches.items() for i, s in enumerate(ids)))
        write_salt(folder / "salt", SALT)
    add_tombstones(params.path("tombstones"), map(legacy, ERASED))
    before = {"T0": tombstones_digest(set(map(legacy, B0))), "T": tombstones_digest(set(map(legacy, ERASED)))}
    (state / "champion.json").write_text(json.dumps({"model_version": "3", "started_clean_of": before["T0"]}))
    params.path("models_dir").mkdir()
    torch.save({"extra": {"erased_through": before["T"], "origin": "champion after erasure"}},
               params.path("models_dir") / "original.pt")
    (state / "erasure").mkdir()
    (state / "erasure" / "b1.json").write_text(json.dumps({"batch_id": "b1", "row_digests": [legacy("row-1")]}))
    params.path("processed").mkdir(parents=True)
    (params.path("processed") / "r.csv").write_text("request_id,sample_id\n" + "".join(
        f"q{i},{legacy(s)}\n" for i, s in enumerate(B1)))
    art = params.path("mlflow_artifacts") / "run1" / "artifacts"
    art.mkdir(parents=True)
    (art / "per_sample_klom.json").write_text(json.dumps({"sample_id": [legacy(s) for s in B2], "klom": [0.1] * 4}))
    (art / "requirements.txt").write_text("torch==2.13.0 --hash=sha256:" + "c" * 64 + "\n")  # no id: untouched
    cache = params.path("cache_dir") / "ensembles"
    cache.mkdir(parents=True)
    (cache / "k1.ids.json").write_text(json.dumps({"id_hashes": [legacy(s) for s in IDS[20:]]}))
    (cache / "k1.pt").write_bytes(b"\0weights")
    for store in (root / ".dvc" / "cache", root / "dvc-remote"):  # `dvc push` of the state: its ledger and salt
        for content in ((state / "ledger.jsonl").read_bytes(), (state / "salt").read_bytes()):
            digest = hashlib.md5(content).hexdigest()
            obj = store / "files" / "md5" / digest[:2] / digest[2:]
            obj.parent.mkdir(parents=True, exist_ok=True)
            obj.write_bytes(content)
            obj.chmod(0o444)  # as DVC leaves its objects
    return params, before


def dictionary_attack(folders: list[Path], candidates: list[str]) -> set[str]:
    """What someone who reads only `folders` recovers: every token of 16 or more characters found in a text file
    there (a salt or a key is 32 random bytes: 64 hex digits) tried as a salt and as an HMAC key, every candidate id
    hashed with it, matched against every keyed form found in any file there."""
    files = [f for d in folders for f in d.rglob("*") if f.is_file()]
    blobs = [f.read_bytes() for f in files]
    found = {m.decode() for b in blobs for m in re.findall(rb"(?:hmac-)?sha256:[0-9a-f]{64}", b)}
    tokens = {t.decode() for b in blobs if b"\0" not in b[:8192]
              for t in re.findall(rb"[A-Za-z0-9_+/=.@-]{16,200}", b)}
    recovered = set()
    for token in tokens:
        keys = [token.encode()] + ([bytes.fromhex(token)] if re.fullmatch(r"[0-9a-f]{64}", token) else [])
        salted = token.encode() + b":"
        for s in candidates:
            forms = {"sha256:" + hashlib.sha256(salted + s.encode()).hexdigest()}
            forms |= {HASH_PREFIX + hmac.new(k, s.encode(), hashlib.sha256).hexdigest() for k in keys}
            if forms & found:
                recovered.add(s)
    return recovered


def test_the_dvc_cache_and_remote_alone_recover_every_erased_id_before_the_migration_and_none_after(
        tmp_path, monkeypatch):
    params, _ = legacy_project(tmp_path)
    shared = [tmp_path / ".dvc" / "cache", tmp_path / "dvc-remote"]
    assert dictionary_attack(shared, IDS) == set(B1 + B2)  # the hole: the salt lies beside the ledger
    committed = []
    monkeypatch.setattr(tasks_rekey, "recommit", lambda paths, erasure, operations: committed.append(paths.root) or {"committed": True})
    done = tasks_rekey.migrate(*rekeying(params))
    dvc_copies = [d for d in done["deleted"] if ".dvc" in d or "dvc-remote" in d]
    assert committed == [params.root] and len(dvc_copies) == 2  # the salt's object in the cache and the remote
    assert dictionary_attack(shared, IDS) == set()  # no salt there any more, and none of the key
    places = {Path(p.where).name: p for p in key_exposure(params.path, tasks_rekey.shared_roots(params.project_paths, params.operations))}
    assert set(places) == {"salt"} and places["salt"].problem is None  # the key file alone, owner-only


def test_the_migration_rewrites_every_store_in_place_and_the_key_still_matches(tmp_path, monkeypatch):
    params, before = legacy_project(tmp_path)
    monkeypatch.setattr(tasks_rekey, "recommit", lambda *slices: {})
    with pytest.raises(KeyMigrationNeeded, match="older version's salt"):
        id_salt(params)  # no id is compared against half-migrated stores
    tasks_rekey.migrate(*rekeying(params))
    key = id_salt(params)
    assert key.splitlines()[0] == f"legacy-salt:{SALT}" and key.splitlines()[1].startswith("hmac-sha256:")
    path = params.path("salt")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not (params.path("state_dir") / "salt").exists()
    assert not list(params.path("archive_dir").glob("*/state/salt"))
    assert not (params.path("cache_dir") / "ensembles").exists()  # keyed by digests of id sets: trained again
    new = {s: hash_sample_id(s, key) for s in IDS}
    assert read_tombstones(params.path("tombstones")) == {new[s] for s in ERASED}
    ledger = [json.loads(line) for line in (params.path("state_dir") / "ledger.jsonl").read_text().splitlines()]
    assert [e["sample_id"] for e in ledger] == [new[s] for s in B1 + B2]
    assert json.loads((params.path("mlflow_artifacts") / "run1/artifacts/per_sample_klom.json").read_text())[
        "sample_id"] == [new[s] for s in B2]
    assert "--hash=sha256:" + "c" * 64 in (params.path("mlflow_artifacts") / "run1/artifacts/requirements.txt"
                                          ).read_text()
    report = json.loads((params.path("state_dir") / "erasure" / "b1.json").read_text())
    assert report["row_digests"] == [hash_sample_id(legacy("row-1"), key)]
    # the checkpoints' digests of the tombstone lists follow the lists
    champion = json.loads((params.path("state_dir") / "champion.json").read_text())
    assert champion["started_clean_of"] == tombstones_digest({new[s] for s in B0}) != before["T0"]
    extra = torch.load(params.path("models_dir") / "original.pt", weights_only=False)["extra"]
    assert extra["erased_through"] == tombstones_digest({new[s] for s in ERASED})
    for f in tmp_path.rglob("*"):
        if f.is_file() and ".dvc" not in f.parts and "dvc-remote" not in f.parts:
            assert not re.search(rb"(?<![-\w])sha256:[0-9a-f]{64}(?!\w)", f.read_bytes().replace(
                b"--hash=sha256:", b"")), f  # no older form left anywhere the project writes
    assert not migration_pending(params.path) and tasks_rekey.migrate(*rekeying(params)) is None  # once


def test_a_migration_killed_half_way_finishes_with_the_same_key(tmp_path, monkeypatch):
    params, _ = legacy_project(tmp_path)
    monkeypatch.setattr(tasks_rekey, "recommit", lambda *slices: {})
    real, calls = os.replace, []

    def dies_at_the_third_rename(src, dst):
        if str(src).endswith(rekey.TEMP_SUFFIX):  # a re-keyed file put in place (not a journal write)
            calls.append(dst)
            if len(calls) == 3:
                raise KeyboardInterrupt("killed")
        return real(src, dst)

    monkeypatch.setattr(rekey.os, "replace", dies_at_the_third_rename)
    with pytest.raises(KeyboardInterrupt):
        tasks_rekey.migrate(*rekeying(params))
    monkeypatch.setattr(rekey.os, "replace", real)
    journal = json.loads(rekey.journal_path(params.path).read_text())
    assert len(calls) == 3 and len(journal["renames"]) > 3  # two files re-keyed, the others not yet
    assert journal["phase"] == "commit" and stat.S_IMODE(rekey.journal_path(params.path).stat().st_mode) == 0o600
    assert read_salt(params.path("salt")) == SALT  # the old key stays until every file is re-keyed
    with pytest.raises(KeyMigrationNeeded):
        project_salt(params)
    tasks_rekey.migrate(*rekeying(params))
    key = id_salt(params)
    assert key == journal["key"] and not rekey.journal_path(params.path).exists()
    assert read_tombstones(params.path("tombstones")) == {hash_sample_id(s, key) for s in ERASED}
    ledger = (params.path("state_dir") / "ledger.jsonl").read_text()
    assert all(hash_sample_id(s, key) in ledger for s in B1 + B2) and "\"sha256:" not in ledger


def test_a_rotation_rekeys_every_store_and_an_old_key_recovers_nothing(tmp_path, monkeypatch):
    params, _ = legacy_project(tmp_path)
    monkeypatch.setattr(tasks_rekey, "recommit", lambda *slices: {})
    tasks_rekey.migrate(*rekeying(params))
    old = id_salt(params)
    tasks_rekey.rotate(*rekeying(params))
    key = id_salt(params)
    assert key.startswith(old + "\n") and len(key.splitlines()) == 3
    assert read_tombstones(params.path("tombstones")) == {hash_sample_id(s, key) for s in ERASED}
    assert not read_tombstones(params.path("tombstones")) & {hash_sample_id(s, old) for s in ERASED}
    # the old key leaked (written where the attacker reads): the stores name nothing it can match
    leak = tmp_path / "dvc-remote" / "leaked"
    leak.write_text(old.splitlines()[1].split(":")[1])
    assert dictionary_attack([tmp_path / "dvc-remote", params.path("state_dir")], IDS) == set()


def test_key_exposure_names_every_copy_in_a_shared_place_and_a_readable_key_file(tmp_path):
    params = parse_params({}, root=tmp_path)
    key = id_salt(params)
    (tmp_path / "mlartifacts").mkdir()
    (tmp_path / "mlartifacts" / "notes.txt").write_text(f"key: {key}")
    params.path("salt").chmod(0o644)
    places = key_exposure(params.path, [tmp_path / "mlartifacts"])
    problems = [p.problem for p in places if p.problem]
    assert len(problems) == 2 and "chmod 600" in problems[0] and "notes.txt" in problems[1]
    assert "every local user" in places[0].readers and key not in " ".join(problems)  # never the key itself


def test_the_environment_key_is_named_never_shown(tmp_path, monkeypatch):
    params = parse_params({}, root=tmp_path)
    monkeypatch.setenv("UNLEARNING_ID_KEY", "not-a-key-but-a-secret")
    with pytest.raises(StateCorrupt) as e:
        id_salt(params)
    assert "UNLEARNING_ID_KEY" in str(e.value) and "not-a-key-but-a-secret" not in str(e.value)
    monkeypatch.setenv("UNLEARNING_ID_KEY", "hmac-sha256:" + "3c" * 32)
    assert id_salt(params) == "hmac-sha256:" + "3c" * 32 and not params.path("salt").exists()
    assert [p.where for p in key_exposure(params.path)] == ["environment variable UNLEARNING_ID_KEY"]


def test_a_migration_killed_while_preparing_starts_again_with_the_same_key(tmp_path, monkeypatch):
    params, _ = legacy_project(tmp_path)
    monkeypatch.setattr(tasks_rekey, "recommit", lambda *slices: {})
    real = rekey.prepare_digests

    def killed(*a, **k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(rekey, "prepare_digests", killed)
    with pytest.raises(KeyboardInterrupt):
        tasks_rekey.migrate(*rekeying(params))
    journal = json.loads(rekey.journal_path(params.path).read_text())
    assert journal["phase"] == "prepare" and list(tmp_path.rglob(f"*{rekey.TEMP_SUFFIX}"))  # temps, no rename
    assert read_tombstones(params.path("tombstones")) == set(map(legacy, ERASED))  # nothing replaced yet
    monkeypatch.setattr(rekey, "prepare_digests", real)
    tasks_rekey.migrate(*rekeying(params))
    key = id_salt(params)
    assert key == journal["key"] and not list(tmp_path.rglob(f"*{rekey.TEMP_SUFFIX}"))
    assert read_tombstones(params.path("tombstones")) == {hash_sample_id(s, key) for s in ERASED}


def test_recommit_records_again_only_the_stages_dvc_lock_has_with_their_outputs(tmp_path):
    """A project migrated before its first `dvc repro` has no output to re-commit (`dvc commit` of a missing one
    fails): only a stage dvc.lock records, whose outputs all exist, is committed again."""
    from adapters.dvc_ops import recorded_stages

    names = ["prepare", "train", "deletion"]
    assert recorded_stages(tmp_path, names) == []  # no dvc.lock: never ran
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  prepare:\n    outs:\n    - path: data/prepared\n"
        "  train:\n    outs:\n    - path: models/original.pt\n")
    assert recorded_stages(tmp_path, names) == ["prepare"]  # train's output is gone, deletion never ran
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "original.pt").write_bytes(b"x")
    assert recorded_stages(tmp_path, names) == ["prepare", "train"]
    (tmp_path / "dvc.lock").write_text("stages: [not, a, mapping]\n")  # cut or edited by hand: nothing recorded
    assert recorded_stages(tmp_path, names) == []


@pytest.mark.parametrize("dvc_gc", [False, True])
def test_a_project_that_never_ran_its_stages_has_nothing_to_recommit(tmp_path, dvc_gc):
    """`make setup` re-keys an older project before any `dvc repro`: neither `dvc commit` nor `dvc gc` runs (each
    failed on the missing outputs), whatever erasure.dvc_gc says."""
    from tasks.rekey import recommit
    from unlearning.config import Erasure, Operations, parse_params

    (tmp_path / ".dvc").mkdir()
    paths = parse_params({}, root=tmp_path).project_paths
    assert recommit(paths, Erasure(dvc_gc=dvc_gc), Operations()) == {}
