"""The operations around a deletion batch (docs/operations.md): the checks before anything changes
(`preflight`), the registry brought back in line with state/ (`reconcile`), and an applied request file moved
to requests/processed/ with its ids keyed (`processed`). flows/deletion_batch.py calls them around the batches;
`unlearn erase` and `unlearn reset` reconcile too."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tasks.reporting import run_logger
from tasks.state import StateSettings, stale_unbatched_state
from tasks.stores.base import ErasureSettings
from unlearning.config import Deletion, Erasure, Params, ProjectPaths
from unlearning.io import atomic_write_bytes, move_unique, read_json_file
from unlearning.requests import file_sha256


@dataclass(frozen=True)
class RequestFileSettings:
    """What the kept request files' handling reads of the params (`processed`, `redact_erased_ids`, the expiry):
    where they are (base.paths processed, rejected, tombstones), how long an applied file keeps its plain ids
    (erasure.keep_request_files), whether ids are hashed (deletion.hash_sample_ids), and the id key, read only
    when an id is keyed (tasks/id_key.py IdKey.salt makes the key of a project that has none)."""

    paths: ProjectPaths
    erasure: Erasure
    deletion: Deletion
    salt: Callable[[], str]  # the project's id key (IdKey.salt), read (or made) on each call

    # Builds the slice record from the whole params, its one job.
    @classmethod
    def of(cls, params: Params) -> "RequestFileSettings":
        return cls.of_erasure(ErasureSettings.of(params))

    @classmethod
    def of_erasure(cls, settings: ErasureSettings) -> "RequestFileSettings":
        """The part of the erasure's record the request files' handling reads (the one construction)."""
        return cls(settings.paths, settings.erasure, settings.deletion, settings.key.salt)


def reconcile_if_started(settings: ErasureSettings, state: StateSettings, resume: bool = True) -> list[str]:
    """Reconcile the registry with state/ once anything exists to reconcile (a first run has nothing)."""
    if ((settings.paths.path("state_dir") / "champion.json").exists() or settings.paths.path("mlflow_db").exists()
            or os.environ.get("MLFLOW_TRACKING_URI")):
        return reconcile(settings, settings.tracker(), state, resume)
    return []


def resume_erasure(settings: ErasureSettings) -> list[str]:
    """Every entry point's first step, under the batch lock (the deletion flow: `unlearn run`, the DVC stage, the
    deployments; `unlearn erase`): an erase a kill stopped between two stores is finished where its journal says
    (unlearning/privacy/erasure_journal.py), before the state is read. Returns what it did, one line each."""
    from unlearning.privacy.erasure_journal import has_unfinished

    if not has_unfinished(settings.paths.path("state_dir")):
        return []
    champion_file = settings.paths.path("state_dir") / "champion.json"
    version = read_json_file(champion_file).get("model_version") if champion_file.exists() else None
    return _resume(settings, settings.tracker(), version)


def _resume(settings: ErasureSettings, tracker, version) -> list[str]:
    from tasks.erasure import resume_unfinished

    reports = resume_unfinished(settings, tracker, version)
    finished = [r for r in reports if not r["pending"]]
    # an erase `dvc repro` deferred on purpose (DVC held its stores) is not one a kill stopped
    done = [r["batch_id"] for r in finished if not r["deferred"]]
    caught_up = [r["batch_id"] for r in finished if r["deferred"]]
    waiting = [r["batch_id"] for r in reports if r["pending"]]
    return ([f"finished {len(caught_up)} pending erasure(s) that `dvc repro` left for `unlearn erase`"]
            if caught_up else []) + \
        ([f"finished the erase of batch(es) {done} that a kill had stopped (its journal said which stores were "
          f"done)"] if done else []) + \
        ([f"took up the erase of batch(es) {waiting}; inside `dvc repro` what DVC holds stays pending for "
          f"`unlearn erase`"] if waiting else [])


def processed(path: Path, settings: RequestFileSettings) -> Path:
    """Move an applied (or already applied) inbox file to requests/processed/. With deletion.hash_sample_ids
    its sample ids are written in their keyed form (the ledger's), so no forgotten id stays there in plain text;
    under erasure.keep_request_files = N days it keeps them N days from now (its mtime), then a run rewrites it
    (tasks/stores/requests.py expire_request_files)."""
    dest_dir = settings.paths.path("processed")
    keep_days = settings.erasure.request_file_days()
    keyed = _keyed_request_bytes(path, settings) if settings.deletion.hash_sample_ids and not keep_days else None
    same = dest_dir / path.name
    if same.is_file() and not path.is_symlink() and file_sha256(same) == (
            hashlib.sha256(keyed).hexdigest() if keyed is not None else file_sha256(path)):
        path.unlink()  # the same file was processed before: keep one copy
        return same
    dest = move_unique(path, dest_dir)
    if keyed is not None:
        atomic_write_bytes(dest, keyed)
    elif keep_days:
        os.utime(dest)  # applied now: its plain ids are kept keep_request_files days from this time
    return dest


def _expire_request_files(settings: RequestFileSettings) -> list[str]:
    from tasks.stores.requests import expire_request_files
    from unlearning.privacy.erasure import id_key

    if not settings.deletion.hash_sample_ids or not settings.erasure.request_file_days():
        return []
    return expire_request_files(settings.paths, settings.deletion, settings.erasure,
                                id_key(True, settings.salt()))


def redact_erased_ids(settings: RequestFileSettings, files: list[Path] | None = None) -> list[str]:
    """The rejected request files (or `files`: one just rejected) that name an erased id in plain text, rewritten
    with its hashed form (deletion.hash_sample_ids). Run at every rejection, every run and `unlearn erase`: a
    rejected file naming ids that an earlier or a later batch erased never waits for a batch's erasure to be
    rewritten (`unlearn verify-erasure` fails on it meanwhile). The applied files are hashed when they move, or
    when their keep_request_files days end (`_expire_request_files`). Returns the files' names."""
    if not settings.deletion.hash_sample_ids:
        return []
    from tasks.stores.requests import kept_request_files, rewrite
    from unlearning.privacy.erasure import id_key, read_tombstones
    from unlearning.requests import redacted_request_bytes

    tombstones = read_tombstones(settings.paths.path("tombstones"))
    if not tombstones:
        return []
    key = id_key(True, settings.salt())
    if files is None:
        files = [f for store, _, found in kept_request_files(settings.paths) if store == "rejected request files"
                 for f in found]
    out = []
    for f in files:
        data = redacted_request_bytes(f, key, tombstones)
        if data is not None:
            rewrite(f, data)
            out.append(f.name)
    return out


def _keyed_request_bytes(path: Path, settings: RequestFileSettings) -> bytes | None:
    from unlearning.privacy.erasure import id_key
    from unlearning.requests import redacted_request_bytes

    return redacted_request_bytes(path, id_key(True, settings.salt()))


def reconcile(settings: ErasureSettings, tracker, state: StateSettings, resume: bool = True) -> list[str]:
    """state/ decides: first finish an erase a kill stopped (its journal; `resume` False: the caller did), then
    point the registry alias at state/champion.json's version, say on the champion's version whether it serves
    held batches' rows, mark runs of killed batches FAILED, tag never-promoted versions, finish pending erasures,
    hash the erased ids of rejected request files, and (once rows were erased) purge the never-promoted versions
    the erasure's keep rule does not keep. Idempotent; returns what it changed.

    `state`: what tasks/state.py stale_unbatched_state reads to tell whether state/ holds no batch and was built
    from other params or data; asked after the erase a kill stopped is finished, and only when there is a
    champion."""
    paths, tracking, erasure = settings.paths, settings.tracking, settings.erasure
    champion_file = paths.path("state_dir") / "champion.json"
    # StateCorrupt (one line, exit 1) for a truncated file, as everywhere else: json.loads raised a traceback
    version = read_json_file(champion_file).get("model_version") if champion_file.exists() else None
    # an erase a kill stopped, before anything else (`resume` False: the caller took it up already)
    notes = _resume(settings, tracker, version) if resume else []
    name, alias = tracking.registered_model, tracking.alias
    # a batch-less state built from other params follows the retrained original at the next batch (ensure_state):
    # until then the alias stays on that original (`unlearn erase` after `dvc repro train` moved it back)
    if version is not None and not stale_unbatched_state(state):
        before, changed = tracker.reconcile_alias(name, alias, str(version))
        if changed:
            notes.append(f"reconciled {name}@{alias}: v{before} -> v{version} (state/champion.json decides)")
    from tasks.held import held_batches, tag_serving_champion

    if version is not None and held_batches(paths):  # the champion still serves a held batch's rows
        tag_serving_champion(tracker, paths, tracking, version)
    failed = tracker.fail_stale_runs()
    if failed:
        notes.append(f"marked {len(failed)} run(s) of killed batches FAILED")
    tagged = tracker.tag_unpromoted(name, version)
    if tagged:
        notes.append(f"tagged never-promoted version(s) {tagged} promoted=false")
    if erasure.enabled:
        from tasks.erasure import erase_pending, read_tombstones, versions_to_keep

        done = erase_pending(settings, tracker, version, resume=False)
        if done:
            notes.append(f"finished {len(done)} pending erasure(s)")
        requests = RequestFileSettings.of_erasure(settings)
        expired = _expire_request_files(requests)
        if expired:
            notes.append(f"rewrote {len(expired)} kept request file(s) with hashed ids: their "
                         f"erasure.keep_request_files = {erasure.keep_request_files} day(s) are over: {expired}")
        redacted = redact_erased_ids(requests)
        if redacted:
            notes.append(f"rewrote {len(redacted)} kept request file(s) naming erased ids with their hashed form: "
                         f"{redacted}")
        if version is not None and read_tombstones(paths.path("tombstones")):
            # a batch that failed after registering its model left a version no erasure ran for: the registry
            # keeps what an erasure keeps (verify-erasure failed on such an orphan until a later batch's erasure)
            keep = versions_to_keep(tracking, erasure, tracker, version)
            orphans = [v for v in tracker.unpromoted_versions(name) if v not in keep]
            if orphans:
                tracker.purge_versions(name, set(tracker.versions(name)) - set(orphans))
                notes.append(f"purged never-promoted version(s) {orphans} (erasure.keep_versions = "
                             f"{erasure.keep_versions})")
    return notes


# The whole params: the deletion flow's check of every store its params name, before any state changes (the
# tracking store and the champion's, adapters/store_check.py, the DVC cache and remote, Prefect's API).
def preflight(params: Params) -> None:
    """Before any state changes: the tracking store, the DVC cache (and a remote folder) must be usable."""
    from adapters.store_check import state_champion_store_problem
    from adapters.tracking import TrackingUnavailable, preflight as tracking_preflight

    tracking_preflight(params.mlflow_tracking_uri())
    problem, note = state_champion_store_problem(params)
    if problem:
        raise TrackingUnavailable(problem)
    if note:
        run_logger().warning(note)
    api = os.environ.get("PREFECT_API_URL")
    if api:  # a deployment's Prefect server: fail in seconds, not after the client's retries
        import urllib.request

        from adapters.server_auth import prefect_login_problem, prefect_tls

        try:
            urllib.request.urlopen(api.rstrip("/") + "/health", timeout=5, context=prefect_tls()).close()
        except Exception as e:
            raise ConnectionError(f"Prefect API {api} is unreachable ({getattr(e, 'reason', e)}); start it "
                                  f"(`prefect server start`) or unset PREFECT_API_URL; nothing was changed") from None
        problem = prefect_login_problem(api)
        if problem:
            raise ConnectionError(problem)
    from tasks.stores.base import dvc_cache_dir, is_dvc_repo, remote_path  # the erasure's own rule for the remote

    if is_dvc_repo(params.project_paths):
        cache = dvc_cache_dir(params.project_paths)
        for what, folder in (("DVC cache", cache if cache.exists() else cache.parent),
                             ("DVC remote folder", remote_path(params.project_paths, params.operations))):
            if folder is not None and folder.exists() and not os.access(folder, os.W_OK):
                raise PermissionError(f"{what} {folder} is not writable: fix its permissions (nothing was changed)")
