"""`newton_finetune`: one GGN-Newton influence-removal step (`newton_ggn` at gradient = forget, docs/design.md §4.1),
then a short fine-tune on the retain loss (`finetune`'s phase, w_F = 0, §4.3).

The Newton step removes the forget rows' first-order influence, theta + (G_R + lam I)^-1 grad L_F(theta) (Koh and
Liang 2017; Guo et al. 2020, "Certified Data Removal"); the fine-tune repairs what the linearization left on the
retain rows, as in Descent-to-Delete's "one step, then descend" (Neel et al. 2021). The cost is the Newton step's
(dominated by the GGN solve: measured at 13.6 retrains of the digits MLP for `newton_ggn`) plus the fine-tune's.
A budget (`max_grad_evals`, per member) is spent on the Newton step first; what it leaves goes to the fine-tune.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from unlearning.methods import finetune, newton_ggn
from unlearning.methods.args import DataSizes, MethodArgs, phase_bound
from unlearning.methods.base import UnlearnContext, UnlearnResult
from unlearning.methods.registry import register


class NewtonFinetuneArgs(MethodArgs):
    lam: float | None = Field(None, ge=0, description="the Newton step's L2 coefficient (newton_ggn's lam)")
    damping: float = Field(0.0, ge=0, description="the Newton step's Levenberg-Marquardt term")
    max_linearization_error: float | None = Field(1.0, gt=0, description="newton_ggn's trust test of the step")
    solver: Literal["auto", "exact", "cg"] = "auto"
    epochs: int = Field(1, ge=0, description="fine-tune passes over the retain set after the step")
    lr: float = Field(3e-3, gt=0, description="fine-tune learning rate")
    optimizer: Literal["adam", "sgd"] = "sgd"
    batch_size: int = Field(64, ge=1)
    max_grad_evals: int | None = Field(None, ge=0, description="per-member budget of per-sample gradient evals")

    def newton_args(self, max_grad_evals: int | None) -> newton_ggn.NewtonGGNArgs:
        return newton_ggn.NewtonGGNArgs(gradient="forget", lam=self.lam, damping=self.damping,
                                        max_linearization_error=self.max_linearization_error, solver=self.solver,
                                        max_grad_evals=max_grad_evals)

    def finetune_args(self, max_grad_evals: int | None) -> finetune.FinetuneArgs:
        return finetune.FinetuneArgs(epochs=self.epochs, lr=self.lr, optimizer=self.optimizer,
                                     batch_size=self.batch_size, max_grad_evals=max_grad_evals)

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        bound = self.newton_args(None).budget(sizes) + phase_bound(sizes.n_retain, self.batch_size, epochs=self.epochs)
        return bound if self.max_grad_evals is None else min(bound, self.max_grad_evals)


@register("newton_finetune", NewtonFinetuneArgs,
          "one GGN-Newton influence-removal step, then a short retain fine-tune (SGD)")
def run(ctx: UnlearnContext, args: NewtonFinetuneArgs) -> UnlearnResult:
    start = time.perf_counter()
    step = newton_ggn.run(ctx, args.newton_args(args.max_grad_evals))
    left = None
    if args.max_grad_evals is not None:
        # the step's worst-case bound, not its actual evals: the same for every member, so member k of an ensemble
        # gets the fine-tune budget a lone run of it gets
        spent = 0 if step.cost.steps == 0 else args.newton_args(None).step_bound(
            int(ctx.X_retain.shape[0]), int(ctx.model.n_classes), step.info["solver"], int(ctx.X_forget.shape[0]))
        left = max(args.max_grad_evals - spent, 0)
    tuned = finetune.run(_with_model(ctx, step.model), args.finetune_args(left))
    cost = tuned.cost
    cost.gradient_evals += step.cost.gradient_evals
    cost.steps += step.cost.steps
    cost.seconds = time.perf_counter() - start
    info = {"newton": step.info, "finetune": tuned.info}
    return UnlearnResult(model=tuned.model, cost=cost, info=info)


def _with_model(ctx: UnlearnContext, model) -> UnlearnContext:
    return UnlearnContext(model, ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain, ctx.adjacent_mask, ctx.recipe,
                          seed=ctx.seed, loss=ctx.loss, progress=ctx.progress, forget_ids=ctx.forget_ids)
