"""A one-hot category that only erased rows had is a raw value of forgotten rows: it must leave dataset.json
and the fingerprint (state, original checkpoint, `erasure.identity`) at the erasure and at every re-prepare,
while the feature width and the state check ("unchanged") stay. Each table is a few rows in tmp_path."""

import json

import numpy as np
import pandas as pd
import pytest

from tasks.training import prepare_dataset
from unlearning.config import parse_params
from unlearning.data import DataError, apply_preprocessing, load_dataset, load_prepared
from unlearning.data.store import rewrite_without
from unlearning.privacy.erasure import add_tombstones, id_key, is_erased, read_tombstones
from unlearning.privacy.fingerprint import describe_mismatch, fingerprint, matches, prepared_fingerprint
from unlearning.io import commit_dir, staging_dir
from unlearning.privacy.salt import id_salt  # the project's secret salt (with hash_sample_ids), as prepare keys ids

pytestmark = pytest.mark.filterwarnings("error")

SECRET = "ZZSOIL-UNIQUE"  # the soil of r3 and r7 only
SECOND = "YY-SECOND"  # the soil of r5 only, erased in a second batch
SHARED = "SHARED-SOIL"  # r1 (erased) and r11 (kept): it stays
ZONE = "ZONE-R7"  # a second text column: the zone of r7 only


def soil(i: int) -> str:
    return {3: SECRET, 7: SECRET, 5: SECOND, 1: SHARED, 11: SHARED}.get(i, "AB"[i % 2])


def table(i: int) -> str:
    split = "val" if i >= 9 else "train"
    return f"r{i},{soil(i)},{ZONE if i == 7 else 'north'},{0.5 * i},{i % 2},{split}"


CSV = "id,soil,zone,x,y,s\n" + "\n".join(table(i) for i in range(12)) + "\n"


def project(tmp_path, hash_ids=False, csv=CSV, label_column="y"):
    (tmp_path / "t.csv").write_text(csv, encoding="utf-8")
    return parse_params({"prepare": {"dataset": "table", "table": {
        "path": "t.csv", "id_column": "id", "label_column": label_column, "split_column": "s"}},
        "deletion": {"hash_sample_ids": hash_ids}}, root=tmp_path)


def erased_predicate(params):
    return is_erased(read_tombstones(params.path("tombstones")), params.deletion.hash_sample_ids, id_salt(params))


def erase(params, ids) -> int:
    """An erasure as tasks/erasure.py does it: tombstones, then the prepared store rewritten without the rows."""
    add_tombstones(params.path("tombstones"), map(id_key(params.deletion.hash_sample_ids, id_salt(params)), ids))
    folder = params.path("prepared_dir")
    stage = staging_dir(folder)
    n = rewrite_without(folder, stage, erased_predicate(params))
    commit_dir(stage, folder)
    return n


def store(params):
    """(dataset.json as text, its content, the fingerprint the state check computes, features [n, d])."""
    p = load_prepared(params.path("prepared_dir"))
    text = (params.path("prepared_dir") / "dataset.json").read_text(encoding="utf-8")
    current = prepared_fingerprint(params.train, params.base.seed, params.root, p.info, p.manifest)
    return text, p.info, current, np.asarray(p.X, dtype=np.float64)


def assert_no_raw_value(params, fp, *values):
    folder = params.path("prepared_dir")
    for f in folder.iterdir():
        data = f.read_bytes()
        assert not [v for v in values if v.encode() in data], f.name
    shown = json.dumps(fp)
    assert not [v for v in values if v in shown]


def test_prepare_with_tombstones_names_placeholders_in_place(tmp_path):
    params = project(tmp_path)
    prepare_dataset.fn(params)
    _, before, fp0, X0 = store(params)
    assert before["preprocessing"]["categories"]["soil"] == ["A", "B", SHARED, SECOND, SECRET]
    add_tombstones(params.path("tombstones"), ["r1", "r3", "r7"])
    prepare_dataset.fn(params)
    text, info, fp, X = store(params)
    prep = info["preprocessing"]
    assert prep["categories"]["soil"] == ["A", "B", SHARED, SECOND, "<erased 1>"]
    assert prep["categories"]["zone"] == ["<erased 1>", "north"]
    assert prep["feature_names"] == ["soil=A", "soil=B", f"soil={SHARED}", f"soil={SECOND}", "soil=<erased 1>",
                                     "zone=<erased 1>", "zone=north", "x"]
    assert X.shape == (9, X0.shape[1]) and info["n_features"] == X0.shape[1] == len(prep["feature_names"])
    assert not X[:, [4, 5]].any()  # the placeholders' one-hot columns: all zeros for every remaining row
    assert SECRET not in text and ZONE not in text and SHARED in text
    assert_no_raw_value(params, fp, SECRET, ZONE)
    assert matches(fp0, fp) and describe_mismatch(fp0, fp) == []  # the state check: "unchanged"


@pytest.mark.parametrize("hash_ids", [False, True])
def test_erasure_and_re_prepare_write_the_same_store_and_fingerprint(tmp_path, hash_ids):
    params = project(tmp_path, hash_ids)
    prepare_dataset.fn(params)
    _, _, fp0, X0 = store(params)
    assert erase(params, ["r3", "r7", "r1"]) == 3
    text1, info1, fp1, X1 = store(params)
    assert SECRET not in text1 and ZONE not in text1
    assert_no_raw_value(params, fp1, SECRET, ZONE)
    assert SECRET not in json.dumps(info1["erasure"]["identity"])
    assert X1.shape[1] == X0.shape[1]
    prepare_dataset.fn(params)  # dvc repro prepare after the tombstones changed
    text2, info2, fp2, X2 = store(params)
    assert info2["preprocessing"] == info1["preprocessing"] and info2["erasure"] == info1["erasure"]
    assert np.array_equal(X2, X1)
    assert fp0["digest"] == fp1["digest"] == fp2["digest"]
    assert_no_raw_value(params, fp2, SECRET, ZONE)


def test_placeholders_of_successive_erasures_match_a_fresh_prepare(tmp_path):
    params = project(tmp_path)
    prepare_dataset.fn(params)
    _, _, fp0, _ = store(params)
    erase(params, ["r3", "r7"])
    assert store(params)[1]["preprocessing"]["categories"]["soil"] == ["A", "B", SHARED, SECOND, "<erased 1>"]
    erase(params, ["r5"])
    _, info, fp, _ = store(params)
    assert info["preprocessing"]["categories"]["soil"] == ["A", "B", SHARED, "<erased 1>", "<erased 2>"]
    assert info["erasure"]["n_erased"] == 3
    prepare_dataset.fn(params)
    _, fresh, fp_fresh, _ = store(params)
    assert fresh["preprocessing"] == info["preprocessing"]
    assert fp0["digest"] == fp["digest"] == fp_fresh["digest"]
    assert_no_raw_value(params, fp_fresh, SECRET, SECOND, ZONE)


def test_new_rows_with_an_erased_value_are_unknown_like_any_other(tmp_path):
    params = project(tmp_path)
    prepare_dataset.fn(params)
    erase(params, ["r3", "r7"])
    _, info, _, X = store(params)
    prep = info["preprocessing"]
    ok = pd.DataFrame({"soil": ["A", SHARED], "zone": ["north", "north"], "x": [0.0, 5.5]})
    assert np.array_equal(apply_preprocessing(ok, prep), X[[0, -1]].astype(np.float32))  # rows r0 and r11
    for value in (SECRET, "NEVER-SEEN", "<erased 1>"):
        with pytest.raises(DataError, match="not among the fitted categories") as e:
            apply_preprocessing(pd.DataFrame({"soil": [value], "zone": ["north"], "x": [0.0]}), prep)
        assert "<erased" not in str(e.value).split("fitted categories")[1]


def test_a_state_recorded_with_category_values_still_matches(tmp_path):
    """Fingerprints recorded before identities left out category values: the same data still matches, and a
    mismatch report names counts, not values."""
    params = project(tmp_path)
    prepare_dataset.fn(params)
    _, before, fp0, _ = store(params)
    c = fp0["components"]
    legacy_value = {**c["dataset"]["value"], "preprocessing": before["preprocessing"]}
    legacy = fingerprint(legacy_value, c["model"]["value"], c["recipe"]["value"])
    assert legacy["digest"] != fp0["digest"] and SECRET in json.dumps(legacy)
    erase(params, ["r3", "r7"])
    _, _, fp, _ = store(params)
    assert matches(legacy, fp) and describe_mismatch(legacy, fp) == []
    other = {**before["preprocessing"], "categories": {**before["preprocessing"]["categories"], "soil": ["A"]}}
    changed = fingerprint({**legacy_value, "preprocessing": other}, c["model"]["value"], c["recipe"]["value"])
    lines = describe_mismatch(changed, fp)
    assert not matches(changed, fp) and lines == ["dataset: preprocessing.categories.soil was 1, now 5"]


def test_a_table_value_that_reads_as_a_placeholder_is_refused(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,soil,x,y\n" + "\n".join(f"r{i},{'<erased 1>' if i == 2 else 'AB'[i % 2]},{i},{i % 2}"
                                                for i in range(12)) + "\n")
    with pytest.raises(DataError, match="placeholders of erased categories"):
        load_dataset("table", path=str(path), id_column="id", label_column="y")
