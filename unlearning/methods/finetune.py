"""`finetune`: descend the retain loss only (docs/design.md §4.3 with w_F = 0); relies on catastrophic
forgetting of the forget set. Cheap, never harms the retain set, forgets slowly."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from unlearning.methods.args import DataSizes, IterativeArgs, phase_bound
from unlearning.methods.base import UnlearnContext, UnlearnResult
from unlearning.methods.engine import Phase, StopRule, Term, run_phases
from unlearning.methods.registry import register
from unlearning.methods.weighting import Weighting


class FinetuneArgs(IterativeArgs):
    # Defaults by bench/equivalence.py (docs/methods-equivalence.md): training on the retain rows moves every margin
    # away from a retrain's (the oracles stop where the original stopped), so the closest setting is the one that
    # moves least; plain SGD at 3e-3 for 2 epochs scored 1.02 x do_nothing's eps, Adam at 1e-3 for 5 epochs 1.32.
    epochs: int = Field(2, ge=0, description="passes over the retain set")
    lr: float = Field(3e-3, gt=0)
    optimizer: Literal["adam", "sgd"] = "sgd"

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        return self.capped(phase_bound(sizes.n_retain, self.batch_size, epochs=self.epochs))


@register("finetune", FinetuneArgs, "descend the retain loss only (w_F = 0)")
def run(ctx: UnlearnContext, args: FinetuneArgs) -> UnlearnResult:
    phase = Phase("finetune", retain=Term("retain", args.batch_size), primary="retain",
                  weighting=Weighting(forget_weight=0.0, retain_weight=1.0), optimizer=args.optimizer_spec(),
                  stop=StopRule(epochs=args.epochs))
    return run_phases(ctx, [phase], max_grad_evals=args.max_grad_evals, method="finetune")
