"""Smoke test of bench/entanglement.py --quick (the entangled-setting benchmark on Fashion-MNIST)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = Path("/usr/share/datasets/fashion-mnist")

pytestmark = pytest.mark.slow


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_entanglement", ROOT / "bench" / "entanglement.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return load_bench()


def test_roc_auc_matches_sklearn(bench):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    pos = rng.normal(0.5, 1, 300).round(1)  # rounding makes ties
    neg = rng.normal(0.0, 1, 500).round(1)
    ref = roc_auc_score(np.r_[np.ones(300), np.zeros(500)], np.r_[pos, neg])
    assert bench.roc_auc(pos, neg) == pytest.approx(ref, abs=1e-12)
    assert bench.roc_auc([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert bench.roc_auc([0.0], [1.0]) == 0.0
    with pytest.raises(ValueError):
        bench.roc_auc([], [1.0])


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"Fashion-MNIST not installed at {DATA_DIR}")
def test_quick_run_writes_every_method(bench, tmp_path):
    results = bench.main(["--quick", "--max-train", "1500", "--max-val", "500", "--threads", "1",
                          "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "entanglement.json").read_text())
    assert (tmp_path / "entanglement.md").read_text().count("|") > 20
    assert data["quick"] is True and data["sizes"]["forget"] > 0 and data["sizes"]["adjacent"] > 0
    assert set(data["methods"]) == set(bench.METHODS)
    joint = data["joint_reference"]["3.0"]["accuracy"]  # the from-scratch frontier reference
    assert joint["forget"] < data["methods"]["original"]["accuracy"]["forget"]
    for name, row in data["methods"].items():
        acc = row["accuracy"]
        for split in ("forget", "adjacent", "remote", "validation", "val_shirt", "val_nonshirt"):
            assert 0.0 <= acc[split] <= 1.0, (name, split, acc[split])
        assert row["gradient_evals"] >= 0 and row["seconds"] >= 0
        assert sum(acc["forget_pred"].values()) == pytest.approx(1.0, abs=1e-3)
    # the original learned something, and retraining is the same recipe on the retain rows
    assert data["methods"]["original"]["accuracy"]["validation"] > 0.5
    assert data["methods"]["al_wpgd"]["args"]["stage2_steps"] == 300
    # the acceptance verdict is the declared criterion applied to al_wpgd's and the original's accuracies
    # (super-class targets: forget < 5% while adjacent keeps >= 0.9x the original's)
    orig, al, verdict = (data["methods"]["original"]["accuracy"], data["methods"]["al_wpgd"]["accuracy"],
                         data["acceptance"])
    assert verdict["forget"] == al["forget"] and verdict["adjacent"] == al["adjacent"]
    assert verdict["adjacent_needed"] == pytest.approx(bench.ACCEPT_ADJACENT_RATIO * orig["adjacent"])
    assert verdict["passed"] is (al["forget"] < bench.ACCEPT_FORGET_MAX and al["adjacent"] >= verdict["adjacent_needed"])
    # the suppression method suppresses: al_wpgd's forget accuracy falls below the original's
    assert al["forget"] < orig["forget"], (al, orig)
    for mode in ("leverage", "embedding"):
        assert 0.0 <= data["partition"][mode]["auc"] <= 1.0
    assert data["partition"]["leverage"]["solver"] == "projected"
    assert results["wall_seconds"] == pytest.approx(data["wall_seconds"])
