"""DVC lineage after a deployment run: commit the new state to the DVC cache, push when a remote is set.

`dvc repro` does this itself; a Prefect deployment run does not, so it ends here: `dvc status` is clean
afterwards and every model/manifest/ledger version stays recoverable from the cache (and the remote)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from adapters import dvc_ops
from adapters.clock import computes
from tasks.retry import transient_io_or_dvc_lock

from unlearning.config import Operations, ProjectPaths


@task(name="dvc-commit", retries=2, retry_delay_seconds=[2, 5], retry_condition_fn=transient_io_or_dvc_lock)
@computes
def commit_lineage(paths: ProjectPaths, operations: Operations) -> dict:
    root = paths.root
    if not (root / ".dvc").is_dir():
        return {"committed": False, "reason": f"{root} is not a DVC project"}
    from adapters.dvc_metrics import ensure_metrics

    ensure_metrics(paths)  # the stage's declared metrics outputs must exist for `dvc commit`
    dvc_ops.commit(root, ["deletion"])
    pushed = None
    remote = operations.dvc_remote
    if remote:
        configured = dvc_ops.remotes(root)
        if remote not in configured:  # not a remote name: a folder, relative to the project
            folder = Path(remote) if Path(remote).is_absolute() else root / remote
            folder.mkdir(parents=True, exist_ok=True)
            remote = ensure_remote(root, folder)
        dvc_ops.push(root, remote)
        pushed = remote
    return {"committed": True, "pushed": pushed}


def ensure_remote(root: Path, folder: Path) -> str:
    """Register a local-folder remote (in .dvc/config.local, never committed) and return its name."""
    return dvc_ops.add_local_remote(root, "pipeline-local", folder)
