"""The DVC operations the pipeline runs itself (commit, gc, push, remotes), in this process.

Through DVC's Python API (`dvc.repo.Repo`) rather than `python -m dvc` subprocesses: each of those spent
1-1.5 s starting and importing DVC, and `unlearn erase` ran three to five of them. The calls are the ones
the CLI makes for `dvc commit -f T...`, `dvc gc -w -f [-c -r R]`, `dvc push -r R`, `dvc remote list` and
`dvc remote add --local -f N URL`. Stage targets are given as `<root>/dvc.yaml:<stage>`, so nothing here
depends on the working directory (Prefect runs tasks in threads: no `chdir`).

Errors: DVC's repository lock held by another DVC process raises `DvcLockBusy` (transient: the tasks that
commit retry it, tasks/retry.py); any other DVC error raises `DvcFailed` naming the operation.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path


class DvcFailed(RuntimeError):
    """A DVC operation failed: the message names it and DVC's reason."""


class DvcLockBusy(DvcFailed):
    """Another DVC process holds the repository lock (`dvc status` from a shell, a second batch): retry later."""


class _NoEmptyInboxWarning:
    """DVC warns "'requests/inbox' is empty." whenever it hashes the deletion stage's deps; the batch empties
    the inbox by design (README, "Operate it"), so in this process that one warning is dropped."""

    @staticmethod
    def filter(record) -> bool:
        return not str(record.getMessage()).endswith("' is empty.")


@contextmanager
def _repo(root: Path, what: str):
    from dvc.exceptions import DvcException
    from dvc.lock import LockError
    from dvc.repo import Repo

    logger = logging.getLogger("dvc.output")
    if not any(isinstance(f, _NoEmptyInboxWarning) for f in logger.filters):
        logger.addFilter(_NoEmptyInboxWarning())
    # DVC's messages ("Updating lock file 'dvc.lock'", "Removed 13 objects from repo cache.") go to stdout, by
    # its console handlers (dvc.logger.setup, streams taken when they were made) and by dvc.ui; here they are
    # diagnostics, and `unlearn run`'s stdout is its JSON lines (`unlearn run | jq`)
    dvc_logger = logging.getLogger("dvc")
    own = [h for h in dvc_logger.handlers if type(h).__module__.startswith("dvc")]  # dvc.logger.LoggerHandler
    for handler in own:
        if isinstance(handler, logging.StreamHandler) and handler.stream is not sys.stderr:
            handler.stream = sys.stderr  # not setStream: it flushes the old stream, which may be closed
    # DVC prints its lines itself: passed on to the root logger (Prefect's console handler) each came twice
    propagate, dvc_logger.propagate = dvc_logger.propagate, dvc_logger.propagate and not own
    try:
        with redirect_stdout(sys.stderr), Repo(str(root)) as repo:
            yield repo
    except LockError as e:
        raise DvcLockBusy(f"dvc {what} in {root}: the repository is locked by another DVC process ({e})") from e
    except DvcException as e:
        raise DvcFailed(f"dvc {what} in {root} failed: {e}") from e
    finally:
        dvc_logger.propagate = propagate


def commit(root: Path, stages: list[str]) -> list[str]:
    """`dvc commit -f STAGES`: record the stages' current outputs in dvc.lock and the cache."""
    with _repo(root, f"commit {' '.join(stages)}") as repo:
        for stage in stages:
            repo.commit(f"{Path(root) / 'dvc.yaml'}:{stage}", force=True)
    return list(stages)


def gc_workspace(root: Path, remote: str | None = None) -> None:
    """`dvc gc -w -f` (and with `remote`, `-c -r REMOTE`): drop every cached object the workspace does not use."""
    what = "gc -w" + (f" -c -r {remote}" if remote else "")
    with _repo(root, what) as repo:
        repo.gc(workspace=True, force=True, cloud=bool(remote), remote=remote)


def remotes(root: Path) -> set[str]:
    """`dvc remote list`: the names of the configured remotes (every config level)."""
    with _repo(root, "remote list") as repo:
        return set(repo.config.get("remote", {}))


def push(root: Path, remote: str) -> None:
    """`dvc push -r REMOTE`."""
    with _repo(root, f"push -r {remote}") as repo:
        repo.push(remote=remote)


def add_local_remote(root: Path, name: str, folder: Path) -> str:
    """`dvc remote add --local -f NAME FOLDER` (.dvc/config.local, never committed); returns NAME."""
    with _repo(root, f"remote add --local {name}") as repo:
        with repo.config.edit("local") as conf:
            conf.setdefault("remote", {})[name] = {"url": str(folder)}
    return name
