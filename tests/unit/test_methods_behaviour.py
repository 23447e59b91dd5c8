"""Behaviour of the presets on small problems (docs/design.md §4.3): ascent forgets, finetune keeps the retain
set, al_wpgd suppresses a class while protecting the adjacent classes."""

import functools

import pytest
import torch

from unlearning.methods import TrainRecipe, UnlearnContext, run_method
from unlearning.models import accuracy, build_model, flat_params, train_ensemble

RECIPE = TrainRecipe(epochs=30, batch_size=64, lr=1e-2)


@functools.lru_cache(maxsize=None)
def digits():
    """sklearn digits (train part), a 64-32-10 MLP ensemble of 2 trained 30 epochs, Adam lr 1e-2, batch 64."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:1200]
    X, y = X[perm], y[perm]
    model = build_model({"arch": "mlp", "in_dim": 64, "hidden": [32], "n_classes": 10}, [5, 6])
    train_ensemble(model, X, y, epochs=RECIPE.epochs, batch_size=RECIPE.batch_size, lr=RECIPE.lr)
    return model, X, y


def digits_ctx(forget: torch.Tensor, adjacent_classes=()) -> UnlearnContext:
    model, X, y = digits()
    adj = torch.isin(y[~forget], torch.tensor(list(adjacent_classes), dtype=torch.long))
    return UnlearnContext(model, X[forget], y[forget], X[~forget], y[~forget], adj, RECIPE, seed=0)


def random_forget_ctx() -> UnlearnContext:
    forget = torch.zeros(1200, dtype=torch.bool)
    forget[torch.randperm(1200, generator=torch.Generator().manual_seed(1))[:120]] = True
    return digits_ctx(forget)


def acc(model, X, y) -> float:
    return accuracy(model, X, y).mean().item()


def test_gradient_ascent_lowers_forget_accuracy():
    ctx = random_forget_ctx()
    before = acc(ctx.model, ctx.X_forget, ctx.y_forget)
    # 10 passes: the ascent itself forgets (the default, 3 passes, is tuned to stay near a retrain instead:
    # bench/equivalence.py)
    res = run_method("gradient_ascent", ctx, {"epochs": 10})
    after = acc(res.model, ctx.X_forget, ctx.y_forget)
    assert before > 0.97 and after < before - 0.05


def test_finetune_keeps_retain_accuracy():
    ctx = random_forget_ctx()
    before = acc(ctx.model, ctx.X_retain, ctx.y_retain)
    res = run_method("finetune", ctx, {})
    assert acc(res.model, ctx.X_retain, ctx.y_retain) >= before - 0.005


def test_noisy_finetune_keeps_retain_accuracy_and_adds_its_noise():
    # Langevin steps at the defaults: the noise must not cost the retain set (measured: bench/equivalence.py), and
    # it is what separates the method from plain SGD fine-tuning at the same steps
    ctx = random_forget_ctx()
    before = acc(ctx.model, ctx.X_retain, ctx.y_retain)
    res = run_method("noisy_finetune", ctx, {})
    assert acc(res.model, ctx.X_retain, ctx.y_retain) >= before - 0.01
    plain = run_method("noisy_finetune", ctx, {"sigma": 0.0})
    moved = (flat_params(res.model) - flat_params(plain.model)).std().item()
    assert moved > 0.3 * res.info["step_noise_std"] * res.cost.steps ** 0.5


def blobs(n_per: int = 40, d: int = 6):
    """5 Gaussian classes; class 1's centre sits 2.5 away from class 0's (entangled), the rest far."""
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(5, d, generator=g) * 4
    centers[1] = centers[0] + torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0) * 2.5
    y = torch.arange(5 * n_per) % 5
    return centers[y] + torch.randn(5 * n_per, d, generator=g), y


def test_al_wpgd_suppresses_a_class_and_keeps_adjacent_accuracy():
    # Accuracies are means over 4 members: single inits vary (measured remote drops 0.0-0.025 over 6 seeds).
    X, y = blobs()
    model = build_model({"arch": "mlp", "in_dim": 6, "hidden": [16], "n_classes": 5}, [1, 2, 3, 4])
    train_ensemble(model, X, y, epochs=30, batch_size=32, lr=1e-2)
    f = y == 0
    adj = y[~f] == 1
    ctx = UnlearnContext(model, X[f], y[f], X[~f], y[~f], adj, TrainRecipe(30, 32, 1e-2), seed=0)
    Xa, ya = ctx.X_adjacent, ctx.y_adjacent
    assert acc(model, ctx.X_forget, ctx.y_forget) > 0.8
    res = run_method("al_wpgd", ctx, {})
    assert acc(res.model, ctx.X_forget, ctx.y_forget) <= 0.1
    assert acc(res.model, Xa, ya) >= acc(model, Xa, ya) - 0.02
    assert acc(res.model, ctx.X_remote, ctx.y_remote) >= acc(model, ctx.X_remote, ctx.y_remote) - 0.02
    assert res.info["phases"][1]["steps"] > 0 and len(res.info["lambda"]) == 4


def test_al_wpgd_stage2_repairs_adjacent_classes_on_digits():
    """Digits: suppress class 8, adjacent = look-alike classes 1, 3, 9. Stage 1 alone costs adjacent
    accuracy; the W2-projected stage 2 gives it back without bringing class 8 back."""
    _, _, y = digits()
    ctx = digits_ctx(y == 8, adjacent_classes=(1, 3, 9))
    full = run_method("al_wpgd", ctx, {})
    stage1 = run_method("al_wpgd", ctx, {"stage2_steps": 0})
    Xa, ya = ctx.X_adjacent, ctx.y_adjacent
    assert acc(full.model, ctx.X_forget, ctx.y_forget) <= 0.05
    assert acc(full.model, Xa, ya) >= acc(ctx.model, Xa, ya) - 0.01
    assert acc(full.model, Xa, ya) > acc(stage1.model, Xa, ya) + 0.01  # stage 2 repairs
