"""newton_finetune is newton_ggn's influence-removal step followed by finetune's phase (docs/design.md §4.1, §4.3):
with no fine-tune passes it is the Newton step exactly, with passes it is finetune run on the stepped model, and a
budget goes to the step first."""

import functools

import torch

from unlearning.methods import TrainRecipe, UnlearnContext, run_method
from unlearning.methods.newton_finetune import _with_model
from unlearning.models import build_model, flat_params, train_ensemble


@functools.lru_cache(maxsize=None)
def ctx() -> UnlearnContext:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3
    X = torch.randn(3, 5, generator=g)[y] * 2 + torch.randn(60, 5, generator=g)
    model = build_model({"arch": "mlp", "in_dim": 5, "hidden": [6], "n_classes": 3}, [1, 2])
    train_ensemble(model, X, y, epochs=5, batch_size=16, lr=1e-2)
    return UnlearnContext(model, X[:8], y[:8], X[8:], y[8:], torch.zeros(52, dtype=torch.bool),
                          TrainRecipe(5, 16, 1e-2, weight_decay=5e-4), seed=4)


def test_without_finetune_passes_it_is_the_newton_step():
    step = run_method("newton_ggn", ctx(), {"gradient": "forget"})
    ours = run_method("newton_finetune", ctx(), {"epochs": 0})
    assert torch.equal(flat_params(ours.model), flat_params(step.model))
    assert not torch.equal(flat_params(ours.model), flat_params(ctx().model))  # the step did move the model


def test_it_is_finetune_on_the_stepped_model():
    step = run_method("newton_ggn", ctx(), {"gradient": "forget"})
    tuned = run_method("finetune", _with_model(ctx(), step.model), {"epochs": 2, "lr": 1e-2})
    ours = run_method("newton_finetune", ctx(), {"epochs": 2, "lr": 1e-2})
    torch.testing.assert_close(flat_params(ours.model), flat_params(tuned.model), rtol=0, atol=0)
    assert ours.cost.gradient_evals == step.cost.gradient_evals + tuned.cost.gradient_evals
    assert ours.cost.steps == step.cost.steps + tuned.cost.steps


def test_a_budget_below_the_step_leaves_it_to_the_finetune():
    ours = run_method("newton_finetune", ctx(), {"epochs": 1, "max_grad_evals": 60})
    assert ours.info["newton"]["stop"] == "budget"
    assert 0 < ours.cost.gradient_evals <= 60 * 2  # one retain pass of 52 rows fits, the step does not
