import math

import numpy as np
import pytest
import torch

from unlearning.config import Gate
from unlearning.gate import evaluate_gate
from unlearning.partition import knn_scores, partition_by_group, partition_by_score, subset_sizes


def test_group_partition():
    t = partition_by_group(["a", "b", "c", "d"], ["x", "y", "x", "z"], ["x"])
    assert t["subset"].tolist() == ["adjacent", "remote", "adjacent", "remote"]
    assert subset_sizes(t) == {"adjacent": 2, "remote": 2}


def test_score_partition_takes_top_fraction():
    t = partition_by_score(["a", "b", "c", "d", "e"], [0.1, 5.0, 0.3, 2.0, 0.0], top_fraction=0.4)
    assert t.loc[t.subset == "adjacent", "sample_id"].tolist() == ["b", "d"]


def test_knn_scores_against_brute_force():
    g = torch.Generator().manual_seed(0)
    retain, forget = torch.randn(30, 4, generator=g), torch.randn(3, 4, generator=g)
    adjacent, score = knn_scores(retain, forget, k=2)
    d = np.linalg.norm(forget.double().numpy()[:, None] - retain.double().numpy()[None], axis=-1)
    expected = np.zeros(30, bool)
    expected[np.argsort(d, axis=1)[:, :2].ravel()] = True
    assert (adjacent == expected).all()
    assert np.allclose(score, -d.min(0))


def metrics(**kw):
    m = {f"{p}/{s}": 0.9 for p in ("acc", "oracle_acc", "original_acc") for s in ("forget", "adjacent", "remote", "validation")}
    m.update(kw)
    return m


def test_retrain_equivalence_gate():
    v = evaluate_gate("retrain_equivalence", metrics(), Gate())
    assert v.passed and not v.failures
    v = evaluate_gate("retrain_equivalence", metrics(**{"acc/forget": 0.5}), Gate())
    assert not v.passed and v.failures == ["accuracy_gap/forget = 0.4000 (needs <= 0.05)"]


def test_suppression_gate():
    ok = metrics(**{"acc/forget": 0.01, "acc/adjacent": 0.85})
    assert evaluate_gate("suppression", ok, Gate()).passed
    bad = evaluate_gate("suppression", metrics(**{"acc/forget": 0.3, "acc/adjacent": 0.5}), Gate())
    assert len(bad.failures) == 2


def test_nan_never_passes():
    v = evaluate_gate("retrain_equivalence", metrics(**{"acc/validation": math.nan}), Gate())
    assert not v.passed


def test_unknown_objective():
    with pytest.raises(ValueError, match="allowed"):
        evaluate_gate("oops", metrics(), Gate())


def test_klom_relative_to_noise_floor():
    m = metrics(**{"klom_p95/forget": 2.9, "noise_floor_p95/forget": 2.0,
                   "klom_p95/validation": 1.0, "noise_floor_p95/validation": 2.0})
    v = evaluate_gate("retrain_equivalence", m, Gate())
    assert v.passed and v.checks["klom_p95/forget"]["limit"] == 3.0  # 1.5 x the noise floor
    m["klom_p95/forget"] = 3.5
    v = evaluate_gate("retrain_equivalence", m, Gate())
    assert v.failures == ["klom_p95/forget = 3.5000 (needs <= 3.0)"]
    off = Gate(retrain_equivalence={"max_klom_to_noise_floor": None})
    assert evaluate_gate("retrain_equivalence", m, off).passed
