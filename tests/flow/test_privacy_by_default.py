"""Privacy by default (docs/erasure.md, "Hashed ids and the salt"): with the shipped params (no
hash_sample_ids override) a batch, its erasure and its DVC commit leave no forgotten id in plain text in any
file the project wrote: state/ (ledger, manifest, reports), data/ (prepared store, tombstones), the processed
request file, the MLflow store and its artifacts (leverage_forget.json, per_sample_klom.json, ...), the GX
results, the ensemble cache, the DVC cache and remote. The id key is the project's own secret (mode 0600, never in
the state, the DVC cache or remote, or MLflow), and `unlearn lookup` finds an erased id from it."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers import make_project

pytestmark = pytest.mark.flow

DVC_YAML = """stages:
  prepare:
    cmd: "true"
    outs: [data/prepared]
  train:
    cmd: "true"
    outs: [models/original.pt]
  deletion:
    cmd: "true"
    outs:
      - state:
          persist: true
"""
# what the project writes; requests/inbox is the team's own input (the request as it arrived)
WRITTEN = ("state", "data", "requests/processed", "requests/rejected", "mlartifacts", "mlflow.db", "cache",
           "models", "gx", "metrics", ".dvc/cache", "dvc-remote", "dvc.lock", "archive")


@pytest.fixture(scope="module")
def batch(tmp_path_factory, prefect_harness):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train
    from unlearning.data import load_prepared

    root = tmp_path_factory.mktemp("privacy")
    # the shipped defaults: no deletion.hash_sample_ids override; the leverage diagnostics on (leverage_forget.json)
    params_path = make_project(root, {"diagnostics": {"enabled": True, "record": True, "cross_sample": 200}},
                               inbox_files=False)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    (root / "dvc.yaml").write_text(DVC_YAML)
    prepare(str(params_path))
    train(str(params_path))
    m = load_prepared(root / "data" / "prepared").manifest
    train_ids = m.loc[m["split"] == "train", "sample_id"].tolist()[:4]
    val_ids = m.loc[m["split"] == "val", "sample_id"].tolist()[:1]
    ids = train_ids + val_ids  # a validation row too: it is erased (and hashed) like the rest
    (root / "requests" / "inbox" / "2026-11-30T0900_erasure.csv").write_text(
        "request_id,sample_id,requested_at,reason\n"
        + "".join(f"req-{i},{s},2026-11-28T08:00:00Z,gdpr_art17_erasure\n" for i, s in enumerate(ids)))
    results = run(None, str(params_path), dvc_commit=True)
    assert [r["status"] for r in results] == ["applied"], results
    return root, params_path, ids, results[0]


def written_files(root):
    for name in WRITTEN:
        p = root / name
        if p.is_file():
            yield p
        elif p.is_dir():
            yield from (f for f in p.rglob("*") if f.is_file())


def test_no_file_the_project_wrote_names_a_forgotten_id(batch):
    root, _, ids, _ = batch
    files = list(written_files(root))
    names = {f.relative_to(root).parts[0] for f in files}
    # the stores the grep must have reached (else it proves nothing)
    assert {"state", "data", "requests", "mlartifacts", "mlflow.db", "cache", ".dvc", "dvc-remote"} <= names, names
    artifacts = {f.name for f in (root / "mlartifacts").rglob("*") if f.is_file()}
    assert {"leverage_forget.json", "per_sample_klom.json"} <= artifacts
    assert any((root / ".dvc" / "cache").rglob("*")) and (root / "requests" / "processed").is_dir()
    needles = [s.encode() for s in ids]
    leaks = sorted(str(f.relative_to(root)) for f in files if any(n in f.read_bytes() for n in needles))
    assert leaks == []
    # nor as an unsalted hash: any 12 or more hex characters of the sha256, sha1 or md5 of the id (hashing every
    # id of the dataset undoes those), upper or lower case, anywhere in a file
    prefixes = {hashlib.new(h, s.encode()).hexdigest()[:12] for s in ids for h in ("sha256", "sha1", "md5")}
    hashed = sorted(str(f.relative_to(root)) for f in files
                    if any(p in f.read_bytes().decode("latin-1").lower() for p in prefixes))
    assert hashed == []


def test_salted_hashes_of_the_erased_ids_are_only_where_the_docs_say(batch):
    """docs/erasure.md, "Where an erased id's keyed hash stays", lists the files that keep the keyed hash of an
    erased id (the ledger and the tombstones, the audit records): no other file the project wrote holds one."""
    from unlearning.config import load_params
    from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id
    from unlearning.privacy.salt import id_salt

    root, params_path, ids, _ = batch
    key = id_salt(load_params(params_path))
    keys = [hash_sample_id(s, key).removeprefix(HASH_PREFIX).encode() for s in ids]
    holders = {str(f.relative_to(root)) for f in written_files(root) if any(k in f.read_bytes() for k in keys)}
    allowed = documented_holders()
    assert holders, "the ledger and the tombstones hold them: the search reached nothing"
    assert {"state/ledger.jsonl", "data/tombstones.txt"} <= holders
    assert sorted(h for h in holders if not any(fnmatch.fnmatch(h, a) for a in allowed)) == []


def documented_holders() -> list[str]:
    """The glob patterns docs/erasure.md's table "Where an erased id's keyed hash stays" lists (first column)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "erasure.md").read_text()
    section = text.split("### Where an erased id's keyed hash stays", 1)[1].split("\n#", 1)[0]
    return [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    # the request as it arrived stays the team's input only until the batch is applied (keep_request_files)
    assert not list((root / "requests" / "inbox").glob("*.csv"))


def test_the_key_is_secret_and_no_shared_place_holds_it(batch):
    """docs/erasure.md's threat model: someone who reads the DVC cache and remote hashes every id of the table
    with everything found there (as a salt, as an HMAC key): 0 erased ids recovered. The same attack with the key
    planted in the remote recovers them all (the attack works)."""
    from tests.unit.test_id_key import dictionary_attack
    from unlearning.config import load_params
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id, read_ledger
    from unlearning.privacy.salt import id_salt

    root, params_path, ids, _ = batch
    params = load_params(params_path)
    key_file, key = params.path("salt"), id_salt(params)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert key.startswith("hmac-sha256:") and not (root / "state" / "salt").exists()  # never in the state
    keys = {hash_sample_id(s, key) for s in ids}
    assert keys <= read_tombstones(params.path("tombstones")) and all(k.startswith(HASH_PREFIX) for k in keys)
    assert {e["sample_id"] for e in read_ledger(root / "state" / "ledger.jsonl")} == keys
    secret = key.split(":", 1)[1].encode()
    assert not [f for f in written_files(root) if secret in f.read_bytes()]  # no copy of the key anywhere
    every_id = [*pd.read_csv(root / "state" / "manifest.csv", dtype=str)["sample_id"], *ids]
    shared = [root / ".dvc" / "cache", root / "dvc-remote"]
    assert any((root / "dvc-remote").rglob("*")) and dictionary_attack(shared, every_id) == set()
    planted = root / "dvc-remote" / "planted-key"
    planted.write_bytes(secret)
    try:
        assert dictionary_attack(shared, every_id) == set(ids)
    finally:
        planted.unlink()


def test_lookup_answers_from_the_hash(batch, capsys):
    from flows.cli import main

    root, params_path, ids, r = batch
    assert main(["--params", str(params_path), "lookup", ids[0]]) == 0
    out = capsys.readouterr().out
    assert f"erased: unlearned with {r['method']} and erased by batch {r['batch_id']}" in out and "req-0" in out
    assert main(["--params", str(params_path), "lookup", ids[-1], "--json"]) == 0
    val = json.loads(capsys.readouterr().out)
    assert val["status"] == "erased" and val["entries"][0]["kind"] == "erased_not_trained_on"
    assert main(["--params", str(params_path), "lookup", "no-such-person@example.com"]) == 0
    assert "never seen" in capsys.readouterr().out
    m = pd.read_csv(root / "state" / "manifest.csv", dtype=str)
    kept = m["sample_id"].iloc[0]
    assert main(["--params", str(params_path), "lookup", kept]) == 0
    assert f"not erased: a {m['split'].iloc[0]} row" in capsys.readouterr().out
    (root / "requests" / "inbox" / "later.csv").write_text(
        f"request_id,sample_id,requested_at,reason\nlater-1,{kept},2026-11-28T08:00:00Z,gdpr\n")
    assert main(["--params", str(params_path), "lookup", kept]) == 0
    assert "pending: named by 1 request file(s)" in capsys.readouterr().out
    (root / "requests" / "inbox" / "later.csv").unlink()


def test_a_lost_key_is_never_replaced_and_lookup_says_what_to_restore(batch, capsys):
    from flows.cli import main
    from unlearning.config import load_params

    root, params_path, ids, _ = batch
    key_file = load_params(params_path).path("salt")
    kept = key_file.read_bytes()
    key_file.unlink()
    try:
        assert main(["--params", str(params_path), "lookup", ids[0]]) == 1
        err = capsys.readouterr().err
        assert "id key is missing" in err and "Restore it from your backup" in err and not key_file.exists()
    finally:
        key_file.write_bytes(kept)
        key_file.chmod(0o600)
    assert main(["--params", str(params_path), "lookup", ids[0]]) == 0 and "erased:" in capsys.readouterr().out


def test_verify_erasure_searches_every_store_for_the_traces_of_an_erased_id(batch):
    """verify-erasure recovers the erased ids from the source, as anyone holding it could, and searches every
    file the project wrote for their plain text and unsalted hashes: none after the batch; a planted one fails
    it, named by file and digest, never by id."""
    from tasks.erasure import verify_erasure
    from tasks.stores.base import ErasureSettings
    from unlearning.config import load_params

    root, params_path, ids, _ = batch
    params = load_params(params_path)
    problems, checks = verify_erasure(ErasureSettings.of(params))
    [traces] = [c for c in checks if c["store"] == "id traces"]
    assert traces["erased_ids_recovered"] == len(ids) and traces["files_searched"] > 10
    assert traces["plain_text"] == traces["unsalted_hashes"] == 0 and not [p for p in problems if "id traces" in p]
    planted = root / "cache" / "planted.json"
    planted.write_text(json.dumps({"h": hashlib.sha1(ids[1].encode()).hexdigest()[:16]}))
    try:
        problems, _ = verify_erasure(ErasureSettings.of(params))
        [line] = [p for p in problems if "id traces" in p]
        assert "cache/planted.json (sha1)" in line and ids[1] not in line
    finally:
        planted.unlink()
