"""`finetune`: descend the retain loss only (docs/design.md §4.3 with w_F = 0); relies on catastrophic
forgetting of the forget set. Cheap, never harms the retain set, forgets slowly."""

from __future__ import annotations

from unlearning.methods.args import DataSizes, IterativeArgs, phase_bound
from unlearning.methods.base import UnlearnContext, UnlearnResult
from unlearning.methods.engine import Phase, StopRule, Term, run_phases
from unlearning.methods.registry import register
from unlearning.methods.weighting import Weighting


class FinetuneArgs(IterativeArgs):
    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        return self.capped(phase_bound(sizes.n_retain, self.batch_size, epochs=self.epochs))


@register("finetune", FinetuneArgs, "descend the retain loss only (w_F = 0)")
def run(ctx: UnlearnContext, args: FinetuneArgs) -> UnlearnResult:
    phase = Phase("finetune", retain=Term("retain", args.batch_size), primary="retain",
                  weighting=Weighting(forget_weight=0.0, retain_weight=1.0), optimizer=args.optimizer_spec(),
                  stop=StopRule(epochs=args.epochs))
    return run_phases(ctx, [phase], max_grad_evals=args.max_grad_evals, method="finetune")
