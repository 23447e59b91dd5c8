"""The leverage machinery and `newton_ggn` on CUDA: same answers as the CPU float64 reference."""

import numpy as np
import pytest
import torch

import unlearning.methods.newton_ggn  # noqa: F401  (registers the preset)
from unlearning.leverage import compute_diagnostics
from unlearning.methods.base import TrainRecipe, UnlearnContext
from unlearning.methods.registry import run_method
from unlearning.models import build_model, flat_params

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MLP = {"arch": "mlp", "in_dim": 8, "hidden": [16], "n_classes": 4, "image_shape": None}   # p = 212
CNN = {"arch": "cnn", "in_dim": 36, "channels": [3], "n_classes": 4, "image_shape": [6, 6]}  # p = 142


def problem(spec, n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, spec["in_dim"], generator=g)
    y = ((X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()) % spec["n_classes"]
    model = build_model(spec, [1, 2])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model, X, y


@pytest.mark.parametrize("spec", [MLP, CNN])
def test_diagnostics_on_cuda_match_cpu_and_solvers_agree(spec):
    model, X, y = problem(spec)
    F, R, V = slice(0, 12), slice(12, 260), slice(260, 300)
    args = (X[F], y[F], X[R], y[R], X[V], y[V], 0.5)
    cpu = compute_diagnostics(model, *args, solver="exact", device="cpu")
    gpu_model = model.cuda()
    gpu = compute_diagnostics(gpu_model, *args, solver="exact", device="auto")
    assert gpu.device.startswith("cuda")
    np.testing.assert_allclose(gpu.self_leverage, cpu.self_leverage, rtol=1e-8)
    np.testing.assert_allclose(gpu.cross_leverage, cpu.cross_leverage, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(gpu.predicted_gap_validation, cpu.predicted_gap_validation, rtol=1e-7, atol=1e-12)
    assert gpu.leakage_ratio == pytest.approx(cpu.leakage_ratio, rel=1e-7)

    cg = compute_diagnostics(gpu_model, *args, solver="cg", cg_tol=1e-12, cg_iters=5000, device="cuda")
    rel = np.linalg.norm(cg.self_leverage - cpu.self_leverage) / np.linalg.norm(cpu.self_leverage)
    assert rel < 1e-6 and cg.approx_error["self_leverage_rel_err"] < 1e-6

    full = compute_diagnostics(gpu_model, *args, solver="projected", proj_dim=10_000, device="cuda")
    np.testing.assert_allclose(full.self_leverage, cpu.self_leverage, rtol=1e-6)
    low = compute_diagnostics(gpu_model, *args, solver="projected", proj_dim=cpu.n_params // 3, device="cuda",
                              check_subset=12)
    assert np.all(low.self_leverage <= cpu.self_leverage * (1 + 1e-9))
    assert low.approx_error["self_leverage_spearman"] > 0.5


def test_newton_ggn_lands_on_ridge_on_cuda():
    rng = np.random.default_rng(0)
    n, d, lam = 80, 5, 0.4
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + 1.0 + 0.2 * rng.normal(size=n)
    forget = np.arange(6)
    retain = np.arange(6, n)
    Xa = np.c_[X[retain], np.ones(len(retain))]
    theta_R = np.linalg.solve(Xa.T @ Xa + lam * np.eye(d + 1), Xa.T @ y[retain])
    model = build_model({"arch": "mlp", "in_dim": d, "hidden": [], "n_classes": 1, "image_shape": None},
                        [3, 4]).double().cuda()
    Xt, yt = torch.tensor(X, device="cuda"), torch.tensor(y, device="cuda")
    ctx = UnlearnContext(model=model, X_forget=Xt[forget], y_forget=yt[forget], X_retain=Xt[retain],
                         y_retain=yt[retain], adjacent_mask=torch.zeros(len(retain), dtype=torch.bool, device="cuda"),
                         recipe=TrainRecipe(1, 8, 0.1), loss="mse")
    for solver in ("exact", "cg"):
        # The retain gradient: one Newton step from any start lands on the retain ridge (quadratic objective).
        # The default (forget) gradient assumes the start is the full-data optimum, which this fresh init is not.
        res = run_method("newton_ggn", ctx, {"lam": lam, "solver": solver, "gradient": "retain"})
        assert next(res.model.parameters()).is_cuda
        np.testing.assert_allclose(flat_params(res.model).cpu().numpy(), np.stack([theta_R, theta_R]), atol=1e-8)


@pytest.mark.parametrize("spec", [MLP, CNN])
def test_last_layer_on_cuda_matches_cpu(spec):
    """The head's GGN (Kronecker-formed), its low-rank cross-leverage and the subsample check on CUDA give the
    CPU float64 numbers."""
    model, X, y = problem(spec)
    F, R, V = slice(0, 12), slice(12, 260), slice(260, 300)
    args = (X[F], y[F], X[R], y[R], X[V], y[V], 0.5)
    kw = dict(solver="last_layer", check_subset=8, check_rows=32, cross_sample=100)
    cpu = compute_diagnostics(model, *args, device="cpu", **kw)
    gpu = compute_diagnostics(model.cuda(), *args, device="cuda", **kw)
    assert gpu.device.startswith("cuda") and gpu.solver == "last_layer"
    np.testing.assert_allclose(gpu.self_leverage, cpu.self_leverage, rtol=1e-8)
    np.testing.assert_allclose(gpu.cross_leverage, cpu.cross_leverage, rtol=1e-7, atol=1e-12)
    np.testing.assert_array_equal(gpu.cross_leverage_rows, cpu.cross_leverage_rows)
    assert gpu.approx_error["predicted_gap_spearman"] == pytest.approx(cpu.approx_error["predicted_gap_spearman"])
