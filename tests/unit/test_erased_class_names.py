"""A class that only erased rows had (a person's name as the label, a one-row class) is a raw value of forgotten
rows, like an erased one-hot category: it must leave dataset.json, the fingerprint and the names the batch
registers its champion with, while the output width, the kept rows' labels and the state check stay."""

import json

import numpy as np
import pytest

from tasks.id_key import IdKey
from tasks.stages import names_after_erasure
from tasks.training import prepare_dataset
from unlearning.data import load_prepared
from unlearning.data.store import erased_class_names
from unlearning.privacy.erasure import add_tombstones
from unlearning.privacy.fingerprint import describe_mismatch, fingerprint, matches, prepared_fingerprint

from tests.unit.test_erased_categories import assert_no_raw_value, erase
from tests.unit.test_erased_categories import project as table_project

pytestmark = pytest.mark.filterwarnings("error")

NAME = "Alice Smith"  # the label of r2 only (train)
SECOND = "Bob Jones"  # the label of r4 only (train), erased in a second batch
KEPT = "Carol Val"  # r3 (train, erased) and r10 (val, kept): it stays


def label(i: int) -> str:
    return {2: NAME, 4: SECOND, 3: KEPT, 10: KEPT}.get(i, f"c{i % 2}")


CSV = "id,x,who,s\n" + "\n".join(f"r{i},{0.5 * i},{label(i)},{'val' if i >= 9 else 'train'}"
                                    for i in range(12)) + "\n"


def project(tmp_path, hash_ids=False):
    return table_project(tmp_path, hash_ids, csv=CSV, label_column="who")


def store(params):
    p = load_prepared(params.path("prepared_dir"))
    return p, prepared_fingerprint(params.train, params.base.seed, params.root, p.info, p.manifest)


@pytest.mark.parametrize("hash_ids", [False, True])
def test_a_class_only_erased_rows_had_is_renamed_in_place(tmp_path, hash_ids):
    params = project(tmp_path, hash_ids)
    prepare_dataset.fn(params)
    before, fp0 = store(params)
    names = before.info["class_names"]
    assert NAME in names and KEPT in names and NAME not in json.dumps(fp0)  # the identity holds counts
    # what the batch registers its champion with, before the erasure runs
    registered = names_after_erasure(IdKey.of(params), params.deletion, before, ["r2", "r3"])
    assert erase(params, ["r2", "r3"]) == 2
    after, fp = store(params)
    assert after.info["class_names"] == [n if n != NAME else "<erased 1>" for n in names] == registered
    assert after.info["fine_class_names"] == after.info["class_names"]
    assert KEPT in after.info["class_names"]  # a val row still has it
    kept = before.manifest["sample_id"].isin(after.manifest["sample_id"])
    assert np.array_equal(after.label, before.label[kept.to_numpy()])  # labels and output width unchanged
    assert_no_raw_value(params, fp, NAME)
    assert matches(fp0, fp) and describe_mismatch(fp0, fp) == []
    prepare_dataset.fn(params)  # dvc repro prepare after the tombstones changed: the same store
    fresh, fp_fresh = store(params)
    assert fresh.info["class_names"] == after.info["class_names"] and fp_fresh["digest"] == fp0["digest"]


def test_successive_erasures_number_the_classes_like_a_fresh_prepare(tmp_path):
    params = project(tmp_path)
    prepare_dataset.fn(params)
    names = store(params)[0].info["class_names"]
    assert names == [NAME, SECOND, KEPT, "c0", "c1"]  # sorted label values
    erase(params, ["r4"])
    assert store(params)[0].info["class_names"] == [NAME, "<erased 1>", KEPT, "c0", "c1"]
    erase(params, ["r2"])
    after, _ = store(params)
    assert after.info["class_names"] == ["<erased 1>", "<erased 2>", KEPT, "c0", "c1"]  # numbered by place
    prepare_dataset.fn(params)
    fresh, fp = store(params)
    assert fresh.info["class_names"] == after.info["class_names"]
    assert_no_raw_value(params, fp, NAME, SECOND)


def test_registered_names_leave_out_classes_of_earlier_tombstoned_rows(tmp_path):
    # inside `dvc repro` the prepared store is rewritten later (pending): the tombstones already count
    params = project(tmp_path)
    prepare_dataset.fn(params)
    prepared, _ = store(params)
    add_tombstones(params.path("tombstones"), ["r4"])
    names = names_after_erasure(IdKey.of(params), params.deletion, prepared, ["r2"])
    assert NAME not in names and SECOND not in names and KEPT in names
    assert names_after_erasure(IdKey.of(params), params.deletion, prepared, []) == [
        n if n != SECOND else "<erased 1>" for n in prepared.info["class_names"]]


def test_built_in_vocabularies_are_not_renamed():
    # digits' "0".."9" are the dataset's names, not values of rows: erasing all of class 3 keeps "3"
    import pandas as pd
    info = {"name": "digits", "class_names": [str(i) for i in range(10)], "fine_class_names": [str(i) for i in range(10)]}
    manifest = pd.DataFrame({"label": np.arange(10), "class_name": [str(i) for i in range(10)]})
    keep = np.arange(10) != 3
    assert erased_class_names(info, manifest, keep) == {k: info[k] for k in ("class_names", "fine_class_names")}


def test_a_state_recorded_with_class_names_still_matches(tmp_path):
    params = project(tmp_path)
    prepare_dataset.fn(params)
    before, fp0 = store(params)
    c = fp0["components"]
    legacy = fingerprint({**c["dataset"]["value"], "class_names": before.info["class_names"],
                          "fine_class_names": before.info["fine_class_names"]}, c["model"]["value"],
                         c["recipe"]["value"])
    assert NAME in json.dumps(legacy) and legacy["digest"] != fp0["digest"]
    erase(params, ["r2"])
    _, fp = store(params)
    assert matches(legacy, fp) and describe_mismatch(legacy, fp) == []
