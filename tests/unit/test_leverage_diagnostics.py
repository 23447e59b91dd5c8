"""compute_diagnostics on a tiny classifier: the report against brute-force float64 formulas."""

import json

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from unlearning.leverage import LeverageReport, StackedMemberFunction, compute_diagnostics, spearman
from unlearning.models import build_model, flat_params

SPEC = {"arch": "mlp", "in_dim": 4, "hidden": [5], "n_classes": 3, "image_shape": None}  # p = 43


@pytest.fixture(scope="module")
def setup():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(90, 4, generator=g)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 1).long()
    model = build_model(SPEC, [5, 6])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.5)
    F, R, V = torch.arange(0, 8), torch.arange(8, 80), torch.arange(80, 90)
    return model, X, y, F, R, V


def brute(model, member, X, y, F, R, V, lam):
    """Every diagnostic from explicit Jacobians, symmetric Lambda^1/2, dense solves (float64)."""
    fn = StackedMemberFunction(model, member, dtype=torch.float64, device="cpu")
    X = X.double()
    th = fn.theta0
    J = jacobian(lambda t: fn.outputs(t, X), th)                        # [n, C, p]
    f = fn.outputs(th, X)
    p = torch.softmax(f, 1)
    Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    w, U = torch.linalg.eigh(Lam)
    Lh = (U * w.clamp_min(0).sqrt().unsqueeze(-2)) @ U.transpose(-1, -2)
    g = p - torch.nn.functional.one_hot(y, 3).double()
    G_R = torch.einsum("ncp,ncd,ndq->pq", J[R], Lam[R], J[R]) + lam * torch.eye(fn.p, dtype=torch.float64)
    W = Lh @ J
    WF, WR = W[F].reshape(-1, fn.p), W[R].reshape(-1, fn.p)
    S = WF @ torch.linalg.solve(G_R, WF.T)
    C = WR @ torch.linalg.solve(G_R, WF.T)
    grad_R = torch.einsum("ncp,nc->p", J[R], g[R]) + lam * th
    delta = torch.linalg.solve(G_R, grad_R)
    fisher = lambda idx: torch.einsum("nc,ncd,nd->n", J[idx] @ delta, Lam[idx], J[idx] @ delta).sqrt()  # noqa
    wv = torch.linalg.solve(G_R, torch.einsum("ncp,nc->p", J[F], g[F]))
    leak = (W[R] @ wv).norm() / (W[F] @ wv).norm()
    d_out = J @ delta
    rem = torch.einsum("nc,ncd,nd->n", J @ wv, Lam, J @ wv).sqrt()
    return dict(rem_F=rem[F], rem_R=rem[R], rem_V=rem[V], self_lev=S.diagonal().reshape(len(F), 3).sum(1), S=S,
                cross=C.reshape(len(R), -1).norm(dim=1),
                gap_F=fisher(F), gap_R=fisher(R), gap_V=fisher(V), leak=leak, delta=delta,
                out_V=d_out[V] - d_out[V].mean(1, keepdim=True), J=J, G_R=G_R, Lam=Lam)


def test_exact_report_matches_brute_force(setup):
    model, X, y, F, R, V = setup
    lam = 0.2
    before = flat_params(model).clone()
    rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], X[V], y[V], lam, solver="exact", device="cpu", member=1)
    ref = brute(model, 1, X, y, F, R, V, lam)
    assert torch.equal(flat_params(model), before)  # never mutated
    assert isinstance(rep, LeverageReport) and rep.solver == "exact" and rep.n_params == 43
    assert rep.self_leverage.shape == (8,) and rep.cross_leverage.shape == (72,)
    np.testing.assert_allclose(rep.self_leverage, ref["self_lev"].numpy(), rtol=1e-9)
    np.testing.assert_allclose(rep.cross_leverage, ref["cross"].numpy(), rtol=1e-9)
    assert rep.self_leverage_trace == pytest.approx(float(ref["S"].trace()), rel=1e-9)
    assert rep.self_leverage_spectral_norm == pytest.approx(float(torch.linalg.eigvalsh(ref["S"])[-1]), rel=1e-9)
    np.testing.assert_allclose(rep.predicted_gap_forget, ref["gap_F"].numpy(), rtol=1e-8)
    np.testing.assert_allclose(rep.predicted_gap_retain, ref["gap_R"].numpy(), rtol=1e-8)
    np.testing.assert_allclose(rep.predicted_gap_validation, ref["gap_V"].numpy(), rtol=1e-8)
    np.testing.assert_allclose(rep.predicted_output_gap_validation, ref["out_V"].numpy(), atol=1e-10)
    np.testing.assert_allclose(rep.newton_step, ref["delta"].numpy(), rtol=1e-9, atol=1e-12)
    assert rep.leakage_ratio == pytest.approx(float(ref["leak"]), rel=1e-9)
    for split, key in (("forget", "rem_F"), ("retain", "rem_R"), ("validation", "rem_V")):
        np.testing.assert_allclose(getattr(rep, f"predicted_removal_gap_{split}"), ref[key].numpy(), rtol=1e-8)
    means = rep.predicted_gap_means()
    assert rep.predicted_gap_do_nothing == pytest.approx(max(means.values()))
    assert rep.approx_error is None
    assert min(rep.self_leverage) > 0 and rep.leakage_ratio > 0


def test_to_dict_is_json_and_arrays_are_complete(setup):
    model, X, y, F, R, V = setup
    rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], None, None, 0.5, solver="exact", device="cpu")
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["n_forget"] == 8 and d["n_retain"] == 72 and d["n_validation"] == 0
    assert d["predicted_gap_validation"] == {"n": 0} and d["predicted_gap_mean"]["validation"] is None
    for key in ("self_leverage_spectral_norm", "self_leverage_trace", "leakage_ratio", "predicted_gap_do_nothing"):
        assert isinstance(d[key], float)
    arrays = rep.arrays()
    assert {"self_leverage", "cross_leverage", "predicted_gap_forget", "predicted_gap_retain",
            "predicted_gap_validation", "self_leverage_matrix", "newton_step"} <= set(arrays)
    assert arrays["predicted_gap_validation"].shape == (0,)


@pytest.mark.parametrize("solver, kw, tol", [("cg", dict(cg_tol=1e-12, cg_iters=3000), 1e-6),
                                             ("projected", dict(proj_dim=100), 1e-7)])
def test_non_exact_solvers_agree_and_report_their_error(setup, solver, kw, tol):
    model, X, y, F, R, V = setup
    args = (model, X[F], y[F], X[R], y[R], X[V], y[V], 0.2)
    exact = compute_diagnostics(*args, solver="exact", device="cpu")
    rep = compute_diagnostics(*args, solver=solver, device="cpu", check_subset=4, **kw)
    assert rep.solver == solver
    rel = np.linalg.norm(rep.self_leverage - exact.self_leverage) / np.linalg.norm(exact.self_leverage)
    assert rel < tol
    np.testing.assert_allclose(rep.predicted_gap_forget, exact.predicted_gap_forget, rtol=1e-5)
    err = rep.approx_error
    assert err["reference"] == "exact" and err["subset_size"] == 4
    assert err["self_leverage_rel_err"] < tol and err["newton_step_rel_err"] < 1e-5


def test_projected_below_rank_reports_a_real_error(setup):
    model, X, y, F, R, V = setup
    rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], X[V], y[V], 0.2, solver="projected", proj_dim=12,
                              device="cpu", check_subset=8)
    exact = compute_diagnostics(model, X[F], y[F], X[R], y[R], X[V], y[V], 0.2, solver="exact", device="cpu")
    err = rep.approx_error
    true_rel = np.linalg.norm(rep.self_leverage - exact.self_leverage) / np.linalg.norm(exact.self_leverage)
    assert err["self_leverage_rel_err"] == pytest.approx(true_rel, rel=1e-6)  # subset = all 8 forget samples
    assert 1e-3 < err["self_leverage_rel_err"] < 1
    assert np.all(rep.self_leverage <= exact.self_leverage * (1 + 1e-9))


def test_weighted_leverage_ignores_the_common_logit_shift(setup):
    """Raw J G^-1 J^T blows up like 1/lam along the logit shift softmax ignores; the reported
    Lambda-weighted leverage does not (p = 43 < |R| (C-1) = 144, so G_R has no other null direction)."""
    model, X, y, F, R, V = setup
    lev = {}
    for lam in (1e-2, 1e-6):
        rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], None, None, lam, solver="exact", device="cpu")
        ref = brute(model, 0, X, y, F, R, V, lam)
        raw = torch.einsum("ncp,pq,ncq->n", ref["J"][F], torch.linalg.inv(ref["G_R"]), ref["J"][F])
        lev[lam] = (rep.self_leverage, raw.numpy())
    weighted_ratio = lev[1e-6][0] / lev[1e-2][0]
    raw_ratio = lev[1e-6][1] / lev[1e-2][1]
    assert np.all(weighted_ratio < 1.5)
    assert np.all(raw_ratio > 100)


def test_auto_solver_device_and_errors(setup):
    model, X, y, F, R, V = setup
    rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], lam=1.0)  # solver auto, device auto
    assert rep.solver == "exact"
    assert rep.device == ("cuda:0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="forget set is empty"):
        compute_diagnostics(model, X[:0], y[:0], X[R], y[R], lam=1.0, device="cpu")
    with pytest.raises(ValueError, match="member=2"):
        compute_diagnostics(model, X[F], y[F], X[R], y[R], lam=1.0, member=2, device="cpu")
    with pytest.raises(ValueError, match="labels"):
        compute_diagnostics(model, X[F], y[F] + 5, X[R], y[R], lam=1.0, device="cpu")
    with pytest.raises(ValueError, match="loss='hinge'"):
        compute_diagnostics(model, X[F], y[F], X[R], y[R], lam=1.0, device="cpu", loss="hinge")


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 1, 2, 3]) == pytest.approx(1.0)  # ties: average ranks
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_past_exact_max_params_the_check_runs_exact_on_a_row_subsample(setup):
    """No dense reference past exact_max_params (a matrix-free one cost over 40 min on a 9,098-parameter CNN):
    the check solves exactly on a row subsample instead (Woodbury in its row space). With every retain and
    forget row in the "subsample" it is the full problem, so its errors equal the dense reference's."""
    model, X, y, F, R, V = setup
    args = (model, X[F], y[F], X[R], y[R], X[V], y[V], 0.2)
    checked = compute_diagnostics(*args, solver="projected", proj_dim=12, device="cpu", check_subset=8)
    whole = compute_diagnostics(*args, solver="projected", proj_dim=12, device="cpu", check_subset=8,
                                exact_max_params=10, check_rows=72)  # every model is "large"
    sub = compute_diagnostics(*args, solver="projected", proj_dim=12, device="cpu", check_subset=8,
                              exact_max_params=10, check_rows=20)
    assert checked.approx_error["reference"] == "exact"
    err = whole.approx_error
    assert err["reference"] == "exact_subsample" and err["retain_rows"] == 72 and err["retain_weight"] == 1.0
    assert err["subset_size"] == 8
    assert err["self_leverage_rel_err"] == pytest.approx(checked.approx_error["self_leverage_rel_err"], rel=1e-6)
    assert err["newton_step_rel_err"] == pytest.approx(checked.approx_error["newton_step_rel_err"], rel=1e-6)
    assert sub.approx_error["retain_rows"] == 20 and sub.approx_error["retain_weight"] == pytest.approx(72 / 20)
    assert 1e-4 < sub.approx_error["self_leverage_rel_err"] < 1  # k = 12 < p = 43: a real, measured error
    np.testing.assert_allclose(whole.self_leverage, checked.self_leverage, rtol=1e-12)
