"""No store keys an id or a row by an unsalted hash (docs/erasure.md, "Hashed ids and the salt"): the ensemble
cache's `.ids.json` and its keys, the shard plan and the erasure reports use the project's salt, so hashing every
id (or every row) of the dataset recovers nothing; an older project's unsalted files keep working or are
rewritten, with one line saying so."""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import torch

from unlearning.ensembles import cached_ensemble, ensemble_key, ids_digest, trained_on
from unlearning.privacy.ledger import hash_sample_id
from unlearning.models import TrainRecipe
from unlearning.sharding import ShardPlan, id_hash, legacy_plan

SPEC = {"arch": "mlp", "in_shape": [3], "n_classes": 2, "kwargs": {"hidden": [4]}}
RECIPE = TrainRecipe(1, 4, 0.05)
SALT = "f" * 64


def unsalted_prefixes(ids) -> set[str]:
    return {hashlib.sha256(s.encode()).hexdigest()[:12] for s in ids}


def data(n=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.arange(n) % 2, [f"person-{i}@example.com" for i in range(n)]


def test_the_ensemble_cache_names_rows_by_salted_hashes_only(tmp_path):
    X, y, ids = data()
    cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1], salt=SALT)
    [side] = (tmp_path / "ensembles").glob("*.ids.json")
    text = side.read_text() + "".join(p.name for p in (tmp_path / "ensembles").iterdir())
    assert not any(p in text for p in unsalted_prefixes(ids))
    assert trained_on(side.with_name(side.name.replace(".ids.json", ".pt"))) == {hash_sample_id(s, SALT) for s in ids}
    assert ids_digest(ids, SALT) != ids_digest(ids)  # the key too: the digest of a set less one id is not testable
    _, hit = cached_ensemble(tmp_path, SPEC, X, y, list(reversed(ids)), RECIPE, [1], salt=SALT)
    assert hit  # a later run finds it


def test_an_unsalted_cache_file_moves_to_its_salted_key_with_one_warning(tmp_path):
    X, y, ids = data()
    cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1])  # as an older version keyed it
    old = tmp_path / "ensembles" / f"{ensemble_key(ids_digest(ids), SPEC, RECIPE, [1])}.pt"
    old.with_suffix(".ids.json").write_text(json.dumps({"id_hashes": sorted(
        hashlib.sha256(s.encode()).hexdigest()[:16] for s in ids)}))
    assert trained_on(old) is None  # unsalted hashes: unknown rows, which the erasure deletes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, hit = cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1], salt=SALT)
    assert hit and not old.exists() and len([w for w in caught if "salted key" in str(w.message)]) == 1
    assert not any(p in "".join(f.read_text() for f in (tmp_path / "ensembles").glob("*.json"))
                   for p in unsalted_prefixes(ids))


def test_the_shard_plan_keys_rows_with_the_salt_and_reads_an_older_plan():
    _, _, ids = data()
    keys = [id_hash(s, SALT) for s in ids]
    assert keys == [hash_sample_id(s, SALT) for s in ids] and not set(keys) & unsalted_prefixes(ids)
    plan = ShardPlan(np.asarray(keys, dtype=object), np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64),
                     1, 1, (1,), 1)
    assert not legacy_plan(plan)
    old = ShardPlan(np.asarray([id_hash(s, None) for s in ids], dtype=object), plan.shard, plan.slice, 1, 1, (1,), 1)
    assert legacy_plan(old) and old.positions([id_hash(ids[2], None)]).tolist() == [2]


def hashed_table_project(tmp_path):
    import pandas as pd

    from unlearning.config import parse_params
    from unlearning.data.registry import load_dataset
    from unlearning.data.store import write_prepared

    rng = np.random.default_rng(0)
    pd.DataFrame({"id": [f"r{i}" for i in range(20)], "x": rng.normal(size=20).round(3),
                  "y": ["a", "b"] * 10}).to_csv(tmp_path / "t.csv", index=False)
    params = parse_params({"prepare": {"dataset": "table", "val_fraction": 0.25, "table": {
        "path": "t.csv", "id_column": "id", "label_column": "y", "split_column": None}}}, root=tmp_path)
    write_prepared(load_dataset("table", path=tmp_path / "t.csv", id_column="id", label_column="y", seed=0,
                                val_fraction=0.25), params.path("prepared_dir"))
    return params


class Lines:
    """A run logger that keeps its warning lines."""

    def __init__(self):
        self.lines = []

    def warning(self, line):
        self.lines.append(line)


def test_the_erasure_report_keeps_salted_row_digests_and_no_way_back_to_an_id(tmp_path, monkeypatch):
    from tasks import erasure as E
    from tasks.stores.base import ErasureSettings
    from unlearning.data import load_prepared
    from unlearning.privacy.salt import id_salt

    params = hashed_table_project(tmp_path)
    x = load_prepared(params.path("prepared_dir"))
    # what anyone holding the source features computes: the unsalted digest of the row
    plain = hashlib.sha256(np.ascontiguousarray(np.asarray(x.X)[x.rows(["r1"])][0], dtype=np.float32)
                           .tobytes()).hexdigest()
    report = E.erase(ErasureSettings.of(params), "b", ["r1"], id_salt(params), None)
    text = (E.reports_dir(params.project_paths) / "b.json").read_text()
    assert report["row_digests"] == [hash_sample_id(plain, id_salt(params))] and plain not in text
    assert "row_ids_by_digest" not in text and "cache_id_hashes" not in text
    assert hash_sample_id("r1", id_salt(params)) not in text  # the ledger and the tombstones name it, not the report
    # an older version's report of another batch: unsalted digest, id map, unsalted id hashes; rewritten by erase
    old = {"batch_id": "a", "pending": [], "row_digests": [plain], "row_ids_by_digest": {plain: ["sha256:x"]},
           "cache_id_hashes": [hashlib.sha256(b"r1").hexdigest()[:16]]}
    (E.reports_dir(params.project_paths) / "a.json").write_text(json.dumps(old))
    assert any("an older version" in p for p in E.verify_erasure(ErasureSettings.of(params))[0])
    log = Lines()
    monkeypatch.setattr("tasks.reporting.run_logger", lambda: log)
    E.erase(ErasureSettings.of(params), "b", None, id_salt(params), None)
    assert [line for line in log.lines if "1 erasure report(s) of an older version rewritten" in line]
    again = json.loads((E.reports_dir(params.project_paths) / "a.json").read_text())
    assert again == {"batch_id": "a", "pending": [], "row_digests": report["row_digests"]}
    assert not any("an older version" in p for p in E.verify_erasure(ErasureSettings.of(params))[0])
