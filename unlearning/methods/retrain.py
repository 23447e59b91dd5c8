"""`retrain`: exact unlearning and the oracle (docs/design.md §4.3, §4.5).

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
from unlearning.models import Ensemble, fit
from unlearning.models.training import batch_bounds, has_batchnorm, make_optimizer, order_generator
from unlearning.progress import resolve


class RetrainArgs(MethodArgs):
    epochs: int | None = Field(None, ge=0, description="None = the training recipe's epochs")

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        epochs = self.epochs if self.epochs is not None else recipe_epochs
        if epochs is None:
            raise ValueError("retrain's budget needs the recipe's epochs")
        return epochs * sizes.n_retain


def train_mse(model: Ensemble, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe, epochs: int) -> int:
    """`train_ensemble`'s loop with the squared loss (0.5 ||z - t||^2 per sample, mean per member).
    Returns the optimizer steps taken."""
    n = X.shape[0]
    gens = [order_generator(s) for s in model.seeds]
    opt = make_optimizer(model.parameters(), recipe, fused_ok=False)
    steps = 0
    model.train()
    for _ in range(epochs):
        perms = torch.stack([torch.randperm(n, generator=g) for g in gens]).to(X.device)  # [N, n]
        for lo, hi in batch_bounds(n, recipe.batch_size, merge_single=has_batchnorm(model)):
            idx = perms[:, lo:hi]
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
    model = ctx.model.fresh()  # same architecture and member seeds, newly initialised
    if ctx.loss == "ce":
        label = ctx.progress if isinstance(ctx.progress, str) else f"retrain x{model.n_models}"
        steps = fit(model, ctx.X_retain, ctx.y_retain, ctx.recipe, epochs=epochs,
                    progress=label if resolve(ctx.progress) else False).steps
    elif ctx.loss == "mse":
        steps = train_mse(model, ctx.X_retain, ctx.y_retain, ctx.recipe, epochs)
    else:
        raise ValueError(f"loss={ctx.loss!r} is not known; allowed: ['ce', 'mse']")
    evals = epochs * ctx.X_retain.shape[0] * model.n_models
    return UnlearnResult(model=model, cost=MethodCost(evals, steps, time.perf_counter() - start),
                         info={"epochs": epochs, "stop": "epochs"})
