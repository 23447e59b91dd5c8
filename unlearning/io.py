"""All-or-nothing file writes: write to a temporary path beside the target, then rename.

A batch touches several files (model, manifest, ledger); `commit_dir` swaps a fully written staging
folder in place of the state folder, so a failure at any point leaves the previous state standing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


RESTORE_HINT = ("restore it with `dvc checkout` (the last state DVC recorded), or start over with `unlearn reset` "
                "(it archives state/ and cache/, the ledger included)")


class StateCorrupt(ValueError):
    """A pipeline file that cannot be read (truncated, edited by hand, half-copied): said in one line with the
    file and how to restore it (exit code 1: not the user's input, but no traceback either)."""


def read_json_file(path: str | Path) -> dict:
    """A JSON file the pipeline wrote (state/champion.json, an erasure report); StateCorrupt when unreadable."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateCorrupt(f"{path}: not valid JSON ({e}); {RESTORE_HINT}") from None


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint the pipeline wrote (models/original.pt, state/model.pt); StateCorrupt when unreadable."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StateCorrupt(f"{path}: not a readable checkpoint ({first}); {RESTORE_HINT}, or `dvc repro -f train` "
                           f"for models/original.pt") from None


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


# mkstemp and mkdtemp create 0600 files and 0700 folders: renamed into place, a report or the state folder
# would be readable by its owner alone, unlike every file the project writes plainly (0644 under umask 022).
UMASK = _umask()
FILE_MODE, DIR_MODE = 0o666 & ~UMASK, 0o777 & ~UMASK


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_save(path: str | Path, writer) -> None:
    """Call `writer(tmp_path)` (e.g. torch.save, df.to_csv) on a temp file, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    try:
        writer(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def staging_dir(target: str | Path) -> Path:
    """A fresh staging folder beside `target`, pre-filled with a copy of its current contents."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-"))
    stage.chmod(DIR_MODE)
    if target.exists():
        shutil.copytree(target, stage, dirs_exist_ok=True)
    return stage


def commit_dir(stage: str | Path, target: str | Path) -> None:
    """Swap `stage` in as `target`. Between the two renames `target` is briefly absent; `recover_dir`
    restores the previous folder if a crash happened exactly there."""
    stage, target = Path(stage), Path(target)
    previous = target.with_name(f".{target.name}.previous")
    if previous.exists():
        shutil.rmtree(previous)
    if target.exists():
        os.replace(target, previous)
    os.replace(stage, target)
    if previous.exists():
        shutil.rmtree(previous)


def recover_dir(target: str | Path) -> str | None:
    """Settle a `commit_dir` a kill interrupted, and drop abandoned staging folders; says what it did (None:
    nothing to settle). The caller holds the lock of whatever writes `target` (tasks.state.batch_lock), or
    knows nothing else runs: a running commit's staging folder is removed here.

    - killed between the two renames (`target` absent, `.target.previous` present): rolled back, the previous
      folder is put back. The staged folder was complete, but the commit point is the second rename: the
      interrupted batch is not applied, its request file is still in the inbox and runs again (its registered
      model version is tagged never-promoted by the next run's reconcile), and an interrupted erasure of the
      prepared store is still pending (the tombstones hold its ids);
    - killed after the second rename, before `.target.previous` was removed: completed (it is removed)."""
    target = Path(target)
    previous = target.with_name(f".{target.name}.previous")
    note = None
    if previous.exists() and not target.exists():
        os.replace(previous, target)
        note = (f"{target}: a swap interrupted between its two renames was rolled back ({previous.name} is "
                f"{target.name} again; the interrupted batch or erasure runs again)")
    elif previous.exists():
        shutil.rmtree(previous)
        note = f"{target}: a swap interrupted after its second rename was completed ({previous.name} removed)"
    for stale in target.parent.glob(f".{target.name}.staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return note


def state_lock_path(state_dir: str | Path) -> Path:
    """The file of a project's one lock (tasks.state.batch_lock): a batch, `unlearn erase` and `unlearn reset`
    hold it while they write the state folder or the prepared store."""
    state_dir = Path(state_dir)
    return state_dir.with_name(f".{state_dir.name}.lock")


def settle_interrupted_swaps(state_dir: str | Path, *others: str | Path) -> list[str]:
    """Every command's first step (flows.cli, before it reads anything): complete or roll back a swap of the
    state folder (and of `others`: the prepared store, which an erasure swaps the same way) that a kill left
    half done, so no command reads a missing state/champion.json (`recover_dir` says how). Under the project's
    lock, tried once: a batch that holds it now is writing, and settles any earlier swap itself when it
    starts (tasks.state.load_state). Returns what it did, one line each."""
    targets = [Path(state_dir), *map(Path, others)]
    if not any(t.with_name(f".{t.name}.previous").exists() for t in targets):
        return []  # the common case: nothing to settle, no lock file touched
    try:
        with exclusive_lock(state_lock_path(state_dir), timeout=0, say_waiting=False):
            return [note for t in targets if (note := recover_dir(t))]
    except LockTimeout:
        return []


def discard_dir(stage: str | Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)


class LockTimeout(TimeoutError):
    pass


class exclusive_lock:
    """A process-wide exclusive lock on a file (fcntl.flock): at most one batch per model at a time.

    Waiters poll every `poll` seconds until `timeout`; the lock dies with its process, so a crashed batch
    never leaves the pipeline locked."""

    def __init__(self, path: str | Path, timeout: float = 3600.0, poll: float = 0.5, say_waiting: bool = True):
        self.path, self.timeout, self.poll, self.say_waiting = Path(path), timeout, poll, say_waiting
        self._fd = None

    def __enter__(self):
        import fcntl
        import time

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        waiting = False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.ftruncate(self._fd, 0)
                os.write(self._fd, str(os.getpid()).encode())
                return self
            except BlockingIOError:
                if not waiting:
                    waiting = True
                    if self.say_waiting:  # off for a try that does not wait (timeout 0)
                        self._say_waiting()
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise LockTimeout(f"{self.path} is held by another batch for more than {self.timeout:.0f} s") from None
                time.sleep(self.poll)

    def _say_waiting(self) -> None:
        """One line on stderr when the lock is taken: a second run must not wait in silence (up to an hour)."""
        import sys

        try:
            holder = self.path.read_text().strip()
        except OSError:
            holder = ""
        who = f"process {holder}" if holder.isdigit() else "another process"
        print(f"waiting for {self.path}: {who} holds it (another batch of this model: `unlearn run`, `dvc repro` or a "
              f"deployment); up to {self.timeout:.0f} s (operations.lock_timeout_seconds)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        return False


FAULT_ENV = "UNLEARN_FAULT"


def fault(point: str) -> None:
    """Fault injection for tests: with UNLEARN_FAULT=<point> the process dies here (like kill -9), so a test
    can check that the next run converges. Never set outside tests."""
    if os.environ.get(FAULT_ENV) == point:
        os._exit(137)


def dangling_symlink_problem(path: str | Path) -> str:
    """What a symlink whose target does not exist is, and the fix (the inbox scan and `make run`'s intake)."""
    return (f"a dangling symlink (to {os.readlink(path)}, which does not exist); refused: remove the link, or put "
            f"the request file itself in the inbox")


def move_unique(src: str | Path, folder: str | Path) -> Path:
    """Move `src` (file, folder or link) into `folder`, never overwriting: name, name.2, name.3 ..."""
    src, folder = Path(src), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dest, n = folder / src.name, 1
    while dest.exists() or dest.is_symlink():
        n += 1
        dest = folder / f"{src.name}.{n}"
    os.replace(src, dest)
    return dest


def open_for_writing(path: str | Path) -> list[int]:
    """The ids of processes that hold `path` open for writing (Linux: read from /proc; elsewhere, and for
    processes this user may not inspect, none are seen). A request file still held open by its writer may be
    complete up to a half-written row: it must not be applied and moved yet."""
    proc = Path("/proc")
    try:
        target = os.path.realpath(path)
        pids = [p for p in os.listdir(proc) if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return []
    writers = []
    for pid in pids:
        try:
            for fd in os.listdir(proc / pid / "fd"):
                if os.readlink(proc / pid / "fd" / fd) != target:
                    continue
                flags = next(line for line in (proc / pid / "fdinfo" / fd).read_text().splitlines()
                             if line.startswith("flags:"))
                if int(flags.split()[1], 8) & (os.O_WRONLY | os.O_RDWR):
                    writers.append(int(pid))
                    break
        except (OSError, StopIteration, ValueError):  # the process ended, or is not ours to inspect
            continue
    return writers
