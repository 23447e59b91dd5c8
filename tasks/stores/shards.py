"""The slice checkpoints of a sharded original (train.sharding; tasks/sharding.py, docs/sharding.md): the train
stage's `models/shards/` and the champion's `state/shards/`. A `sisa` batch rewrote every checkpoint trained on a
forgotten row into `state/shards/`; the erasure replaces `models/shards/` by it, as it replaces models/original.pt
by the champion. Verified: in both folders, no forgotten row in the plan, and every (shard, slice) checkpoint
trained on exactly its plan rows (a checkpoint from before a deletion fails)."""

from __future__ import annotations

from tasks.sharding import check_folder, original_shards, read_plan, replace_original_shards, state_shards
from tasks.stores.base import Scope, StoreBase, register_store
from unlearning.privacy.erasure import Finding, Purged


@register_store
class ShardCheckpoints(StoreBase):
    """models/shards/ and state/shards/: plan.json and one checkpoint per (shard, slice)."""

    name = "shard checkpoints"

    def purge(self, scope: Scope) -> list[Purged]:
        folder = original_shards(scope.settings.paths)
        # not sharded, or no sisa batch yet: nothing to replace
        if read_plan(state_shards(scope.settings.paths)) is None:
            return [Purged(self.name, str(folder), {"replaced": None})]
        if scope.dvc_locked:  # train's output, held by the running `dvc repro`
            return [Purged(self.name, str(folder), {"replaced": None}, pending="models/shards")]
        return [Purged(self.name, str(folder), {"replaced": replace_original_shards(scope.settings.paths)})]

    def verify(self, scope: Scope) -> list[Finding]:
        out = []
        for folder in (original_shards(scope.settings.paths), state_shards(scope.settings.paths)):
            found = read_plan(folder)
            if found is None:
                continue
            problems = tuple(check_folder(folder, scope.cache_hashes))
            out.append(Finding(self.name, str(folder), {"checkpoints": found[0].shards * found[0].slices,
                                                        "problems": len(problems)}, problems))
        return out
