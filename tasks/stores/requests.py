"""The request stores: the request files the pipeline keeps (requests/processed/, requests/rejected/) and the
Great Expectations results of their validation (docs/erasure.md, docs/requests.md)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

from tasks.stores.base import (
    CountedOnly, Scope, StoreBase, files_naming, read_head, register_store,
    unreadable_finding,
)
from unlearning.config import Deletion, Erasure, ProjectPaths
from unlearning.privacy.erasure import Finding, Purged
from unlearning.io import atomic_write_bytes
from unlearning.requests import REQUEST_SUFFIXES, kept_request_suffix, plain_forgotten_ids, redacted_request_bytes

# Request files the pipeline keeps: the applied ones and the rejected ones (beside their .error.json)
REQUEST_FOLDERS = (("processed request files", "processed"), ("rejected request files", "rejected"))


def kept_request_files(paths: ProjectPaths, unreadable: list[str] | None = None):
    """(store, folder, request files) of requests/processed/ and requests/rejected/; a folder that cannot be
    listed yields no files and is named in `unreadable` (when given)."""
    for store, name in REQUEST_FOLDERS:
        folder = paths.path(name)
        try:
            files = sorted(f for f in folder.iterdir() if f.is_file() and kept_request_suffix(f) in REQUEST_SUFFIXES) \
                if folder.is_dir() else []
        except OSError as e:
            files = []
            if unreadable is not None:
                unreadable.append(f"{folder} ({e.strerror or type(e).__name__})")
        yield store, folder, files


def kept_since(store: str, f) -> float:
    """When a kept request file came to its folder: applied (requests/processed/: its mtime, set when it moved)
    or rejected (requests/rejected/: its error report's `rejected_at`; else its mtime)."""
    if store == "rejected request files":
        report = f.with_name(f.name + ".error.json")
        try:
            return datetime.fromisoformat(json.loads(report.read_text())["rejected_at"]).timestamp()
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return f.stat().st_mtime


def kept_until(erasure: Erasure, folder: str, f) -> str | None:
    """When a kept request file stops keeping its plain ids under erasure.keep_request_files = N days (ISO time:
    N days after it was applied, or rejected), or None: it keeps none now (until_applied, or N elapsed). A
    rejected file never keeps an ERASED id in plain text, whatever this says (`redact_request_files`); under
    until_applied it keeps its other ids (the ones a fixed file would name again)."""
    days = erasure.request_file_days()
    if not days:
        return None
    until = kept_since(folder, f) + days * 86400
    return datetime.fromtimestamp(until, timezone.utc).isoformat() if until > time.time() else None


def expire_request_files(paths: ProjectPaths, deletion: Deletion, erasure: Erasure, key) -> list[str]:
    """The kept request files (applied or rejected) whose erasure.keep_request_files days are over, rewritten with
    every id keyed (run at the start of every run and `unlearn erase`: they expire without a new batch)."""
    if not deletion.hash_sample_ids or not erasure.request_file_days():
        return []
    out = []
    for store, _folder, files in kept_request_files(paths):
        for f in files:
            if kept_until(erasure, store, f) is None:
                data = redacted_request_bytes(f, key)
                if data is not None:
                    rewrite(f, data)
                    out.append(f.name)
    return out


def rewrite(f, data: bytes) -> None:
    """`f` rewritten (atomically) with its mtime kept: for an applied file, when it was applied."""
    st = f.stat()
    atomic_write_bytes(f, data)
    os.utime(f, (st.st_atime, st.st_mtime))


def redact_request_files(paths: ProjectPaths, erasure: Erasure, key, tombstones: set[str]) -> list[dict]:
    """With deletion.hash_sample_ids: the kept request files name no forgotten id in plain text. An applied
    file is written with keyed ids when it is moved (tasks.inbox_ops.processed); this pass covers a
    rejected file naming an id a later batch erased (or erased before: a file naming erased ids is rejected for
    it), and a file moved before it could be rewritten. An applied file within its erasure.keep_request_files days
    keeps its plain ids until they are over (`kept_until`); a rejected one keeps no erased id. Run by the erase's
    purge and by every run's and `unlearn erase`'s reconcile (tasks/inbox_ops.py)."""
    out = []
    for store, folder, files in kept_request_files(paths):
        redacted = []
        for f in files:
            if store == "processed request files" and kept_until(erasure, store, f):
                continue
            data = redacted_request_bytes(f, key, tombstones)
            if data is not None:
                rewrite(f, data)
                redacted.append(f.name)
        out.append({"store": store, "path": str(folder), "redacted_files": redacted})
    return out


@register_store
class RequestFiles(StoreBase):
    """requests/processed/ and requests/rejected/. With deletion.hash_sample_ids they name no forgotten id in
    plain text: the purge rewrites them with keyed ids, the verification reads their ids, keys them and fails on
    a forgotten one. With plain ids (hashing off) the applied files are the audit trail: counted as references."""

    name = "request files"

    def purge(self, scope: Scope) -> list[Purged]:
        if not scope.hash_ids:
            return []
        return [Purged(r["store"], r["path"], {"redacted_files": r["redacted_files"]})
                for r in redact_request_files(scope.settings.paths, scope.settings.erasure, scope.key,
                                              scope.tombstones)]

    def verify(self, scope: Scope) -> list[Finding]:
        if not scope.hash_ids:  # plain ids are references (the audit trail)
            folder, unreadable = scope.settings.paths.path("processed"), []
            n = files_naming(folder, scope.forgotten, unreadable=unreadable) if scope.forgotten else None
            return ([] if n is None else [Finding("processed request files", str(folder),
                                                  {"files_naming_forgotten_ids": n})]) + \
                unreadable_finding("processed request files", folder, unreadable)
        out, folders_unread = [], []
        for store, folder, files in kept_request_files(scope.settings.paths, folders_unread):
            kept = {f.name: kept_until(scope.settings.erasure, store, f) for f in files}
            n, unreadable = 0, []
            for f in files:
                # an applied file within its erasure.keep_request_files days keeps its plain ids on purpose; a
                # rejected one never keeps an erased id
                if kept[f.name] and store == "processed request files":
                    continue
                if read_head(f, 1, unreadable, folder) is not None:  # the reader says "cannot read" as bad input
                    n += plain_forgotten_ids(f, scope.key, scope.forgotten)
            problems = (f"{store} ({folder}): {n} forgotten id(s) remain in plain text (`unlearn erase` rewrites "
                        f"them with hashed ids)",) if n else ()
            within = {name: until for name, until in kept.items() if until}
            out.append(Finding(store, str(folder), {"forgotten_ids": n, "forgotten_rows": 0,
                                                    **({"plain_ids_kept_until": within} if within else {})}, problems))
            out += unreadable_finding(store, folder, unreadable)
        return out + unreadable_finding(self.name, "requests/", folders_unread)


@register_store
class GreatExpectationsResults(CountedOnly):
    """<gx_dir>/uncommitted/ (validation results and Data Docs, the newest kept): Great Expectations only ever
    sees sample ids in the ledger's form (adapters/request_check.py keys them before the suite runs), so they hold
    no row and, with deletion.hash_sample_ids, no plain id; the files naming a forgotten id (a request that failed
    on it) are counted as references, like the applied request files. Nothing to purge."""

    name = "Great Expectations results"

    def verify(self, scope: Scope) -> list[Finding]:
        root, unreadable = scope.settings.paths.path("gx_dir") / "uncommitted", []
        n = files_naming(root, scope.forgotten, unreadable=unreadable) if scope.forgotten else None
        if n is None:
            return []
        field = "files_naming_hashed_forgotten_ids" if scope.hash_ids else "files_naming_forgotten_ids"
        return [Finding(self.name, str(root), {field: n})] + unreadable_finding(self.name, root, unreadable)
