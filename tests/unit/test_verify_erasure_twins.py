"""verify-erasure judges rows by identity, not by bytes alone: a forgotten row whose bytes equal a retained row's
(a duplicate row in the table: another person's, kept) is reported as identical to that row, not as a failure;
a failure names the id and the store; `verify-erasure BATCH` checks only that batch's rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tasks import erasure as E

from tasks.stores.base import ErasureSettings
from unlearning.config import parse_params
from unlearning.data.registry import load_dataset
from unlearning.data.store import write_prepared


def table_project(tmp_path):
    """A table with a duplicate pair: p1 and p2 hold the same values (two people, one row of bytes)."""
    rng = np.random.default_rng(0)
    n = 40
    df = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x": rng.normal(size=n).round(3),
                       "z": rng.normal(size=n).round(3), "y": ["a", "b"] * (n // 2)})
    df.loc[len(df)] = ["p1", 9.5, -9.5, "a"]
    df.loc[len(df)] = ["p2", 9.5, -9.5, "a"]  # the twin: kept
    df.loc[len(df)] = ["q1", 7.25, 3.5, "b"]  # no twin
    df.to_csv(tmp_path / "people.csv", index=False)
    # plain ids on purpose: `forget` writes the ledger by hand, and the checks name the ids they find
    params = parse_params({"prepare": {"dataset": "table", "val_fraction": 0.25,
                                       "table": {"path": "people.csv", "id_column": "id", "label_column": "y",
                                                 "split_column": None}},
                           "deletion": {"hash_sample_ids": False}}, root=tmp_path)
    t = params.prepare.table
    ds = load_dataset("table", path=tmp_path / "people.csv", id_column=t.id_column, label_column=t.label_column,
                      seed=0, val_fraction=0.25)
    ds.split[np.isin(ds.sample_id, ["p1", "p2", "q1"])] = "train"  # erasable rows (the ids a request names)
    write_prepared(ds, params.path("prepared_dir"))
    return params


def forget(params, batch_id, ids):
    ledger = params.path("state_dir") / "ledger.jsonl"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a") as f:
        for s in ids:
            f.write(json.dumps({"batch_id": batch_id, "sample_id": s, "request_id": f"req-{s}"}) + "\n")
    return E.erase(ErasureSettings.of(params), batch_id, ids, "table", None)


def named(report) -> str:
    """How verify-erasure names a forgotten row: the report keeps its salted digest alone, never which id it was."""
    [digest] = report["row_digests"]
    return f"row digest {digest.split(':')[-1][:12]}"


def features_of(params, ids):
    from unlearning.data import load_prepared

    p = load_prepared(params.path("prepared_dir"))
    return np.asarray(p.X)[p.rows(ids)]


def test_a_forgotten_row_with_a_retained_twin_is_reported_not_failed(tmp_path):
    params = table_project(tmp_path)
    before = features_of(params, ["p1", "p2", "q1"])
    report = forget(params, "batch-a", ["p1"])
    assert len(report["row_digests"]) == 1 and "row_ids_by_digest" not in report  # no way from a row to its id
    problems, checks = E.verify_erasure(ErasureSettings.of(params))
    assert problems == [], problems
    (prepared,) = [c for c in checks if c["store"] == "prepared store"]
    assert prepared["identical_to_retained"] == [{"forgotten": named(report), "retained": ["p2"], "n_retained": 1}]
    # a store without ids holding the twin's bytes once (as the prepared store keeps them) is no failure ...
    art = params.path("mlflow_artifacts")
    art.mkdir(parents=True)
    np.save(art / "kept.npy", before[1:2])
    assert E.verify_erasure(ErasureSettings.of(params))[0] == []
    # ... but a copy of the table from before the erasure holds those bytes twice: one is the forgotten row
    np.save(art / "old.npy", before)
    problems, _ = E.verify_erasure(ErasureSettings.of(params))
    assert len(problems) == 1 and "MLflow artifacts" in problems[0] and "1 forgotten raw row(s) remain" in problems[0]
    assert f"{named(report)} in old.npy" in problems[0], problems


def test_a_failure_names_the_id_and_the_store_and_a_batch_checks_its_own_rows(tmp_path):
    params = table_project(tmp_path)
    q1 = features_of(params, ["q1"])
    forget(params, "batch-a", ["p1"])
    b = forget(params, "batch-b", ["q1"])
    art = params.path("mlflow_artifacts")
    art.mkdir(parents=True)
    np.save(art / "planted.npy", q1)  # batch-b's row is back; batch-a's twin is not concerned
    assert E.verify_erasure(ErasureSettings.of(params), "batch-a")[0] == []
    problems, _ = E.verify_erasure(ErasureSettings.of(params), "batch-b")
    assert problems == [f"MLflow artifacts ({art}): 1 forgotten raw row(s) remain: {named(b)} in planted.npy"]
    assert E.verify_erasure(ErasureSettings.of(params))[0] == problems
    with pytest.raises(E.UnknownBatch):
        E.verify_erasure(ErasureSettings.of(params), "batch-zzz")


def test_a_forgotten_id_left_in_the_prepared_store_is_named(tmp_path):
    params = table_project(tmp_path)
    forget(params, "batch-a", ["p1"])
    ds = load_dataset("table", path=tmp_path / "people.csv", id_column="id", label_column="y", seed=0,
                      val_fraction=0.25)
    write_prepared(ds, params.path("prepared_dir"))  # a re-prepare that ignored the tombstones
    problems, _ = E.verify_erasure(ErasureSettings.of(params))
    prepared = params.path("prepared_dir")
    assert f"prepared store ({prepared}): 1 forgotten id(s) remain: 'p1'" in problems
    assert f"prepared store ({prepared}): 1 forgotten raw row(s) remain: 'p1'" in problems


def test_verify_erasure_cli_prints_the_twin_and_exits_0(tmp_path, capsys):
    import yaml

    from flows.cli import main

    params = table_project(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
    report = forget(params, "batch-a", ["p1"])
    assert main(["--params", str(tmp_path / "params.yaml"), "verify-erasure", "batch-a"]) == 0
    out = capsys.readouterr().out
    assert "erasure verified for batch-a" in out
    assert f"forgotten row {named(report)} is identical to retained row p2 (kept)" in out


def test_a_second_pass_with_nothing_left_keeps_the_fingerprints(tmp_path):
    """`unlearn erase` after the rows are gone: no row to fingerprint, the first pass's digests stay in the report."""
    params = table_project(tmp_path)
    first = forget(params, "batch-a", ["p1"])
    again = E.erase(ErasureSettings.of(params), "batch-a", None, "table", None)
    assert again["row_digests"] == first["row_digests"] != [] and E.digest_list(np.zeros((0, 3))) == []
