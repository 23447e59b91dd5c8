"""Margins / logit-scaled confidence: float64 reference formula, stability, shapes, torch input, errors."""

import math

import numpy as np
import pytest
import torch

from unlearning.metrics import logit_scaled_confidence, margins


def _direct_margin(z, y):
    """Plain float64 loop: z_y - log(sum_{j != y} exp(z_j)) (fine for moderate logits)."""
    return z[y] - math.log(sum(math.exp(z[j]) for j in range(len(z)) if j != y))


def test_margins_match_direct_formula_float64():
    rng = np.random.default_rng(0)
    z = rng.normal(scale=3.0, size=(7, 5))
    y = rng.integers(0, 5, size=7)
    got = margins(z, y)
    ref = np.array([_direct_margin(z[i], y[i]) for i in range(7)])
    assert got.dtype == np.float64 and got.shape == (7,)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)


def test_margins_keep_leading_model_dims_and_accept_torch():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3, 6, 4))
    y = rng.integers(0, 4, size=6)
    got = margins(torch.tensor(z), torch.tensor(y))
    assert isinstance(got, np.ndarray) and got.shape == (3, 6) and got.dtype == np.float64
    for k in range(3):
        np.testing.assert_allclose(got[k], [_direct_margin(z[k, i], y[i]) for i in range(6)], atol=1e-12)
    # float32 tensors are upcast before the computation
    got32 = margins(torch.tensor(z, dtype=torch.float32), y)
    np.testing.assert_allclose(got32, got, atol=1e-5)


def test_margins_are_stable_for_huge_logits():
    z = np.array([[1000.0, 0.0, -5.0], [1000.0, 0.0, -5.0]])
    got = margins(z, np.array([0, 1]))
    assert got[0] == pytest.approx(1000.0 - math.log(1.0 + math.exp(-5.0)), abs=1e-12)
    assert got[1] == pytest.approx(-1000.0 - math.log1p(math.exp(-1005.0)), abs=1e-12)
    assert np.all(np.isfinite(got))


def test_logit_scaled_confidence_is_log_odds_of_true_class():
    rng = np.random.default_rng(2)
    z = rng.normal(scale=2.0, size=(10, 6))
    y = rng.integers(0, 6, size=10)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    py = p[np.arange(10), y]
    np.testing.assert_allclose(logit_scaled_confidence(z, y), np.log(py / (1 - py)), atol=1e-10)


def test_margins_reject_bad_input():
    with pytest.raises(ValueError, match="labels"):
        margins(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="labels"):
        margins(np.zeros((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="2 classes"):
        margins(np.zeros((2, 1)), np.array([0, 0]))
    with pytest.raises(ValueError, match="non-finite"):
        margins(np.array([[np.nan, 0.0]]), np.array([0]))
