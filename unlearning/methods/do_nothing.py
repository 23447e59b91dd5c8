"""`do_nothing`: return an unchanged copy of the original (docs/design.md §4.3, §4.5).

The right choice when the predicted output gap is below the oracle noise floor: the original is then
already indistinguishable from a retrain within what the validation can measure."""

from __future__ import annotations

import time

from unlearning.methods.args import DataSizes, MethodArgs
from unlearning.methods.base import MethodCost, UnlearnContext, UnlearnResult
from unlearning.methods.registry import register
from unlearning.models.training import clone_model


class DoNothingArgs(MethodArgs):
    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        return 0


@register("do_nothing", DoNothingArgs, "copy of the original, no update (baseline; gap below noise floor)")
def run(ctx: UnlearnContext, args: DoNothingArgs) -> UnlearnResult:
    start = time.perf_counter()
    model = clone_model(ctx.model)
    return UnlearnResult(model=model, cost=MethodCost(0, 0, time.perf_counter() - start), info={"stop": "no-op"})
