"""noisy_finetune (Langevin steps on the retain loss, docs/design.md §4.3): step by step against a float64 reference
written from the update rule theta <- theta - lr grad mean CE_R(theta) + sqrt(2 lr) sigma xi (not from the engine),
then the output perturbation; full batches, so every step is deterministic, and a linear softmax model, so the
reference computes logits by hand. The noise is drawn from the member's own stream (memberwise.member_generators),
in parameter order (W [C, D], then b [C])."""

import numpy as np
import torch
from torch.nn import functional as F

from unlearning.methods import TrainRecipe, UnlearnContext, run_method
from unlearning.methods.memberwise import member_generators
from unlearning.models import build_model, flat_params

N, D, C, SEED = 40, 4, 3, 11
LR, SIGMA, OUT, EPOCHS = 0.1, 0.05, 0.02, 6


def problem():
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.normal(size=(N, D)))
    y = torch.tensor(rng.integers(0, C, N))
    torch.manual_seed(0)
    model = build_model({"arch": "mlp", "in_dim": D, "hidden": [], "n_classes": C, "image_shape": None}, [5]).double()
    ctx = UnlearnContext(model, X[:6], y[:6], X[6:], y[6:], torch.zeros(N - 6, dtype=torch.bool),
                         TrainRecipe(1, 8, 0.01), seed=SEED)
    return ctx


def ce_mean(theta, X, y):
    W, b = theta[:C * D].view(C, D), theta[C * D:]
    return F.cross_entropy(X @ W.T + b, y)


def draw(g) -> torch.Tensor:
    return torch.cat([torch.randn((C, D), generator=g, dtype=torch.float64).flatten(),
                      torch.randn((C,), generator=g, dtype=torch.float64)])


def reference(ctx, output_noise: float) -> torch.Tensor:
    theta = flat_params(ctx.model)[0].clone()
    g = member_generators(SEED, ctx.model.seeds, "noisy_finetune", "langevin", "noise")[0]
    for _ in range(EPOCHS):  # one full batch per epoch
        t = theta.clone().requires_grad_(True)
        grad = torch.autograd.grad(ce_mean(t, ctx.X_retain, ctx.y_retain), t)[0]
        theta = theta - LR * grad + (2 * LR) ** 0.5 * SIGMA * draw(g)
    if output_noise:
        theta = theta + output_noise * draw(member_generators(SEED, ctx.model.seeds, "noisy_finetune", "output")[0])
    return theta


def run(ctx, output_noise: float, sigma: float = SIGMA):
    args = {"lr": LR, "sigma": sigma, "epochs": EPOCHS, "batch_size": N, "optimizer": "sgd",
            "output_noise": output_noise}
    return run_method("noisy_finetune", ctx, args)


def test_langevin_steps_match_the_float64_reference():
    ctx = problem()
    res = run(ctx, 0.0)
    torch.testing.assert_close(flat_params(res.model)[0], reference(ctx, 0.0), rtol=0, atol=1e-12)
    assert res.cost.steps == EPOCHS and res.cost.gradient_evals == EPOCHS * (N - 6)


def test_output_perturbation_matches_the_float64_reference():
    ctx = problem()
    torch.testing.assert_close(flat_params(run(ctx, OUT).model)[0], reference(ctx, OUT), rtol=0, atol=1e-12)


def test_sigma_zero_is_plain_sgd_finetuning():
    ctx = problem()
    plain = run_method("finetune", ctx, {"lr": LR, "epochs": EPOCHS, "batch_size": N, "optimizer": "sgd"})
    torch.testing.assert_close(flat_params(run(ctx, 0.0, sigma=0.0).model), flat_params(plain.model), rtol=0, atol=0)
    # and the noise is what separates them: sqrt(2 lr) sigma per step, EPOCHS steps, random-walk scale
    moved = (flat_params(run(ctx, 0.0).model) - flat_params(plain.model)).std().item()
    assert 0.3 * (2 * LR * EPOCHS) ** 0.5 * SIGMA < moved < 3 * (2 * LR * EPOCHS) ** 0.5 * SIGMA
