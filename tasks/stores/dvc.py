"""The DVC cache and its remote (docs/erasure.md): after the other stores rewrote their files, the stages'
outputs are re-committed and the cache (and the remote) garbage-collected, so no cache object holds a forgotten
row. Registered last: it commits what the others rewrote."""

from __future__ import annotations

from adapters import dvc_ops
from tasks.stores.base import (
    Scope, StoreBase, dvc_cache_dir, is_dvc_repo, raw_rows_finding, register_store, remote_folder,
)
from unlearning.config import Operations, ProjectPaths
from unlearning.privacy.erasure import Finding, Purged


def committed_stages(paths: ProjectPaths) -> list[str]:
    """The stages whose outputs or dependencies the erasure rewrote: prepare (the prepared store), train
    (models/original.pt, models/shards), deletion (state/), and qualify when it ran (dvc.lock has it) and its
    record holds no qualification (validation.mode per_batch: "skipped", a record of no model, which the new
    original leaves true). A qualification of the old original is left changed: `dvc repro` qualifies the new
    one, as a qualified batch requires (docs/certificate.md)."""
    import json

    stages = ["prepare", "train", "deletion"]
    ran = "qualify" in dvc_ops.locked_stages(paths.root)
    try:
        skipped = bool(json.loads((paths.path("models_dir") / "qualification.json").read_text()).get("skipped"))
    except (OSError, ValueError, AttributeError):
        return stages
    return stages + (["qualify"] if ran and skipped else [])


def dvc_gc(paths: ProjectPaths, operations: Operations) -> dict:
    """`dvc commit -f prepare train deletion [qualify]` (`committed_stages`), `dvc gc -w`; with a remote: push,
    then gc it too."""
    root = paths.root
    from adapters.dvc_metrics import ensure_metrics

    ensure_metrics(paths)  # the stages' declared metrics outputs must exist for `dvc commit`
    out = {"committed": dvc_ops.commit(root, committed_stages(paths)), "gc": "workspace"}
    dvc_ops.gc_workspace(root)
    configured = dvc_ops.remotes(root)
    if configured:
        from tasks.lineage import ensure_remote

        name = operations.dvc_remote
        if name not in configured:
            folder = remote_folder(paths, operations)
            name = ensure_remote(root, folder) if folder is not None else None
        if name:
            dvc_ops.push(root, name)
            dvc_ops.gc_workspace(root, remote=name)
            out["remote"] = name
    return out


@register_store
class DvcCache(StoreBase):
    """.dvc/cache and the remote (operations.dvc_remote): purged by commit + gc (erasure.dvc_gc, in a DVC repo
    only); inside `dvc repro` the repro holds the lock: pending for `unlearn erase`. Verified by searching their
    .npy objects for the forgotten rows' bytes."""

    name = "DVC cache"

    def purge(self, scope: Scope) -> list[Purged]:
        paths = scope.settings.paths
        if not (is_dvc_repo(paths) and scope.settings.erasure.dvc_gc):
            return []
        if scope.dvc_locked:
            return [Purged(self.name, str(dvc_cache_dir(paths)), pending="the DVC cache")]
        return [Purged(self.name, str(dvc_cache_dir(paths)), dvc_gc(paths, scope.settings.operations))]

    def verify(self, scope: Scope) -> list[Finding]:
        return raw_rows_finding(self.name, dvc_cache_dir(scope.settings.paths), scope) + \
            raw_rows_finding("DVC remote", remote_folder(scope.settings.paths, scope.settings.operations), scope)
