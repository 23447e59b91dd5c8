"""Ridge regression: leverage diagnostics against actual retraining and the identities of docs/design.md §4.1."""

import numpy as np
import pytest

from unlearning.leverage import ridge_diagnostics


def ridge_fit(X, y, lam):
    return np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1]), X.T @ y)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    n, d = 60, 6
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, size=d)
    X[:, -1] = 1.0  # an explicit intercept column (ridge_diagnostics adds none)
    y = X @ rng.normal(size=d) + rng.normal(size=n)
    y[[2, 30]] += 8.0  # two outliers in the forget set: large residuals
    forget = np.array([30, 2, 11, 47, 5])  # unsorted on purpose: outputs follow this order
    return X, y, forget, 0.9


def test_matches_actual_retraining(problem):
    X, y, forget, lam = problem
    r = ridge_diagnostics(X, y, forget, lam)
    retain = np.setdiff1d(np.arange(len(y)), forget)
    theta_D, theta_R = ridge_fit(X, y, lam), ridge_fit(X[retain], y[retain], lam)
    np.testing.assert_allclose(r.theta_D, theta_D, rtol=0, atol=1e-10)
    np.testing.assert_allclose(r.theta_R, theta_R, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(r.retain_idx, retain)
    gap_F = X[forget] @ theta_D - X[forget] @ theta_R
    gap_R = X[retain] @ theta_D - X[retain] @ theta_R
    assert r.predicted_gap_forget.shape == (len(forget),) and r.predicted_gap_retain.shape == (len(retain),)
    np.testing.assert_allclose(r.predicted_gap_forget, gap_F, rtol=0, atol=1e-8)
    np.testing.assert_allclose(r.predicted_gap_retain, gap_R, rtol=0, atol=1e-8)
    assert np.abs(gap_F).max() > 0.1  # the test is not vacuous


def test_design_identities(problem):
    X, y, forget, lam = problem
    r = ridge_diagnostics(X, y, forget, lam)
    retain = r.retain_idx
    XF, XR = X[forget], X[retain]
    H_D = X.T @ X + lam * np.eye(X.shape[1])
    H_R = XR.T @ XR + lam * np.eye(X.shape[1])
    e_F = y[forget] - XF @ ridge_fit(X, y, lam)
    np.testing.assert_allclose(r.residual_forget, e_F, atol=1e-10)
    # S_F = X_F H_R^-1 X_F^T, C_RF = X_R H_R^-1 X_F^T
    S_F, C_RF = XF @ np.linalg.solve(H_R, XF.T), XR @ np.linalg.solve(H_R, XF.T)
    assert r.self_leverage.shape == (len(forget), len(forget)) and r.cross_leverage.shape == (len(retain), len(forget))
    np.testing.assert_allclose(r.self_leverage, S_F, atol=1e-10)
    np.testing.assert_allclose(r.cross_leverage, C_RF, atol=1e-10)
    # theta_D - theta_R = H_R^-1 X_F^T e_F; gaps S_F e_F on F and C_RF e_F on R
    np.testing.assert_allclose(r.theta_D - r.theta_R, np.linalg.solve(H_R, XF.T @ e_F), atol=1e-10)
    np.testing.assert_allclose(r.predicted_gap_forget, S_F @ e_F, atol=1e-10)
    np.testing.assert_allclose(r.predicted_gap_retain, C_RF @ e_F, atol=1e-10)
    # precomputable from the original fit: S_F = P_F (I - P_F)^-1, P_F = X_F H_D^-1 X_F^T
    P_F = XF @ np.linalg.solve(H_D, XF.T)
    np.testing.assert_allclose(r.original_leverage, P_F, atol=1e-12)
    np.testing.assert_allclose(r.self_leverage, P_F @ np.linalg.inv(np.eye(len(forget)) - P_F), atol=1e-10)
    # leakage ratio ||C_RF e_F|| / ||S_F e_F||
    assert r.leakage_ratio == pytest.approx(np.linalg.norm(C_RF @ e_F) / np.linalg.norm(S_F @ e_F), rel=1e-10)
    # the generic report agrees: per-sample self-leverage is the diagonal, cross-leverage the row norms
    np.testing.assert_allclose(r.report.self_leverage, np.diag(S_F), atol=1e-10)
    np.testing.assert_allclose(r.report.cross_leverage, np.linalg.norm(C_RF, axis=1), atol=1e-10)
    assert r.report.self_leverage_trace == pytest.approx(np.trace(S_F), rel=1e-10)
    assert r.report.self_leverage_spectral_norm == pytest.approx(np.linalg.eigvalsh(S_F)[-1], rel=1e-10)
    # theta_D is stationary for ridge: the removal-only movement is the whole gap
    np.testing.assert_allclose(r.report.predicted_removal_gap_forget, np.abs(S_F @ e_F), atol=1e-10)
    np.testing.assert_allclose(r.report.predicted_removal_gap_retain, np.abs(C_RF @ e_F), atol=1e-10)


def test_preconditioned_ascent_step(problem):
    """theta - eta P^-1 X_F^T e_F lands on the oracle iff P = H_R, eta = 1; gradient ascent (P = I) misses
    F's oracle outputs by (S_F - eta X_F X_F^T) e_F (docs/design.md §4.1)."""
    X, y, forget, lam = problem
    r = ridge_diagnostics(X, y, forget, lam)
    XF, XR = X[forget], X[r.retain_idx]
    H_R = XR.T @ XR + lam * np.eye(X.shape[1])
    e_F = r.residual_forget
    newton = r.theta_D - np.linalg.solve(H_R, XF.T @ e_F)
    np.testing.assert_allclose(newton, r.theta_R, atol=1e-10)
    eta = 0.01
    ascent = r.theta_D - eta * XF.T @ e_F
    err_F = XF @ ascent - XF @ r.theta_R
    np.testing.assert_allclose(err_F, (r.self_leverage - eta * XF @ XF.T) @ e_F, atol=1e-10)
    assert np.linalg.norm(err_F) > 1e-3


def test_dict_and_attribute_access(problem):
    X, y, forget, lam = problem
    r = ridge_diagnostics(X, y, forget, lam)
    for key in ("self_leverage", "cross_leverage", "predicted_gap_forget", "predicted_gap_retain"):
        assert r[key] is getattr(r, key) and isinstance(r[key], np.ndarray) and r[key].dtype == np.float64
    with pytest.raises(KeyError, match="available"):
        r["nope"]


def test_bad_input_is_named(problem):
    X, y, _, lam = problem
    with pytest.raises(ValueError, match="forget_idx"):
        ridge_diagnostics(X, y, [3, 3], lam)
    with pytest.raises(ValueError, match="forget_idx"):
        ridge_diagnostics(X, y, [len(y)], lam)
    with pytest.raises(ValueError, match="X must be"):
        ridge_diagnostics(X, y[:-1], [0], lam)
    dependent = np.column_stack([X, 2.0 * X[:, 0]])  # a linearly dependent column: H_R singular without damping
    with pytest.raises(ValueError, match="rank 6 < 7 columns"):
        ridge_diagnostics(dependent, y, [0], 0.0)


def test_forget_index_order_and_strides(problem):
    # a reversed view (negative strides) is a valid index array; outputs follow the given order
    X, y, forget, lam = problem
    a, b = ridge_diagnostics(X, y, forget[::-1], lam), ridge_diagnostics(X, y, forget[::-1].copy(), lam)
    assert np.array_equal(a.forget_idx, forget[::-1])
    assert np.allclose(a.predicted_gap_forget, b.predicted_gap_forget, rtol=0, atol=0)
