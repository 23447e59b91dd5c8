"""The last-layer mode (unlearning/leverage/head.py) against float64 references: its closed forms, its
Kronecker-formed GGN, the reduced head, and its agreement with the full GGN on a trained digits model."""

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from unlearning.leverage import StackedMemberFunction, compute_diagnostics, spearman
from unlearning.leverage.curvature import curvature_factor, make_targets
from unlearning.leverage.head import HeadFunction, HeadOf, LastLayerSolver
from unlearning.leverage.rows import RowSet
from unlearning.leverage.solvers import ExactSolver
from unlearning.models import build_model

SPEC = {"arch": "mlp", "in_dim": 6, "hidden": [7], "n_classes": 4, "image_shape": None}


@pytest.fixture(scope="module")
def tiny():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(50, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (50,), generator=g)
    model = build_model(SPEC, [11])
    full = StackedMemberFunction(model, 0, dtype=torch.float64, device="cpu")
    return X, y, full, HeadOf(full, X)


def test_head_function_matches_autograd_of_the_model_head(tiny):
    X, _, full, head = tiny
    H = head.features(X)
    hf = head.fn
    torch.testing.assert_close(hf.outputs(hf.theta0, H), full.outputs(full.theta0, X))
    J = jacobian(lambda t: hf.outputs(t, H), hf.theta0).permute(0, 1, 2)          # [n, C, p_h]
    torch.testing.assert_close(hf.jacobians(hf.theta0, H), J)
    V = torch.randn(hf.p, 3, dtype=torch.float64)
    torch.testing.assert_close(hf.jvp(hf.theta0, H, V), torch.einsum("ncp,pm->mnc", J, V))
    U = torch.randn(2, X.shape[0], 4, dtype=torch.float64)
    torch.testing.assert_close(hf.vjp(hf.theta0, H, U), torch.einsum("mnc,ncp->mp", U, J))
    left = curvature_factor(hf.outputs(hf.theta0, H), "ce")
    torch.testing.assert_close(hf.weighted_jacobians(hf.theta0, H, left), torch.bmm(left, J))


@pytest.mark.parametrize("work", [torch.float64, torch.float32])
def test_kronecker_ggn_equals_the_dense_sum_of_weighted_rows(tiny, work):
    X, y, _, head = tiny
    hf = head.fn
    H = head.features(X)
    t = make_targets(y, 4, "ce", torch.float64, "cpu")
    R, F = RowSet(hf, hf.theta0, H[10:], t[10:], "ce"), RowSet(hf, hf.theta0, H[:10], t[:10], "ce")
    dense = ExactSolver(0.3).fit([R, F], [F])
    kron = LastLayerSolver(0.3, work_dtype=work).fit([R, F], [F])
    tol = 1e-12 if work == torch.float64 else 1e-5
    torch.testing.assert_close(kron.G, dense.G, rtol=tol, atol=tol * float(dense.G.abs().max()))


def test_cross_norms_without_rows_equal_the_rows_times_handle(tiny):
    X, y, _, head = tiny
    hf = head.fn
    H = head.features(X)
    t = make_targets(y, 4, "ce", torch.float64, "cpu")
    R, F = RowSet(hf, hf.theta0, H[10:], t[10:], "ce"), RowSet(hf, hf.theta0, H[:10], t[:10], "ce")
    s = LastLayerSolver(0.3).fit([R, F], [F])
    A_F = F.all_weighted()[1].reshape(-1, hf.p)
    handle = s.leverage_handle(A_F)
    rows = torch.cat([C.reshape(sl.stop - sl.start, -1).norm(dim=1) for sl, C in s.cross_chunks(R, handle)])
    fast = torch.cat([n for _, n in s.cross_norms(R, handle)])  # m = 10 x 3 = 30 < C d1 = 32: the low-rank path
    # the handle four times over (m = 120 > 32: the narrow path through M = H H^T) has twice the norms
    narrow = torch.cat([n for _, n in s.cross_norms(R, torch.cat([handle] * 4, 1))]) / 2
    torch.testing.assert_close(fast, rows, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(narrow, rows, rtol=1e-10, atol=1e-12)


def test_reduced_head_keeps_the_outputs_and_projects_the_ggn(tiny):
    """With basis U the head's GGN is (I kron U)^T G (I kron U), and f is unchanged at theta_D."""
    X, y, full, _ = tiny
    head = HeadOf(full, X)
    plain = head.fn
    Hraw = head.raw_features(X)
    head.reduce(Hraw, 5)
    red = head.fn
    assert red.p == 4 * 5 and red.k == 5
    torch.testing.assert_close(red.outputs(red.theta0, red.inputs(Hraw)), full.outputs(full.theta0, X))
    t = make_targets(y, 4, "ce", torch.float64, "cpu")
    Gp = LastLayerSolver(0.0).fit([RowSet(plain, plain.theta0, Hraw, t, "ce")]).G
    Gr = LastLayerSolver(0.0).fit([RowSet(red, red.theta0, red.inputs(Hraw), t, "ce")]).G
    Pi = torch.kron(torch.eye(4, dtype=torch.float64), red.basis)                      # [C (d+1), C k]
    torch.testing.assert_close(Gr, Pi.T @ Gp @ Pi, rtol=1e-10, atol=1e-10)
    head.reduce(Hraw, 99)  # rank >= d + 1: nothing to reduce
    assert head.fn is red


def test_a_head_that_is_not_the_output_layer_is_refused():
    from torch import nn

    spec = {**SPEC, "feature_layer": "body.0"}  # the first Linear: more layers follow it
    model = build_model(spec, [1])
    full = StackedMemberFunction(model, 0, dtype=torch.float64, device="cpu")
    assert isinstance(dict(full.module._base.named_modules())["body.0"], nn.Linear)
    with pytest.raises(ValueError, match="feature_layer 'body.0' is not the model's output"):
        HeadOf(full, torch.randn(4, 6, dtype=torch.float64))


@pytest.fixture(scope="module")
def digits_model():
    from unlearning.data import load_dataset
    from unlearning.models import fit
    from unlearning.models.training import TrainRecipe

    ds = load_dataset("digits", seed=0, val_fraction=0.2)
    X = torch.as_tensor(np.asarray(ds.X), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(ds.label).astype(np.int64))
    rows = np.flatnonzero(np.asarray(ds.split) == "train")[:600]
    spec = {"arch": "mlp", "in_shape": [64], "n_classes": 10, "kwargs": {"hidden": [32]}}  # params.yaml's model
    model = build_model(spec, [3])
    fit(model, X[rows], y[rows], TrainRecipe(epochs=30, batch_size=64, lr=0.01, weight_decay=5e-4))
    F = np.random.default_rng(0).choice(rows, 40, replace=False)
    return model, X, y, F, np.setdiff1d(rows, F)


def test_last_layer_agrees_with_the_full_ggn_on_digits(digits_model):
    """The measurement behind `solver: auto` choosing the head past a size: on the default MLP (2,410
    parameters, head 330) trained on 600 digits, Spearman of the per-forget-row predicted gaps against the full
    GGN's (float64, exact) is >= 0.9 (0.91 measured), and the subsample check sees the same agreement."""
    model, X, y, F, R = digits_model
    args = (model, X[F], y[F], X[R], y[R], None, None, 1.0)
    full = compute_diagnostics(*args, solver="exact", device="cpu")
    head = compute_diagnostics(*args, solver="last_layer", device="cpu", check_subset=40, check_rows=200)
    assert head.solver == "last_layer" and head.n_params == 330 and head.solver_info["full_params"] == 2410
    rho = spearman(full.predicted_gap_forget, head.predicted_gap_forget)
    assert rho >= 0.9
    assert spearman(full.self_leverage, head.self_leverage) >= 0.95
    err = head.approx_error
    assert err["reference"] == "exact_subsample" and err["subset_size"] == 40 and err["retain_rows"] == 200
    assert abs(err["predicted_gap_spearman"] - rho) < 0.05
