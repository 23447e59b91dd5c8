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
import re
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path


class DvcFailed(RuntimeError):
    """A DVC operation failed: the message names it and DVC's reason."""


class DvcLockBusy(DvcFailed):
    """Another DVC process holds the repository lock (`dvc status` from a shell, a second batch): retry later."""


class _NoEmptyInboxWarning:
    """DVC warns "'requests/inbox' is empty." whenever it hashes the deletion stage's deps; the batch empties
    the inbox by design (docs/operations.md), so in this process that one warning is dropped."""

    @staticmethod
    def filter(record) -> bool:
        return not str(record.getMessage()).endswith("' is empty.")


class _NeverRunOutputWarning:
    """`dvc gc` warns "Output 'X'(stage: 'S') is missing version info. Cache for it will not be collected." for
    every output of a stage that never ran, such as the qualify stage under validation.mode per_batch: such an
    output has nothing in the cache to lose, so the warning is dropped while the output does not exist."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def filter(self, record) -> bool:
        m = re.match(r"Output '(.+?)'\(stage: .*\) is missing version info", str(record.getMessage()))
        return not (m and not (self.root / m.group(1)).exists())


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


def _lock_backup(root: Path) -> Path:
    return Path(root) / ".dvc" / "tmp" / "dvc.lock.before-commit"  # .dvc/tmp is git-ignored by DVC itself


def _restore_interrupted_lock(root: Path) -> None:
    """DVC rewrites dvc.lock in place: a commit killed while it wrote left the file empty (or cut), and every
    later DVC call failed on it ("dvc.lock validation failed"), so the erasure could never finish. The copy
    taken before that commit is put back; the commit then runs again on it (it records the current outputs)."""
    lock, backup = Path(root) / "dvc.lock", _lock_backup(root)
    if not backup.exists():
        return
    if lock.exists() and lock.stat().st_size and _parses(lock):
        backup.unlink()  # a commit that ended after writing the lock, before removing its copy
        return
    logging.getLogger(__name__).warning("%s was left empty or cut by an interrupted `dvc commit`: restored from the "
                                        "copy taken before it, and committed again", lock)
    backup.replace(lock)


def locked_stages(root: Path) -> dict:
    """dvc.lock's `stages` (name -> its deps and outs as DVC recorded them); {} when there is no dvc.lock or it
    does not parse (no stage recorded)."""
    import yaml

    try:
        data = yaml.safe_load((Path(root) / "dvc.lock").read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    stages = data.get("stages") if isinstance(data, dict) else None
    return stages if isinstance(stages, dict) else {}


def recorded_stages(root: Path, names: list[str]) -> list[str]:
    """The stages of `names` that dvc.lock records and whose outputs all exist: what `commit` can record again (a
    stage never run has nothing to re-commit, and `dvc commit` of a missing output fails)."""
    stages = locked_stages(root)
    return [name for name in names if name in stages
            and all((Path(root) / out["path"]).exists() for out in stages[name].get("outs", []))]


def _parses(lock: Path) -> bool:
    import yaml

    try:
        return isinstance(yaml.safe_load(lock.read_text()), dict)
    except (yaml.YAMLError, UnicodeDecodeError):
        return False


def commit(root: Path, stages: list[str]) -> list[str]:
    """`dvc commit -f STAGES`: record the stages' current outputs in dvc.lock and the cache. dvc.lock is copied
    first (temp file, then rename) and the copy removed after: `_restore_interrupted_lock` puts it back when a
    kill left the lock cut."""
    from unlearning.io import atomic_write_bytes

    _restore_interrupted_lock(root)
    lock = Path(root) / "dvc.lock"
    if lock.exists():
        _lock_backup(root).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(_lock_backup(root), lock.read_bytes())
    with _repo(root, f"commit {' '.join(stages)}") as repo:
        for stage in stages:
            repo.commit(f"{Path(root) / 'dvc.yaml'}:{stage}", force=True)
    _lock_backup(root).unlink(missing_ok=True)
    return list(stages)


def gc_workspace(root: Path, remote: str | None = None) -> None:
    """`dvc gc -w -f` (and with `remote`, `-c -r REMOTE`): drop every cached object the workspace does not use."""
    what = "gc -w" + (f" -c -r {remote}" if remote else "")
    _restore_interrupted_lock(root)  # gc reads dvc.lock to know what the workspace uses
    never_run = _NeverRunOutputWarning(root)
    logging.getLogger("dvc.output").addFilter(never_run)
    try:
        with _repo(root, what) as repo:
            repo.gc(workspace=True, force=True, cloud=bool(remote), remote=remote)
    finally:
        logging.getLogger("dvc.output").removeFilter(never_run)


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
