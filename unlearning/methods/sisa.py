"""`sisa`: exact unlearning of a sharded original (unlearning/sharding.py, docs/sharding.md; Bourtoule et al.,
"Machine Unlearning", IEEE S&P 2021).

The original is the aggregate of S constituents trained on disjoint shards in R slices, with a checkpoint after
each slice. Each shard that held a forgotten row retrains from the checkpoint before the first slice that held
one, over the later slices without the forgotten rows; the other shards are untouched. The result IS the sharded
model trained from scratch on the retain rows with the same seeds and slice order (exact), at the cost of the
slices retrained: a fraction of a retrain (`info["cost_in_retrains"]`). The context's model must be an
`Aggregate` carrying its `shard_state` and the context must name the forget rows (`forget_ids`); a model trained
as one is refused with the fix."""

from __future__ import annotations

from unlearning.methods.args import DataSizes, MethodArgs
from unlearning.methods.base import MethodCost, UnlearnContext, UnlearnResult
from unlearning.methods.registry import register
from unlearning.progress import resolve
from unlearning.config import sharded_original_problem
from unlearning.sharding import NotSharded, cost_in_retrains, id_hash, unlearn_state


class SisaArgs(MethodArgs):
    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        if recipe_epochs is None:
            raise ValueError("sisa's budget needs the recipe's epochs")
        return recipe_epochs * sizes.n_retain  # at most every shard from its first slice: one retrain


@register("sisa", SisaArgs, "exact, sharded originals only (train.sharding): retrain the shards that held the rows, "
                            "from the checkpoint before their first slice")
def run(ctx: UnlearnContext, args: SisaArgs) -> UnlearnResult:
    st = getattr(ctx.model, "shard_state", None)
    problem = sharded_original_problem("sisa", st is not None, key="method")
    if problem:
        raise NotSharded(problem)
    if ctx.forget_ids is None:
        raise ValueError("method 'sisa' finds the forgotten rows by id: the context names none (forget_ids)")
    keys = [id_hash(i, st.salt) for i in ctx.forget_ids]
    drop = st.plan.positions(keys)
    from unlearning.sharding import affected

    fraction = cost_in_retrains(st.plan, affected(st.plan, drop))
    label = ctx.progress if isinstance(ctx.progress, str) else "sisa"
    model, report, first = unlearn_state(ctx.model, keys, ctx.recipe,
                                         progress=label if resolve(ctx.progress) else False)
    sizes = st.plan.sizes()
    info = {"stop": "exact", "shards": st.plan.shards, "slices": st.plan.slices,
            "shards_retrained": sorted(first), "first_slice": {str(k): r for k, r in first.items()},
            "slices_retrained": [[k, r] for k, r in report.trained], "cost_in_retrains": round(fraction, 6),
            "shard_rows_before": sizes, "shard_rows_after": model.shard_state.plan.sizes()}
    return UnlearnResult(model=model, cost=MethodCost(report.gradient_evals, 0, report.seconds), info=info)
