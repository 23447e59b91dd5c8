"""The fingerprint of (dataset, model spec, recipe) and its mismatch report (unlearning/privacy/fingerprint.py)."""

import json

import pytest

from unlearning.config import parse_params
from unlearning.privacy.fingerprint import (
    StateMismatch, dataset_identity, describe_mismatch, digest, fingerprint, matches, mismatch_error,
    params_fingerprint, read_dataset_identity,
)

INFO = {"name": "toy", "class_names": ["a", "b"], "image_shape": [2, 2], "n_samples": 4, "n_train": 3, "n_val": 1,
        "source": "synthetic", "prepared_at": "2026-11-28T08:00:00Z"}
IDS = ["s0", "s1", "s2", "s3"]
SPLITS = ["train", "train", "train", "val"]


def fp(params=None, info=INFO, ids=IDS, splits=SPLITS):
    params = params or parse_params({})
    return params_fingerprint(params.train, params.base.seed, params.root, dataset_identity(info, ids, splits))


def test_shape_and_stability():
    a = fp()
    assert set(a) == {"digest", "components"} and len(a["digest"]) == 16
    assert set(a["components"]) == {"dataset", "model", "recipe"}
    assert all(len(c["digest"]) == 16 and "value" in c for c in a["components"].values())
    assert fp()["digest"] == a["digest"]
    # survives a JSON round trip (champion.json) unchanged
    assert matches(json.loads(json.dumps(a)), a)


def test_order_independent():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    shuffled_info = dict(reversed(list(INFO.items())))
    assert fp(info=shuffled_info, ids=IDS[::-1], splits=SPLITS[::-1])["digest"] == fp()["digest"]
    # but a sample moved to another split is another dataset
    assert fp(splits=["train", "train", "val", "train"])["digest"] != fp()["digest"]


def test_timestamps_are_ignored():
    later = {**INFO, "prepared_at": "2027-01-01T00:00:00Z", "prepare_seconds": 3.2,
             "source_info": {"read_at": "2027-01-01"}}
    assert fp(info=later)["digest"] == fp(info={**INFO, "source_info": {}})["digest"]
    assert fp(info={k: v for k, v in later.items() if k != "source_info"})["digest"] == fp()["digest"]
    assert "prepared_at" not in fp()["components"]["dataset"]["value"]


def test_recipe_is_every_train_key_but_model():
    p = parse_params({})
    recipe = fp(p)["components"]["recipe"]["value"]
    assert set(recipe) == (set(p.train.model_dump()) - {"model"}) | {"seed"}
    assert fp(p)["components"]["model"]["value"] == p.train.model.model_dump(mode="json")


def test_changed_recipe_key_is_reported_with_old_and_new():
    old, new = fp(), fp(parse_params({"train": {"epochs": 5}}))
    assert not matches(old, new)
    lines = describe_mismatch(old, new)
    assert lines == ["recipe: epochs was 30, now 5"]


def test_changed_model_key_is_reported():
    lines = describe_mismatch(fp(), fp(parse_params({"train": {"model": {"hidden": [64, 64]}}})))
    assert lines == ["model: hidden was [32], now [64, 64]"]


def test_added_model_kwargs_read_as_added_keys():
    custom = {"arch": "custom", "factory": "my_model:build"}
    lines = describe_mismatch(fp(parse_params({"train": {"model": custom}})),
                              fp(parse_params({"train": {"model": {**custom, "kwargs": {"width": 4, "p": 0.3}}}})))
    assert sorted(lines) == ["model: kwargs.p was (absent), now 0.3", "model: kwargs.width was (absent), now 4"]


def test_changed_dataset_is_reported():
    other = {**INFO, "n_train": 2, "n_val": 2}
    lines = describe_mismatch(fp(), fp(info=other, splits=["train", "train", "val", "val"]))
    assert "dataset: n_train was 3, now 2" in lines and "dataset: n_val was 1, now 2" in lines
    assert any(line.startswith("dataset: manifest_digest was ") for line in lines)
    assert all(not line.startswith(("model", "recipe")) for line in lines)


def test_matching_fingerprints_have_no_lines_and_missing_record_is_named():
    assert describe_mismatch(fp(), fp()) == []
    lines = describe_mismatch(None, fp())
    assert lines == ["dataset: not recorded before", "model: not recorded before", "recipe: not recorded before"]


def test_mismatch_error_is_a_value_error_with_a_way_out():
    e = mismatch_error("state", fp(), fp(parse_params({"train": {"lr": 0.1}})))
    assert isinstance(e, StateMismatch) and isinstance(e, ValueError)
    msg = str(e)
    assert "lr was 0.01, now 0.1" in msg and "unlearn reset" in msg and "restore the previous params" in msg
    assert "\n" not in msg


def test_read_dataset_identity_from_a_prepared_folder(tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps(INFO))
    (tmp_path / "manifest.csv").write_text("sample_id,split,label,group,class_name\n" + "".join(
        f"{i},{s},0,g,a\n" for i, s in zip(IDS, SPLITS)))
    ident = read_dataset_identity(tmp_path)
    assert ident == dataset_identity(INFO, IDS, SPLITS, ["0"] * 4)
    with pytest.raises(FileNotFoundError, match="prepare"):
        read_dataset_identity(tmp_path / "nope")


def test_fingerprint_direct():
    a = fingerprint({"x": 1}, {"arch": "mlp"}, {"epochs": 1})
    b = fingerprint({"x": 1}, {"arch": "mlp"}, {"epochs": 1})
    assert a == b and a["components"]["model"]["value"] == {"arch": "mlp"}
