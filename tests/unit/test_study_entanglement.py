"""S4 "Retain-Forget Entanglement" (unlearning/studies/entanglement.py) on a tiny config: the result's schema,
the row order, retrain on fine labels never predicting Shirt, sizes adding up, the seeded subsample, the
presets, the markdown table and the progress lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from unlearning.config import Prepare, S4Entanglement
from unlearning.studies import entanglement as s4

DATA_DIR = Prepare().fashion_mnist_dir  # params key prepare.fashion_mnist_dir (its default)
if not Path(DATA_DIR).is_dir():
    pytest.skip(f"Fashion-MNIST not installed at {DATA_DIR} (Debian package dataset-fashion-mnist)",
                allow_module_level=True)

MAX_TRAIN, MAX_VAL = 800, 300
METHODS = ["retrain", "finetune", "gradient_ascent", "al_wpgd_stage1", "al_wpgd"]
TINY = S4Entanglement(
    seed=0, max_train=MAX_TRAIN, max_val=MAX_VAL, targets=["fine", "super"], models=["mlp", "cnn"], hidden=[32],
    channels=[4, 8], epochs=6, lr=3e-3, methods=METHODS,
    method_args={"finetune": {"epochs": 1}, "gradient_ascent": {"epochs": 2},
                 "al_wpgd_stage1": {"stage1_steps": 20}, "al_wpgd": {"stage1_steps": 20, "stage2_steps": 20}},
    frontier_weights=[10.0])
ROW_KEYS = {"method", "forget", "adjacent", "remote", "validation", "val_shirt", "val_nonshirt", "seconds",
            "gradient_evals"}
FRONTIER_KEYS = {"weight", "forget", "adjacent", "remote", "validation", "seconds"}


@pytest.fixture(scope="module")
def result():
    return s4.run_s4(TINY, DATA_DIR, progress=False)


def test_schema_and_json(result):
    assert set(result) == {"study", "config", "device", "settings", "wall_seconds"}
    assert result["study"] == "s4" and result["device"] == "cpu" and result["config"] == TINY.model_dump()
    assert json.loads(json.dumps(result)) == result  # plain JSON values only
    assert [(s["targets"], s["model"]) for s in result["settings"]] == [
        ("fine", "mlp"), ("fine", "cnn"), ("super", "mlp"), ("super", "cnn")]
    for s in result["settings"]:
        assert set(s) == {"targets", "model", "n_params", "n_classes", "sizes", "rows", "frontier"}
        assert s["n_classes"] == (10 if s["targets"] == "fine" else 5)
        assert isinstance(s["n_params"], int) and s["n_params"] > 0
        assert [r["method"] for r in s["rows"]] == ["original", *METHODS]  # the original first
        for r in s["rows"]:
            assert set(r) == ROW_KEYS
            assert isinstance(r["gradient_evals"], int) and r["gradient_evals"] >= 0 and r["seconds"] >= 0
        assert [f["weight"] for f in s["frontier"]] == [10.0]
        assert all(set(f) == FRONTIER_KEYS for f in s["frontier"])
    assert result["wall_seconds"] >= sum(r["seconds"] for s in result["settings"] for r in s["rows"])
    # the architectures differ as configured: MLP 784-32-C, CNN [4, 8]
    mlp = {s["targets"]: s["n_params"] for s in result["settings"] if s["model"] == "mlp"}
    assert mlp == {"fine": 784 * 32 + 32 + 32 * 10 + 10, "super": 784 * 32 + 32 + 32 * 5 + 5}


def test_accuracies_in_unit_interval(result):
    for s in result["settings"]:
        for r in s["rows"] + s["frontier"]:
            for k in ("forget", "adjacent", "remote", "validation", "val_shirt", "val_nonshirt"):
                if k in r:
                    assert 0.0 <= r[k] <= 1.0 and not math.isnan(r[k]), (s["targets"], s["model"], r["method"]
                                                                          if "method" in r else r["weight"], k)


def test_retrain_on_fine_labels_never_predicts_shirt(result):
    for s in result["settings"]:
        rows = {r["method"]: r for r in s["rows"]}
        # the original learned something: the pipeline trains at all
        assert rows["original"]["validation"] > 0.3, (s["model"], s["targets"])
        if s["targets"] == "fine":  # the retain set has no Shirt: a retrain does not predict it
            assert rows["original"]["forget"] > 0.15, s["model"]  # ... while the original does
            assert rows["retrain"]["forget"] < 0.05, s["model"]
            assert rows["retrain"]["forget"] <= rows["original"]["forget"]
            assert rows["retrain"]["val_shirt"] < 0.05
        # the gradient evaluations are those of the recipe (epochs x rows) for the two trainings
        z = s["sizes"]
        assert rows["original"]["gradient_evals"] == TINY.epochs * (z["forget"] + z["retain"])
        assert rows["retrain"]["gradient_evals"] == TINY.epochs * z["retain"]


def test_sizes_add_up(result):
    first = result["settings"][0]["sizes"]
    for s in result["settings"]:
        z = s["sizes"]
        assert z == first  # the same rows for every target setting and model
        assert z["forget"] + z["retain"] == MAX_TRAIN
        assert z["adjacent"] + z["remote"] == z["retain"]
        assert z["validation"] == MAX_VAL
        assert z["forget"] > 0 and z["adjacent"] > 0 and z["remote"] > 0


def test_seeded_subsample_and_partition():
    a = s4.load_entanglement_data(DATA_DIR, "fine", seed=0, max_train=MAX_TRAIN, max_val=MAX_VAL)
    b = s4.load_entanglement_data(DATA_DIR, "super", seed=0, max_train=MAX_TRAIN, max_val=MAX_VAL)
    c = s4.load_entanglement_data(DATA_DIR, "fine", seed=1, max_train=MAX_TRAIN, max_val=MAX_VAL)
    assert np.array_equal(a["train_ids"], b["train_ids"]) and np.array_equal(a["val_ids"], b["val_ids"])
    assert not np.array_equal(a["train_ids"], c["train_ids"])
    assert len(a["train_ids"]) == MAX_TRAIN and len(set(a["train_ids"])) == MAX_TRAIN
    # forget = every kept training Shirt (label 6 under fine targets, "tops" = 0 under super targets)
    assert (a["y_forget"] == 6).all() and (b["y_forget"] == 0).all() and (a["y_retain"] != 6).all()
    # adjacent = T-shirt/top (0), Pullover (2), Coat (4); remote = the rest
    assert np.array_equal(a["adjacent"], np.isin(a["fine_retain"], [0, 2, 4]))
    assert (b["y_retain"][b["adjacent"]] == 0).all() and (b["y_retain"][~b["adjacent"]] != 0).all()
    # roughly the class proportions of the full data (one class in ten)
    assert 0.05 < len(a["X_forget"]) / MAX_TRAIN < 0.15


def test_presets_and_merge():
    assert s4.study_args("al_wpgd", "super") == s4.AL_WPGD_ARGS
    assert s4.study_args("al_wpgd", "fine") == {}  # the method's defaults on fine labels
    assert s4.study_args("al_wpgd_stage1", "super")["stage2_steps"] == 0
    assert s4.study_args("al_wpgd", "super", {"al_wpgd": {"stage2_steps": 7}}) == {**s4.AL_WPGD_ARGS,
                                                                                 "stage2_steps": 7}
    assert s4.study_args("finetune", "fine", {"finetune": {"epochs": 1}}) == {"epochs": 1}
    assert s4.method_of("al_wpgd_stage1") == "al_wpgd" and s4.method_of("scrub") == "scrub"


def test_bad_method_args_fail_before_training():
    bad = TINY.model_copy(update={"method_args": {"finetune": {"epochz": 1}}})
    with pytest.raises(ValueError, match="epochz"):
        s4.run_s4(bad, DATA_DIR, progress=False)
    typo = TINY.model_copy(update={"method_args": {"fintune": {"epochs": 1}}})
    with pytest.raises(ValueError, match="fintune"):
        s4.run_s4(typo, DATA_DIR, progress=False)
    with pytest.raises(KeyError, match="no_such_method"):
        s4.run_s4(TINY.model_copy(update={"methods": ["no_such_method"]}), DATA_DIR, progress=False)


def test_markdown_has_a_row_per_method_and_setting(result):
    md = s4.markdown_s4(result)
    lines = md.splitlines()
    assert "| targets | model | method | forget | adjacent | remote | validation | seconds |" in lines
    table = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| targets")]
    assert len(table) == sum(len(s["rows"]) + len(s["frontier"]) for s in result["settings"])
    for s in result["settings"]:
        for r in s["rows"]:
            prefix = f"| {s['targets']} | {s['model']} | {r['method']} | {r['forget']:.3f} | {r['adjacent']:.3f} |"
            assert sum(ln.startswith(prefix) for ln in table) == 1, prefix
        assert any(ln.startswith(f"| {s['targets']} | {s['model']} | from scratch, w = 10 (frontier, not an "
                                 f"unlearner) |") for ln in table)
        z = s["sizes"]
        assert any(ln.startswith(f"- {s['targets']} / {s['model']}: {MAX_TRAIN:,} training rows") and
                   f"{s['n_params']:,} params" in ln and f"{z['forget']:,} forget" in ln for ln in lines)


def test_progress_lines_off_a_terminal(capsys):
    one = TINY.model_copy(update={"targets": ["fine"], "models": ["mlp"], "methods": ["retrain"],
                                  "method_args": {}, "frontier_weights": [], "epochs": 1})
    s4.run_s4(one, DATA_DIR, progress="s4 test")
    err = capsys.readouterr().err
    assert "s4 test" in err and "2/2 runs (100%)" in err
    s4.run_s4(one, DATA_DIR, progress=False)
    assert "s4 test" not in capsys.readouterr().err  # nothing printed with progress off
