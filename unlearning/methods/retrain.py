"""`retrain`: exact unlearning and the oracle (DESIGN §4.3, §4.5).

A fresh ensemble with the SAME member seeds (same initialisation, same data-order streams) trained
from scratch on the retain set with the original training recipe. For loss "ce" it is
`train_ensemble` itself, so a retrain equals the oracles the validation trains; "mse" uses the same
loop (AdamW, per-member order streams) with the squared loss."""

from __future__ import annotations

import time

import torch
from pydantic import Field

from unlearning.methods.args import DataSizes, MethodArgs
from unlearning.methods.base import MethodCost, TrainRecipe, UnlearnContext, UnlearnResult
from unlearning.methods.losses import per_sample_loss
from unlearning.methods.registry import register
from unlearning.models.stacked import StackedModel, build_model
from unlearning.models.training import order_generator, train_ensemble


class RetrainArgs(MethodArgs):
    epochs: int | None = Field(None, ge=0, description="None = the training recipe's epochs")

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        epochs = self.epochs if self.epochs is not None else recipe_epochs
        if epochs is None:
            raise ValueError("retrain's budget needs the recipe's epochs")
        return epochs * sizes.n_retain


def train_mse(model: StackedModel, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe, epochs: int) -> int:
    """`train_ensemble`'s loop with the squared loss (0.5 ||z - t||^2 per sample, mean per member).
    Returns the optimizer steps taken."""
    n = X.shape[0]
    gens = [order_generator(s) for s in model.seeds]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps = 0
    model.train()
    for _ in range(epochs):
        perms = torch.stack([torch.randperm(n, generator=g) for g in gens]).to(X.device)  # [N, n]
        for i in range(0, n, recipe.batch_size):
            idx = perms[:, i : i + recipe.batch_size]
            loss = per_sample_loss(model(X[idx]), y[idx], "mse").mean(1).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
    model.eval()
    return steps


@register("retrain", RetrainArgs, "exact: fresh model, same member seeds, trained on the retain set (the oracle)")
def run(ctx: UnlearnContext, args: RetrainArgs) -> UnlearnResult:
    start = time.perf_counter()
    epochs = ctx.recipe.epochs if args.epochs is None else args.epochs
    device = next(ctx.model.parameters()).device
    model = build_model(ctx.model.spec(), ctx.model.seeds).to(device=device, dtype=next(ctx.model.parameters()).dtype)
    if ctx.loss == "ce":
        tc = train_ensemble(model, ctx.X_retain, ctx.y_retain, epochs=epochs, batch_size=ctx.recipe.batch_size,
                            lr=ctx.recipe.lr, weight_decay=ctx.recipe.weight_decay, progress=ctx.progress)
        steps = tc.steps
    elif ctx.loss == "mse":
        steps = train_mse(model, ctx.X_retain, ctx.y_retain, ctx.recipe, epochs)
    else:
        raise ValueError(f"loss={ctx.loss!r} is not known; allowed: ['ce', 'mse']")
    evals = epochs * ctx.X_retain.shape[0] * model.n_models
    return UnlearnResult(model=model, cost=MethodCost(evals, steps, time.perf_counter() - start),
                         info={"epochs": epochs, "stop": "epochs"})
