"""`noisy_finetune`: Langevin steps on the retain loss from the original's weights (docs/design.md §4.3 with
w_F = 0 and Gaussian weight noise), so the result behaves like a draw from the retrain distribution rather than a
model pushed to "forget hard".

Every step, per member, theta <- theta - lr * grad L_R(theta) + sqrt(2 lr) * sigma * xi, xi ~ N(0, I): the noisy
gradient descent of "Langevin Unlearning" (Chien, Wang, Li 2024), whose iterates from the original converge to
the same stationary law as iterates from scratch on the retain set, so a few steps close part of the gap to a
retrain and the noise hides the rest. After the last step an optional output perturbation N(0, output_noise^2)
per weight ("Descent-to-Delete", Neel, Roth, Sharifi-Malvajerdi 2021: fine-tune on the retain set, then publish
a noised copy). The noise comes from per-member generators (unlearning/methods/noise.py), so member k of an
ensemble equals a lone run of member k. Plain SGD by default (the Langevin step is defined for it); with Adam
the noise is added after Adam's step at the same scale.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from unlearning.methods.args import DataSizes, IterativeArgs, phase_bound
from unlearning.methods.base import UnlearnContext, UnlearnResult
from unlearning.methods.engine import Phase, StopRule, Term, run_phases
from unlearning.methods.memberwise import member_generators
from unlearning.methods.noise import add_member_noise
from unlearning.methods.registry import register
from unlearning.methods.weighting import Weighting


class NoisyFinetuneArgs(IterativeArgs):
    epochs: int = Field(2, ge=0, description="passes over the retain set")
    lr: float = Field(1e-2, gt=0)
    optimizer: Literal["adam", "sgd"] = "sgd"
    # sigma 0.1 by bench/equivalence.py (0.003-0.03 barely moved the model; docs/methods-equivalence.md)
    sigma: float = Field(1e-1, ge=0, description="Langevin noise: each step adds N(0, 2 lr sigma^2) per weight")
    output_noise: float = Field(0.0, ge=0, description="sd of the Gaussian added to every weight after the last "
                                                       "step (Descent-to-Delete's output perturbation)")

    def step_noise_std(self) -> float:
        return math.sqrt(2.0 * self.lr) * self.sigma

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        return self.capped(phase_bound(sizes.n_retain, self.batch_size, epochs=self.epochs))


@register("noisy_finetune", NoisyFinetuneArgs,
          "Langevin steps on the retain loss (SGD + Gaussian weight noise), optional output noise")
def run(ctx: UnlearnContext, args: NoisyFinetuneArgs) -> UnlearnResult:
    phase = Phase("langevin", retain=Term("retain", args.batch_size), primary="retain",
                  weighting=Weighting(forget_weight=0.0, retain_weight=1.0), optimizer=args.optimizer_spec(),
                  stop=StopRule(epochs=args.epochs), noise_std=args.step_noise_std())
    result = run_phases(ctx, [phase], max_grad_evals=args.max_grad_evals, method="noisy_finetune")
    if args.output_noise > 0:
        gens = member_generators(ctx.seed, result.model.seeds, "noisy_finetune", "output")
        add_member_noise(result.model, gens, args.output_noise, torch.ones(result.model.n_models, dtype=torch.bool))
    result.info["step_noise_std"] = args.step_noise_std()
    return result
