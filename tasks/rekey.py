"""The id key's migration and rotation across every store (docs/erasure.md, "Migrating from the salt", "Rotating
the key"), and where the key can be read from (`unlearn verify-erasure`).

unlearning/privacy/rekey.py re-keys the files; this module adds the stores the core cannot reach: a local MLflow store
(SQLite: its params, tags and descriptions), and the DVC cache and remote, which are content-addressed. There the
old salt's copies (state/salt, which every older state carried to `dvc push`) are deleted wherever they are, and,
with `erasure.dvc_gc`, the outputs are re-committed and garbage-collected (`dvc gc -w`, and `-c` on the remote), so
no object keeps an older form of the ledger either.

`ensure_current_key` runs first in every flow and every `unlearn` command (flows/common.py `use_project_path`,
flows/cli.py): it migrates an older project once, outside `dvc repro` (inside, DVC holds the outputs it would
rewrite: the stage stops with one line saying what to run). `python -m tasks.rekey` (`make setup`) does the same
and creates the key of a new project; `python -m tasks.rekey rotate` rotates it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unlearning.config import Erasure, Operations, Params, ProjectPaths, load_params
from unlearning.io import StateCorrupt
from unlearning.privacy.salt import KeyMigrationNeeded, key_exposure, migration_pending, project_salt, small_files

# Every flow and `unlearn` command imports this module (`ensure_current_key`): the stores, DVC and MLflow are
# imported inside the functions that use them, when a re-keying is due (importing tasks.stores imports torch).


def tracking_db(tracking_uri: str) -> Path | None:
    """The local MLflow store's SQLite file (None for a tracking server: its store is the server's own).
    `tracking_uri`: Params.mlflow_tracking_uri()."""
    from adapters.store_check import sqlite_file

    db = sqlite_file(tracking_uri)
    return db if db is not None and db.is_file() else None


def mlflow_preparer(tracking_uri: str):
    """unlearning/privacy/rekey.py's `extra` for the local MLflow store: its re-keyed copy, renamed at the commit."""
    def prepare(rekeying) -> list[tuple[str, str]]:
        db = tracking_db(tracking_uri)
        if db is None:
            return []
        from adapters.tracking import rekey_sqlite_store
        from unlearning.privacy import rekey as core

        tmp = core.temp_of(db)
        return [(str(tmp), str(db))] if rekey_sqlite_store(db, tmp, rekeying.text) else []

    return prepare


def shared_roots(paths: ProjectPaths, operations: Operations) -> list[Path]:
    """The places the team shares (the threat model's readers: docs/erasure.md): the project's written stores,
    the DVC cache and remote, MLflow's local store and artifacts, the archive."""
    from tasks.stores.traces import written_roots

    return written_roots(paths, operations)


def salt_copies(paths: ProjectPaths, operations: Operations, salt: str) -> list[Path]:
    """Every small file of the DVC cache and remote that holds the older version's salt (DVC objects of the
    state/salt every older state carried): the migration deletes them at its commit."""
    from tasks.stores.base import dvc_cache_dir, remote_folder

    roots = [r for r in (dvc_cache_dir(paths), remote_folder(paths, operations)) if r is not None and r.is_dir()]
    found = []
    for f in small_files(roots):
        try:
            if salt.encode() in f.read_bytes():
                found.append(f)
        except OSError:
            continue
    return found


def recommit(paths: ProjectPaths, erasure: Erasure, operations: Operations) -> dict:
    """The re-keyed outputs committed (`dvc status` stays clean), and with erasure.dvc_gc the cache and the
    remote garbage-collected: no object keeps an older form of the ledger."""
    from adapters import dvc_ops
    from tasks.stores.base import is_dvc_repo

    if not is_dvc_repo(paths):
        return {}
    stages = dvc_ops.recorded_stages(paths.root, ["prepare", "train", "deletion"])
    if not stages:  # a project that never ran its stages: DVC holds nothing the re-keying rewrote
        return {}
    if erasure.dvc_gc:
        from tasks.stores.dvc import dvc_gc

        return dvc_gc(paths, operations)
    from adapters.dvc_metrics import ensure_metrics

    ensure_metrics(paths)
    return {"committed": dvc_ops.commit(paths.root, stages)}


LOCK_TIMEOUT = 3600.0  # seconds a re-keying waits for a running batch (it holds the state's lock) to end


def migrate(paths: ProjectPaths, operations: Operations, erasure: Erasure, tracking_uri: str) -> dict | None:
    """The one-time migration of an older project (or the end of an interrupted re-keying), under the batch lock
    (no batch writes the ledger meanwhile); None when the key is current. Prints one line of what it did.
    `tracking_uri`: Params.mlflow_tracking_uri() (the local MLflow store is re-keyed too)."""
    from tasks.state import batch_lock
    from unlearning.privacy import rekey as core

    if not migration_pending(paths.path):
        return None
    with batch_lock(paths, LOCK_TIMEOUT):
        done = core.migrate(paths.path, extra=[mlflow_preparer(tracking_uri)],
                            extra_deletes=lambda salt: salt_copies(paths, operations, salt))
        if done is None:
            return None
        done["dvc"] = recommit(paths, erasure, operations)
    print(f"re-keyed the project's hashed ids with a new secret key in {done['key']} (HMAC-SHA256; an older "
          f"version's salt was backed up with the state): {len(done['rewritten'])} file(s) rewritten, "
          f"{len(done['deleted'])} removed (the ensemble cache, trained again when needed, and every copy of the "
          f"old salt: in state/ and in the DVC cache and remote) (docs/erasure.md, \"Migrating from the salt\")",
          file=sys.stderr)
    return done


def rotate(paths: ProjectPaths, operations: Operations, erasure: Erasure, tracking_uri: str) -> dict:
    """A new key layer for every stored id (docs/erasure.md, "Rotating the key"); the arguments as `migrate`'s."""
    from tasks.state import batch_lock
    from unlearning.privacy import rekey as core

    migrate(paths, operations, erasure, tracking_uri)
    with batch_lock(paths, LOCK_TIMEOUT):
        done = core.rotate(paths.path, extra=[mlflow_preparer(tracking_uri)])
        done["dvc"] = recommit(paths, erasure, operations)
    return done


# The whole params: every flow and `unlearn` command calls it first with them, and the key it checks is
# project_salt's (unlearning/privacy/salt.py, whole params by design).
def ensure_current_key(params: Params) -> None:
    """Before any id is compared: migrate an older project's salted ids (once). Inside `dvc repro` the outputs
    are DVC's: raises KeyMigrationNeeded (one line: what to run) instead."""
    if not params.deletion.hash_sample_ids and not params.path("salt").exists():
        return
    if not migration_pending(params.path):
        return
    from tasks.stores.base import in_dvc_stage

    if in_dvc_stage():
        project_salt(params)  # raises KeyMigrationNeeded with the line
        raise KeyMigrationNeeded("the project's id key must be migrated outside `dvc repro`")
    migrate(params.project_paths, params.operations, params.erasure, params.mlflow_tracking_uri())


def key_findings(paths: ProjectPaths, operations: Operations) -> list:
    """Where the id key can be read from, as `unlearn verify-erasure` checks (docs/erasure.md, "Threat model"):
    the variable or the key file (fine when only this user reads it), and any copy in a shared place (a
    problem). unlearning.privacy.erasure Findings."""
    from unlearning.privacy.erasure import Finding

    return [Finding("id key", place.where, {"readable_by": place.readers},
                    (f"id key: {place.problem}",) if place.problem else ())
            for place in key_exposure(paths.path, shared_roots(paths, operations))]


def main(argv: list[str] | None = None) -> int:
    """`python -m tasks.rekey [--params params.yaml] [ensure|rotate|exposure]`: `ensure` (default, `make setup`)
    migrates an older project's salt once and creates a new project's key; `rotate` rotates it; `exposure`
    prints where it can be read from."""
    a = argparse.ArgumentParser(description=main.__doc__)
    a.add_argument("command", nargs="?", default="ensure", choices=["ensure", "rotate", "exposure"])
    a.add_argument("--params", default="params.yaml")
    args = a.parse_args(argv)
    try:
        params = load_params(args.params)
        rekeying = (params.project_paths, params.operations, params.erasure, params.mlflow_tracking_uri())
        if args.command == "rotate":
            done = rotate(*rekeying)
            print(f"rotated the id key ({done['key']}): {len(done['rewritten'])} file(s) re-keyed; back up the new "
                  f"key now (docs/erasure.md, \"Rotating the key\")")
        elif args.command == "exposure":
            for f in key_findings(params.project_paths, params.operations):
                print(f"{f.where}: readable by {f.counts['readable_by']}" + "".join(f"\n  {p}" for p in f.problems))
        else:
            existed = params.path("salt").exists()
            migrate(*rekeying)
            project_salt(params)  # made with hashing off too: switching it on later finds it
            if not existed and params.path("salt").exists():
                print(f"created the project's secret id key {params.path('salt')} (mode 0600, git-ignored, never "
                      f"in DVC or MLflow; back it up in your secret store: docs/erasure.md)")
    except (StateCorrupt, ValueError) as e:  # ConfigError is a ValueError: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
