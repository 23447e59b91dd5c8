"""The erasure's stores (tasks/stores/): every registered store keeps the contract (locate, purge, verify over a
scope; typed records back), and each store has its own test here over a small temporary project: what `locate`
finds before the erasure, what `purge` removes, and that `verify` fails while a forgotten id or row is left and
passes once it is gone. Adding a store is one class and one test: `PER_STORE` below must name a test for every
registered store (docs/erasure.md, "Adding a store")."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from tasks.stores import ORDER, STORES, Scope, Store, get_store, register_store
from tasks.stores.base import (
    CountedOnly, ErasureSettings, StoreBase, digest_list, in_declared_order, retained_twins,
)
from unlearning.config import parse_params
from unlearning.data import load_prepared
from unlearning.data.registry import load_dataset
from unlearning.data.store import manifest_csv_bytes, write_prepared
from unlearning.ensembles import id_hashes
from unlearning.privacy.erasure import (
    Finding, Purged, add_tombstones, id_key, keyed_forms, read_tombstones, tombstones_digest,
)

PLAIN = id_key(False, "")


def table_project(tmp_path, **overrides):
    """A 20-row table (ids r0..r19) prepared under tmp_path; r1 and r2 are training rows a request can name."""
    rng = np.random.default_rng(0)
    n = 20
    pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x": rng.normal(size=n).round(3),
                  "z": rng.normal(size=n).round(3), "y": ["a", "b"] * (n // 2)}).to_csv(tmp_path / "t.csv", index=False)
    # plain ids unless a test asks for hashed ones (deletion.hash_sample_ids is on by default): scope_of keys with PLAIN
    overrides = {"deletion": {"hash_sample_ids": False}, **overrides}
    params = parse_params({"prepare": {"dataset": "table", "val_fraction": 0.25,
                                       "table": {"path": "t.csv", "id_column": "id", "label_column": "y",
                                                 "split_column": None}}, **overrides}, root=tmp_path)
    ds = load_dataset("table", path=tmp_path / "t.csv", id_column="id", label_column="y", seed=0, val_fraction=0.25)
    ds.split[np.isin(ds.sample_id, ["r1", "r2"])] = "train"
    write_prepared(ds, params.path("prepared_dir"))
    return params


def scope_of(params, forgotten=("r1",), key=PLAIN, **kw) -> Scope:
    """The scope an erasure of `forgotten` sees: tombstoned, fingerprinted from the prepared store."""
    keys = {key(s) for s in forgotten}
    add_tombstones(params.path("tombstones"), keys)
    prepared = load_prepared(params.path("prepared_dir"))
    hit = prepared.manifest["sample_id"].map(lambda s: key(s) in keys).to_numpy(dtype=bool)
    digests = digest_list(np.asarray(prepared.X)[hit])
    ids = prepared.manifest["sample_id"][hit].tolist()
    scope = Scope(ErasureSettings.of(params), set(keys), read_tombstones(params.path("tombstones")), key, prepared,
                  {d: [key(s)] for d, s in zip(digests, ids)}, keyed_forms(keys, ""), **kw)
    scope.kept = retained_twins(scope)
    return scope


def problems(findings: list[Finding]) -> list[str]:
    return [p for f in findings for p in f.problems]


def the(findings: list, store: str):
    [one] = [f for f in findings if f.store == store]
    return one


# --- the contract ----------------------------------------------------------------------------------------------
def test_every_registered_store_keeps_the_contract(tmp_path):
    params = table_project(tmp_path)
    scope = scope_of(params)
    assert len({s.name for s in STORES}) == len(STORES)
    assert STORES[-1].name == "DVC cache"  # last: it commits what the others rewrote
    for store in STORES:
        assert isinstance(store, Store), store
        for method, record in (("locate", Finding), ("verify", Finding)):
            out = getattr(store, method)(scope)
            assert isinstance(out, list) and all(isinstance(f, record) for f in out), (store.name, method, out)
        assert all(f.problems == () for f in store.locate(scope)), store.name  # locate does not judge
    for store in STORES:  # purge second: every store saw the project as it was
        out = store.purge(scope)
        assert isinstance(out, list) and all(isinstance(p, Purged) for p in out), (store.name, out)
        assert all(isinstance(p.as_dict(), dict) and "store" in p.as_dict() for p in out)


def test_every_registered_store_has_its_own_test():
    assert set(PER_STORE) == {s.name for s in STORES}, "add the new store's test to PER_STORE"


def test_the_order_of_the_stores_is_declared():
    assert [s.name for s in STORES] == list(ORDER)

    class Named:
        def __init__(self, name):
            self.name = name

    a, b, dvc = Named("a"), Named("b"), Named("DVC cache")
    assert in_declared_order([dvc, b, a], ("a", "b", "DVC cache")) == [a, b, dvc]  # not the registration order
    with pytest.raises(ValueError, match=r"not in ORDER \['b'\], no such store \['c'\]"):
        in_declared_order([a, b], ("a", "c"))


def test_the_default_locate_is_verify_unjudged():
    judged = Finding("src", "here", {"forgotten_rows": 2}, ("2 forgotten rows remain",))

    class Judging(StoreBase):
        name = "judging"

        def purge(self, scope): return []
        def verify(self, scope): return [judged]

    class Source(CountedOnly):
        name = "source"

        def verify(self, scope): return [judged]

    for store in (Judging(), Source()):
        [found] = store.locate(None)
        assert (found.store, found.where, found.counts, found.problems) == ("src", "here", {"forgotten_rows": 2}, ())
        assert isinstance(store, Store)
    assert Source().purge(None) == []


def test_register_store_refuses_a_second_name_and_an_incomplete_class():
    class Twin:
        name = "prepared store"

        def locate(self, scope): return []
        def purge(self, scope): return []
        def verify(self, scope): return []

    class Half:
        name = "half a store"

        def locate(self, scope): return []

    n = len(STORES)
    with pytest.raises(ValueError, match="prepared store"):
        register_store(Twin)
    with pytest.raises(TypeError, match="Half"):
        register_store(Half)
    assert len(STORES) == n
    with pytest.raises(KeyError, match="registered"):
        get_store("nowhere")


# --- one test per store ----------------------------------------------------------------------------------------
def test_prepared_store(tmp_path):
    params = table_project(tmp_path)
    store, scope = get_store("prepared store"), scope_of(params)
    assert the(store.locate(scope), "prepared store").counts["forgotten_ids"] == 1
    assert "'r1'" in problems(store.verify(scope))[0]
    locked = Scope(**{**scope.__dict__, "dvc_locked": True})
    assert [p.as_dict()["pending"] for p in store.purge(locked)] == [True]
    assert "r1" in set(load_prepared(params.path("prepared_dir")).manifest["sample_id"])  # nothing changed
    [done] = store.purge(scope)
    assert done.as_dict()["purged_rows"] == 1 and done.store == "prepared"
    scope.prepared = load_prepared(params.path("prepared_dir"))
    assert problems(store.verify(scope)) == [] and the(store.locate(scope), "prepared store").counts["forgotten_ids"] == 0
    assert store.purge(scope)[0].done["purged_rows"] == 0  # idempotent


def test_state_manifest(tmp_path):
    params = table_project(tmp_path)
    m = load_prepared(params.path("prepared_dir")).manifest.assign(status="retained", deleted_in_batch="")
    path = params.path("state_dir") / "manifest.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes(manifest_csv_bytes(m))
    store, scope = get_store("state manifest"), scope_of(params, ("r1", "r2"))
    assert store.locate(scope)[0].counts["forgotten_ids"] == 2 and len(problems(store.verify(scope))) == 1
    assert store.purge(scope)[0].done == {"purged_rows": 2}
    assert problems(store.verify(scope)) == [] and len(pd.read_csv(path)) == len(m) - 2


def test_tombstones(tmp_path):
    params = table_project(tmp_path)
    store, scope = get_store("tombstones"), scope_of(params)
    scope.forgotten.add("r9")  # a forgotten id the tombstones lack: a re-prepare would bring it back
    assert store.locate(scope)[0].counts["not_tombstoned"] == 1
    assert "1 forgotten id(s) are not tombstoned" in problems(store.verify(scope))[0]
    add_tombstones(params.path("tombstones"), ["r9"])
    scope.tombstones = read_tombstones(params.path("tombstones"))
    assert problems(store.verify(scope)) == [] and store.purge(scope)[0].done == {"entries": 2}


def test_erasure_reports(tmp_path):
    params = table_project(tmp_path)
    store, scope = get_store("erasure reports"), scope_of(params, ledger=[{"batch_id": "b", "sample_id": "r1"}])
    assert "the erasure never ran" in problems(store.verify(scope))[0] and store.purge(scope) == []
    scope.reports = [{"batch_id": "b", "pending": ["prepared store: inside `dvc repro`; run `unlearn erase`"]}]
    assert problems(store.verify(scope)) == ["batch b: erasure pending (prepared store: inside `dvc repro`; run "
                                             "`unlearn erase`)"]
    assert store.locate(scope)[0].counts == {"reports": 1, "unfinished": 0, "pending": 1, "older": 0}
    scope.reports = [{"batch_id": "b", "pending": []}]
    assert problems(store.verify(scope)) == []
    # an erase a kill stopped (its journal): a problem naming the command that finishes it
    from unlearning.privacy.erasure_journal import Journal, journal_dir

    journal = Journal.start(journal_dir(params.path("state_dir")), "b", run_id=None, champion_version=None, keys=[],
                            n_ids=1, row_digests=[], order=["erasure reports", "tombstones"])
    [line] = problems(store.verify(scope))
    assert line.startswith("unfinished erase: batch b: erase started") and "`unlearn erase` finishes it" in line
    journal.close()
    assert problems(store.verify(scope)) == []
    # an older version's report maps rows to ids and holds unsalted id hashes: a problem until `unlearn erase`
    scope.reports = [{"batch_id": "b", "pending": [], "row_ids_by_digest": {"ab": ["r1"]}, "cache_id_hashes": []}]
    assert "an older version" in problems(store.verify(scope))[0]


def test_source_table(tmp_path):
    params = table_project(tmp_path)
    store, scope = get_store("source table"), scope_of(params, ("r1", "r2"))
    [found] = store.locate(scope)
    assert found.as_dict() == {"store": "source table", "path": str(tmp_path / "t.csv"),
                               "forgotten_rows_at_the_source": 2}
    assert store.purge(scope) == [] and problems(store.verify(scope)) == []  # never rewritten: a note, not a failure
    assert (tmp_path / "t.csv").read_text().count("\nr1,") == 1


def test_source_image_folder(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    for name in ["cats/a.png", "cats/b.png", "dogs/c.png"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((2, 2), dtype=np.uint8)).save(root / name)
    params = parse_params({}, root=tmp_path)
    prepared = type("P", (), {"info": {"source": {"type": "image_folder", "path": str(root)}}})()
    store = get_store("source image folder")
    scope = Scope(ErasureSettings.of(params), {"cats/b"}, {"cats/b"}, PLAIN, prepared)
    assert [f.as_dict() for f in store.verify(scope)] == [{"store": "source image folder", "path": str(root),
                                                           "forgotten_rows_at_the_source": 1,
                                                           "first_files": ["cats/b.png"]}]
    assert store.purge(scope) == [] and (root / "cats/b.png").exists() and problems(store.locate(scope)) == []


def test_request_files(tmp_path):
    params = table_project(tmp_path, deletion={"hash_sample_ids": True})
    key = id_key(True, "table")
    rejected = params.path("rejected") / "late.csv"
    rejected.parent.mkdir(parents=True)
    rejected.write_text("request_id,sample_id,requested_at,reason\nq1,r1,2026-11-30T09:00:00Z,gdpr\n"
                        "q2,r5,2026-11-30T09:00:00Z,gdpr\n")
    store, scope = get_store("request files"), scope_of(params, key=key)
    assert the(store.locate(scope), "rejected request files").counts["forgotten_ids"] == 1
    assert "1 forgotten id(s) remain in plain text" in problems(store.verify(scope))[0]
    assert the(store.purge(scope), "rejected request files").done == {"redacted_files": ["late.csv"]}
    assert problems(store.verify(scope)) == [] and "r5" in rejected.read_text() and ",r1," not in rejected.read_text()
    (tmp_path / "plain").mkdir()
    plain = table_project(tmp_path / "plain")  # plain ids: the applied files are the audit trail, counted
    (plain.path("processed")).mkdir(parents=True)
    (plain.path("processed") / "a.csv").write_text("request_id,sample_id\nq1,r1\n")
    found = store.verify(scope_of(plain))
    assert [f.as_dict()["files_naming_forgotten_ids"] for f in found] == [1] and problems(found) == []
    assert store.purge(scope_of(plain)) == []


def test_great_expectations_results(tmp_path):
    params = table_project(tmp_path)
    results = params.path("gx_dir") / "uncommitted" / "validations"
    results.mkdir(parents=True)
    (results / "run.json").write_text(json.dumps({"unexpected_index_list": [{"row": 1, "sample_id": "r1"}]}))
    (results / "other.json").write_text(json.dumps({"unexpected_index_list": [{"row": 1, "sample_id": "r5"}]}))
    store, scope = get_store("Great Expectations results"), scope_of(params)
    [found] = store.verify(scope)
    assert found.counts == {"files_naming_forgotten_ids": 1} and found.problems == ()  # only the file naming r1
    assert store.purge(scope) == []
    (tmp_path / "none").mkdir()
    assert store.verify(scope_of(table_project(tmp_path / "none"))) == []  # no results yet


def test_ensemble_cache(tmp_path):
    params = table_project(tmp_path)
    folder = params.path("cache_dir") / "ensembles"
    folder.mkdir(parents=True)
    for name, ids in (("on_r1", ["r1", "r3"]), ("clean", ["r3", "r4"]), ("unknown", None)):
        (folder / f"{name}.pt").write_bytes(b"x")
        if ids is not None:
            (folder / f"{name}.ids.json").write_text(json.dumps({"id_hashes": id_hashes(ids, "")}))
    store, scope = get_store("ensemble cache"), scope_of(params)
    assert store.locate(scope)[0].counts == {"trained_on_forgotten": 2} and problems(store.verify(scope))
    assert sorted(store.purge(scope)[0].done["purged_files"]) == ["on_r1.pt", "unknown.pt"]
    assert problems(store.verify(scope)) == [] and sorted(p.name for p in folder.iterdir()) == ["clean.ids.json",
                                                                                                "clean.pt"]


def test_models(tmp_path):
    params = table_project(tmp_path)
    models, state = params.path("models_dir"), params.path("state_dir")
    models.mkdir(parents=True)
    state.mkdir(parents=True)
    torch.save({"state": {}, "extra": {"clean_of": tombstones_digest(set())}}, models / "original.pt")
    torch.save({"state": {"w": 1}, "extra": {}}, state / "model.pt")  # the champion, certified unlearned
    store, scope = get_store("models"), scope_of(params)
    assert "a checkpoint trained before the last erasure remains" in problems(store.verify(scope))[0]
    locked = Scope(**{**scope.__dict__, "dvc_locked": True})
    assert store.purge(locked)[0].pending == "models/original.pt"
    [done] = store.purge(scope)
    assert done.done == {"replaced": str(models / "original.pt")}
    assert torch.load(models / "original.pt", weights_only=False)["extra"]["erased_through"] == \
        tombstones_digest(scope.tombstones)
    assert problems(store.verify(scope)) == [] and store.purge(scope)[0].done == {"replaced": None}  # idempotent


def test_mlflow_registry(tmp_path):
    from adapters.tracking import Tracker

    params = table_project(tmp_path, erasure={"keep_versions": 1})
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "stores-test", tmp_path / "mlartifacts")
    name = params.tracking.registered_model
    tracker.client.create_registered_model(name)
    for _ in range(4):
        tracker.client.create_model_version(name, source=str(tmp_path / "nowhere"))
    (params.path("state_dir")).mkdir(parents=True)
    (params.path("state_dir") / "champion.json").write_text(json.dumps({"model_version": "4"}))
    store, scope = get_store("MLflow registry"), scope_of(params, tracker=tracker, champion_version="4")
    [found] = store.verify(scope)
    assert found.counts == {"versions": ["1", "2", "3", "4"]} and "3 version(s) besides the champion v4" in \
        found.problems[0]
    [done] = store.purge(scope)
    assert [v["version"] if isinstance(v, dict) else v for v in done.done["purged_versions"]] == ["1", "2"]
    assert done.done["kept"] == ["3", "4"] and done.as_dict()["uri"] == tracker.tracking_uri
    assert problems(store.verify(scope)) == [] and tracker.versions(name) == ["3", "4"]
    assert store.verify(Scope(**{**scope.__dict__, "tracker": None})) == []  # no tracking store: nothing to ask


def npy_with_rows(path, X):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # np.save(path) would add .npy to a DVC object's name
        np.save(f, np.asarray(X, dtype=np.float32))


def test_mlflow_artifacts(tmp_path):
    params = table_project(tmp_path)
    scope = scope_of(params)
    prepared = np.asarray(scope.prepared.X)
    row = prepared[scope.prepared.rows(["r1"])]
    art = params.path("mlflow_artifacts") / "1" / "run" / "artifacts"
    npy_with_rows(art / "forget_rows.npy", row)
    (art / "klom.json").write_text('{"sample_id": ["r1"]}')
    store = get_store("MLflow artifacts")
    assert store.locate(scope)[0].counts["forgotten_rows"] == 1
    assert "forgotten raw row(s) remain: 'r1' in 1/run/artifacts/forget_rows.npy" in problems(store.verify(scope))[0]
    assert store.purge(scope) == []  # the versions' artifacts go with the registry's purge
    (art / "forget_rows.npy").unlink()
    found = store.verify(scope)
    assert problems(found) == [] and [f.counts.get("files_naming_forgotten_ids") for f in found] == [None, 1]


def test_dvc_cache(tmp_path):
    params = table_project(tmp_path)
    scope = scope_of(params)
    store = get_store("DVC cache")
    assert store.purge(scope) == []  # not a DVC repo: nothing to commit or gc
    row = np.asarray(scope.prepared.X)[scope.prepared.rows(["r1"])]
    npy_with_rows(tmp_path / ".dvc" / "cache" / "files" / "md5" / "ab" / "cdef", row)  # objects have no suffix
    assert "DVC cache" in problems(store.verify(scope))[0]
    assert store.purge(Scope(**{**scope.__dict__, "dvc_locked": True}))[0].as_dict() == {
        "store": "DVC cache", "path": str(tmp_path / ".dvc" / "cache"), "pending": True}
    (tmp_path / ".dvc" / "cache" / "files" / "md5" / "ab" / "cdef").unlink()
    assert problems(store.verify(scope)) == [] and store.locate(scope)[0].counts["forgotten_rows"] == 0


def test_shard_checkpoints(tmp_path):
    import shutil

    from tasks.sharding import checkpoint_name, original_shards, state_shards, write_folder
    from unlearning.models import TrainRecipe
    from unlearning.sharding import ShardState, id_hash, make_plan, train_from_scratch, unlearn_state

    params = table_project(tmp_path)
    prepared = load_prepared(params.path("prepared_dir"))
    rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    ids = prepared.manifest["sample_id"].to_numpy()[rows]
    X = torch.as_tensor(np.asarray(prepared.X)[rows], dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label)[rows], dtype=torch.long)
    recipe = TrainRecipe(epochs=2, batch_size=4, lr=0.01)
    plan = make_plan([id_hash(i) for i in ids], ids, 2, 2, 0, recipe.epochs, [5, 6])
    stored = {}
    spec = {"arch": "mlp", "in_shape": [X.shape[1]], "n_classes": 2, "kwargs": {"hidden": [3]}}
    constituents, _ = train_from_scratch(spec, plan, X, y, recipe,
                                         checkpoint=lambda k, r, m: stored.__setitem__((k, r), m.select(0)))
    write_folder(original_shards(params.project_paths), ShardState(plan, X, y, stored))
    store, scope = get_store("shard checkpoints"), scope_of(params)  # forgets r1, a training row
    assert store.purge(scope)[0].done == {"replaced": None}  # no sisa batch yet: nothing to replace it with
    assert "forgotten row(s) still in the shard plan" in problems(store.verify(scope))[0]
    after, _, _ = unlearn_state(ShardState(plan, X, y, stored).model(constituents), [id_hash("r1")], recipe)
    write_folder(state_shards(params.project_paths), after.shard_state)  # the champion's, as a promoted sisa batch writes it
    assert [f.counts["problems"] > 0 for f in store.locate(scope)] == [True, False]
    assert store.purge(Scope(**{**scope.__dict__, "dvc_locked": True}))[0].pending == "models/shards"
    assert store.purge(scope)[0].done == {"replaced": str(original_shards(params.project_paths))}
    assert problems(store.verify(scope)) == []
    # a checkpoint trained before the deletion, put back: caught by its rows digest
    k = int(plan.shard[plan.positions([id_hash("r1")])[0]])
    stale = tmp_path / "stale.pt"
    from unlearning.models import save_model

    save_model(stored[(k, 1)], stale, {"rows_digest": ShardState(plan, X, y, stored).checkpoint_digest(k, 1)})
    shutil.copy(stale, state_shards(params.project_paths) / checkpoint_name(k, 1))
    assert any("trained on other rows" in p for p in problems(store.verify(scope)))


def test_id_traces(tmp_path):
    import hashlib

    from unlearning.privacy.salt import id_salt

    params = table_project(tmp_path, deletion={"hash_sample_ids": True})
    rows = pd.read_csv(tmp_path / "t.csv")
    rows["id"] = [f"person-{i}@example.com" for i in range(len(rows))]  # ids long enough to search as text
    rows.to_csv(tmp_path / "t.csv", index=False)
    key, gone = id_key(True, id_salt(params)), "person-1@example.com"
    store, scope = get_store("id traces"), scope_of(params, (gone,), key)
    cache = params.path("cache_dir")
    cache.mkdir(parents=True)
    (cache / "clean.json").write_text(json.dumps({"kept": hashlib.sha256(b"person-3@example.com").hexdigest(),
                                                  "erased": key(gone), "id": "person-10@example.com"}))
    [found] = store.locate(scope)
    assert found.problems == () and found.counts["erased_ids_recovered"] == 1 and found.counts["files_searched"] >= 1
    assert store.purge(scope) == [] and problems(store.verify(scope)) == []  # a salted key is no trace
    (cache / "sha1.txt").write_text(hashlib.sha1(gone.encode()).hexdigest()[:12].upper())
    (cache / "md5.json").write_text(json.dumps({"h": "ab" + hashlib.md5(gone.encode()).hexdigest()}))
    (cache / "plain.csv").write_text(f"x,{gone}\n")
    found = problems(store.verify(scope))
    assert len(found) == 2 and "1 file(s) name a forgotten id in plain text: cache/plain.csv" in found[0]
    assert "cache/md5.json (md5)" in found[1] and "cache/sha1.txt (sha1)" in found[1] and gone not in "".join(found)
    (tmp_path / "off").mkdir()
    params_off = table_project(tmp_path / "off")
    assert store.verify(scope_of(params_off)) == []  # hashing off: ids are plain on purpose


def test_memorization_map(tmp_path):
    from tasks.memorization_map import MapRecord, load_map, save_map
    from unlearning.licensing.memorization import MemorizationMap

    params = table_project(tmp_path)
    store, scope = get_store("memorization map"), scope_of(params)
    assert store.verify(scope) == []  # no map: nothing to look at
    arrays = {k: np.array([0.1, 0.2, 0.3]) for k in ("point", "lower", "upper", "mu", "loss")}
    save_map(params.project_paths, MapRecord(["r1", "r3", "r4"], MemorizationMap(**arrays, n_members=8, delta=1e-3, confidence=0.9),
                               {}, {"rows": 3}))
    assert store.locate(scope)[0].counts == {"forgotten_entries": 1} and problems(store.verify(scope))
    assert store.purge(scope)[0].done == {"purged_rows": 1}
    assert problems(store.verify(scope)) == []
    kept = load_map(params.project_paths)
    assert kept.ids == ["r3", "r4"] and kept.removed == 1 and kept.map.upper.tolist() == [0.2, 0.3]


PER_STORE = {"erasure reports": test_erasure_reports, "tombstones": test_tombstones,
             "prepared store": test_prepared_store, "state manifest": test_state_manifest,
             "source table": test_source_table, "source image folder": test_source_image_folder,
             "request files": test_request_files, "Great Expectations results": test_great_expectations_results,
             "ensemble cache": test_ensemble_cache, "models": test_models, "MLflow registry": test_mlflow_registry,
             "MLflow artifacts": test_mlflow_artifacts, "DVC cache": test_dvc_cache,
             "shard checkpoints": test_shard_checkpoints, "id traces": test_id_traces,
             "memorization map": test_memorization_map}
