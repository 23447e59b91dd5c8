"""Accuracy per split, output gap (KL direction, float64 loop reference), oracle coverage."""

import math

import numpy as np
import pytest
import torch

from unlearning.metrics import (
    accuracy_by_split,
    accuracy_by_split_per_member,
    oracle_coverage,
    output_gap,
    output_gap_summary,
)


def _onehot_logits(pred, n_classes=3):
    z = np.zeros(pred.shape + (n_classes,))
    np.put_along_axis(z, pred[..., None], 5.0, axis=-1)
    return z


def test_accuracy_by_split_hand_case():
    labels = np.array([0, 1, 2, 0])
    splits = np.array(["forget", "forget", "validation", "remote"])
    pred = np.array([[0, 2, 2, 0], [0, 1, 1, 1]])  # member 0: F 1/2, V 1, R 1; member 1: F 1, V 0, R 0
    logits = _onehot_logits(pred)
    per = accuracy_by_split_per_member(logits, labels, splits)
    assert list(per) == ["forget", "remote", "validation"]
    np.testing.assert_allclose(per["forget"], [0.5, 1.0])
    np.testing.assert_allclose(per["validation"], [1.0, 0.0])
    acc = accuracy_by_split(torch.tensor(logits), labels, splits)
    assert acc == pytest.approx({"forget": 0.75, "remote": 0.5, "validation": 0.5})
    # a single model [n, C]
    assert accuracy_by_split(logits[1], labels, splits) == pytest.approx({"forget": 1.0, "remote": 0.0, "validation": 0.0})
    with pytest.raises(ValueError, match="split_labels"):
        accuracy_by_split(logits, labels, splits[:3])


def _softmax(z):
    e = [math.exp(v) for v in z]
    s = sum(e)
    return [v / s for v in e]


def test_output_gap_matches_loop_and_direction():
    rng = np.random.default_rng(0)
    zu = rng.normal(scale=2, size=(3, 5, 4))
    zo = rng.normal(scale=2, size=(4, 5, 4))
    got = output_gap(zu, zo)
    ref = []
    for i in range(5):
        q = np.mean([_softmax(zo[k, i]) for k in range(4)], axis=0)
        kls = []
        for k in range(3):
            p = _softmax(zu[k, i])
            kls.append(sum(p[c] * math.log(p[c] / q[c]) for c in range(4)))
        ref.append(np.mean(kls))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    # direction pinned by a single-member asymmetric case: KL(p || q) with p the unlearned distribution
    pu, po = np.log([[0.9, 0.1]]), np.log([[0.5, 0.5]])
    kl_uo = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    kl_ou = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert output_gap(pu, po)[0] == pytest.approx(kl_uo, rel=1e-12)
    assert output_gap(po, pu)[0] == pytest.approx(kl_ou, rel=1e-12)
    assert output_gap(zo, zo[:1]).shape == (5,)
    np.testing.assert_allclose(output_gap(zu[:1], zu[:1]), 0.0, atol=1e-15)


def test_output_gap_is_finite_for_extreme_logits_and_summarizes():
    zu = np.array([[[800.0, 0.0, -800.0]]])
    zo = np.array([[[-800.0, 0.0, 800.0]]])
    gap = output_gap(zu, zo)
    assert np.isfinite(gap[0]) and gap[0] == pytest.approx(1600.0, rel=1e-9)
    s = output_gap_summary(np.array([1.0, 2.0, 3.0]), ["forget", "forget", "validation"])
    assert s["forget"]["mean"] == 1.5 and s["validation"]["p95"] == 3.0


def test_oracle_coverage_simple_case():
    oracles = np.repeat(np.arange(101.0)[:, None], 4, axis=1)  # per sample: 0..100 -> [2.5, 97.5]
    production = np.array([50.0, 1.0, 99.0, 2.5])
    assert oracle_coverage(production, oracles) == 0.5
    assert oracle_coverage(production, oracles, level=0.99) == 1.0  # [0.5, 99.5]
    assert oracle_coverage(production, oracles, level=0.9) == 0.25  # [5, 95]
    # a draw from the oracle distribution itself covers about `level` of the samples
    rng = np.random.default_rng(1)
    cov = oracle_coverage(rng.normal(size=2000), rng.normal(size=(400, 2000)))
    assert 0.93 < cov < 0.97
    with pytest.raises(ValueError, match="level"):
        oracle_coverage(production, oracles, level=1.5)
    with pytest.raises(ValueError, match="samples"):
        oracle_coverage(production[:3], oracles)
