"""The leverage diagnostics and the Newton unlearner use the loss the model was trained on, label smoothing
included (docs/design.md §4.1: the geometry must match the recipe). At the minimiser theta_D of
sum_D CE_eps + lam/2 ||theta||^2, grad L_R(theta_D) = -grad L_F(theta_D), so the retain-gradient step and the
influence-removal step are the same step: with the smoothing ignored they are not, and the retain form
would also "finish training" towards the unsmoothed optimum. A softmax-linear model, float64, converged
by Newton's method on the exact objective."""

import numpy as np
import torch
from torch.nn import functional as F

import unlearning.methods.newton_ggn  # noqa: F401  (registers the preset)
from unlearning.leverage import compute_diagnostics
from unlearning.leverage.curvature import make_targets
from unlearning.methods.base import TrainRecipe, UnlearnContext
from unlearning.methods.registry import run_method
from unlearning.models import build_model, flat_params

N, D, C, EPS, LAM = 80, 3, 3, 0.2, 0.5
FORGET = np.arange(0, 6)


def converged_model():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    model = build_model({"arch": "mlp", "in_dim": D, "hidden": [], "n_classes": C, "image_shape": None}, [1]).double()

    def objective(theta):  # flat order of the ensemble: weight [C, D], then bias [C]
        logits = X @ theta[:C * D].view(C, D).T + theta[C * D:]
        return F.cross_entropy(logits, y, reduction="sum", label_smoothing=EPS) + LAM / 2 * theta.pow(2).sum()

    theta = torch.zeros(C * D + C, dtype=torch.float64)
    for _ in range(30):
        g_ = torch.autograd.functional.jacobian(objective, theta)
        H = torch.autograd.functional.hessian(objective, theta)
        theta = theta - torch.linalg.solve(H, g_)
    assert float(torch.autograd.functional.jacobian(objective, theta).abs().max()) < 1e-12
    with torch.no_grad():
        model.out__weight[:] = theta[:C * D].view(1, C, D)
        model.out__bias[:] = theta[C * D:].view(1, C)
    return model, X, y


def test_smoothed_targets_are_the_training_loss():
    y = torch.tensor([0, 2])
    t = make_targets(y, 3, "ce", torch.float64, "cpu", label_smoothing=0.3)
    assert torch.allclose(t, torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64))
    z = torch.randn(2, 3, dtype=torch.float64)
    assert torch.allclose(F.cross_entropy(z, t, reduction="none"),
                          F.cross_entropy(z, y, reduction="none", label_smoothing=0.3))
    assert torch.equal(make_targets(y, 3, "ce", torch.float64, "cpu"), y)  # no smoothing: class indices


def test_retain_and_removal_gaps_agree_at_a_smoothed_minimiser():
    model, X, y = converged_model()
    R = np.setdiff1d(np.arange(N), FORGET)
    rep = lambda eps: compute_diagnostics(model, X[FORGET], y[FORGET], X[R], y[R], X[R[:10]], y[R[:10]], LAM,  # noqa
                                          solver="exact", label_smoothing=eps)
    right, wrong = rep(EPS), rep(0.0)
    np.testing.assert_allclose(right.predicted_gap_forget, right.predicted_removal_gap_forget, rtol=1e-7)
    np.testing.assert_allclose(right.predicted_gap_retain, right.predicted_removal_gap_retain, rtol=1e-6, atol=1e-12)
    # ignoring the smoothing, the retain form also moves theta_D toward the unsmoothed optimum
    assert np.abs(wrong.predicted_gap_forget - wrong.predicted_removal_gap_forget).max() > 1e-2


def test_newton_forms_agree_with_the_recipes_smoothing():
    model, X, y = converged_model()
    R = np.setdiff1d(np.arange(N), FORGET)

    def step(eps, gradient):
        recipe = TrainRecipe(epochs=1, batch_size=8, lr=0.1, weight_decay=0.0, label_smoothing=eps)
        ctx = UnlearnContext(model=model, X_forget=X[FORGET], y_forget=y[FORGET], X_retain=X[R], y_retain=y[R],
                             adjacent_mask=torch.zeros(len(R), dtype=torch.bool), recipe=recipe, loss="ce")
        out = run_method("newton_ggn", ctx, {"lam": LAM, "solver": "exact", "gradient": gradient, "steps": 1})
        return flat_params(out.model)[0]

    theta0 = flat_params(model)[0]
    retain, forget = step(EPS, "retain"), step(EPS, "forget")
    assert float((retain - theta0).abs().max()) > 1e-2
    assert torch.allclose(retain, forget, rtol=0, atol=1e-9)
    assert float((step(0.0, "retain") - forget).abs().max()) > 1e-2  # the unsmoothed loss is another step
