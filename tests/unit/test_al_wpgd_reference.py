"""al_wpgd step by step against a float64 reference written from docs/design.md §4.3 (not from the engine):
stage 1 is Adam on -L_F(clipped) + (lam, mu) augmented-Lagrangian terms of c = L_rem(theta) - L_rem(theta_0)
with the multiplier update lam <- max(0, lam + mu c) (the inequality form); stage 2 is SGD (with
heavy-ball momentum before the projection) on the adjacent loss, projected off span{grad[(1-a) L_F + a W2^2],
grad L_rem} by a 2 x 2 Gram solve. Full batches, so every step is deterministic; a linear softmax model,
so the reference computes logits by hand."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from unlearning.methods import TrainRecipe, UnlearnContext, run_method
from unlearning.models import build_model, flat_params

N, D, C = 60, 4, 3
CAP, MU, LR1, LR2, ALPHA, S1, S2 = 10.0, 10.0, 0.05, 0.05, 0.5, 6, 5


def problem():
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.normal(size=(N, D)))
    y = torch.tensor(rng.integers(0, C, N))
    adjacent = torch.zeros(N - 8, dtype=torch.bool)
    adjacent[:20] = True
    torch.manual_seed(0)
    model = build_model({"arch": "mlp", "in_dim": D, "hidden": [], "n_classes": C, "image_shape": None}, [5]).double()
    return X, y, adjacent, model


def ce(theta, X, y):
    W, b = theta[:C * D].view(C, D), theta[C * D:]
    return F.cross_entropy(X @ W.T + b, y, reduction="none")


def grad(f, theta):
    theta = theta.detach().clone().requires_grad_(True)
    return torch.autograd.grad(f(theta), theta)[0]


def reference(theta0, Xf, yf, Xrem, yrem, Xadj, yadj, momentum):
    # stage 1: Adam (torch's default betas and eps), the PHR weight max(0, lam + mu c) on grad c
    theta, m, v, lam, lams = theta0.clone(), torch.zeros_like(theta0), torch.zeros_like(theta0), 0.0, []
    base = ce(theta0, Xrem, yrem).mean()
    for t in range(1, S1 + 1):
        c = float(ce(theta, Xrem, yrem).mean() - base)
        w = max(0.0, lam + MU * c)
        g = grad(lambda z: -ce(z, Xf, yf).clamp(max=CAP).mean() + w * (ce(z, Xrem, yrem).mean() - base), theta)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        theta = theta - LR1 / (1 - 0.9 ** t) * m / (v.sqrt() / (1 - 0.999 ** t) ** 0.5 + 1e-8)
        lam = max(0.0, lam + MU * c)
        lams.append(lam)
    # stage 2: W2 is against the sorted clipped forget losses at the end of stage 1
    ref = ce(theta, Xf, yf).clamp(max=CAP).detach().sort().values
    buf = torch.zeros_like(theta)
    for _ in range(S2):
        buf = momentum * buf + grad(lambda z: ce(z, Xadj, yadj).mean(), theta)
        g1 = grad(lambda z: (1 - ALPHA) * ce(z, Xf, yf).clamp(max=CAP).mean()
                  + ALPHA * ((ce(z, Xf, yf).clamp(max=CAP).sort().values - ref) ** 2).mean(), theta)
        g2 = grad(lambda z: ce(z, Xrem, yrem).mean(), theta)
        V = torch.stack([g1, g2])  # [2, p]
        theta = theta - LR2 * (buf - V.T @ torch.linalg.solve(V @ V.T, V @ buf))
    return theta, lams


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_al_wpgd_matches_the_float64_reference(momentum):
    X, y, adjacent, model = problem()
    Xf, yf, Xr, yr = X[:8], y[:8], X[8:], y[8:]
    ctx = UnlearnContext(model=model, X_forget=Xf, y_forget=yf, X_retain=Xr, y_retain=yr, adjacent_mask=adjacent,
                         recipe=TrainRecipe(epochs=1, batch_size=8, lr=0.1, weight_decay=0.0), loss="ce")
    args = dict(stage1_steps=S1, stage1_lr=LR1, mu=MU, lam0=0.0, cap=CAP, forget_batch_size=1000,
                remote_batch_size=1000, stage2_steps=S2, stage2_lr=LR2, stage2_momentum=momentum, alpha=ALPHA,
                adjacent_batch_size=1000, projection_remote_batch_size=None)
    theta0 = flat_params(model).reshape(-1).clone()
    result = run_method("al_wpgd", ctx, args)
    expected, lams = reference(theta0, Xf, yf, Xr[~adjacent], yr[~adjacent], Xr[adjacent], yr[adjacent], momentum)
    got = flat_params(result.model).reshape(-1)
    assert float((got - theta0).abs().max()) > 1e-2  # the steps moved the model: the comparison means something
    assert torch.allclose(got, expected, rtol=0, atol=1e-12), float((got - expected).abs().max())
    assert result.info["lambda"] == pytest.approx([lams[-1]], abs=1e-12)
    assert torch.equal(flat_params(model).reshape(-1), theta0)  # the input model is untouched
