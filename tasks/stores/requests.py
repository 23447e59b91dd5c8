"""The request stores: the request files the pipeline keeps (requests/processed/, requests/rejected/) and the
Great Expectations results of their validation (docs/erasure.md, docs/requests.md)."""

from __future__ import annotations

from tasks.stores.base import Scope, files_naming, register_store, unjudged
from unlearning.config import Params
from unlearning.erasure import Finding, Purged
from unlearning.io import atomic_write_bytes
from unlearning.requests import REQUEST_SUFFIXES, kept_request_suffix, plain_forgotten_ids, redacted_request_bytes

# Request files the pipeline keeps: the applied ones and the rejected ones (beside their .error.json)
REQUEST_FOLDERS = (("processed request files", "processed"), ("rejected request files", "rejected"))


def kept_request_files(params: Params):
    """(store, folder, request files) of requests/processed/ and requests/rejected/."""
    for store, name in REQUEST_FOLDERS:
        folder = params.path(name)
        files = sorted(f for f in folder.iterdir() if f.is_file() and kept_request_suffix(f) in REQUEST_SUFFIXES) \
            if folder.is_dir() else []
        yield store, folder, files


def redact_request_files(params: Params, key, tombstones: set[str]) -> list[dict]:
    """With deletion.hash_sample_ids: the kept request files name no forgotten id in plain text. An applied
    file is written with keyed ids when it is moved (flows.deletion_batch.processed); this pass covers a
    rejected file naming an id a later batch erased, and a file moved before it could be rewritten."""
    out = []
    for store, folder, files in kept_request_files(params):
        redacted = []
        for f in files:
            data = redacted_request_bytes(f, key, tombstones)
            if data is not None:
                atomic_write_bytes(f, data)
                redacted.append(f.name)
        out.append({"store": store, "path": str(folder), "redacted_files": redacted})
    return out


@register_store
class RequestFiles:
    """requests/processed/ and requests/rejected/. With deletion.hash_sample_ids they name no forgotten id in
    plain text: the purge rewrites them with keyed ids, the verification reads their ids, keys them and fails on
    a forgotten one. With plain ids (hashing off) the applied files are the audit trail: counted as references."""

    name = "request files"

    def locate(self, scope: Scope) -> list[Finding]:
        return unjudged(self.verify(scope))

    def purge(self, scope: Scope) -> list[Purged]:
        if not scope.hash_ids:
            return []
        return [Purged(r["store"], r["path"], {"redacted_files": r["redacted_files"]})
                for r in redact_request_files(scope.params, scope.key, scope.tombstones)]

    def verify(self, scope: Scope) -> list[Finding]:
        if not scope.hash_ids:  # plain ids are references (the audit trail)
            n = files_naming(scope.params.path("processed"), scope.forgotten) if scope.forgotten else None
            return [] if n is None else [Finding("processed request files", str(scope.params.path("processed")),
                                                 {"files_naming_forgotten_ids": n})]
        out = []
        for store, folder, files in kept_request_files(scope.params):
            n = sum(plain_forgotten_ids(f, scope.key, scope.forgotten) for f in files)
            problems = (f"{store} ({folder}): {n} forgotten id(s) remain in plain text (`unlearn erase` rewrites "
                        f"them with hashed ids)",) if n else ()
            out.append(Finding(store, str(folder), {"forgotten_ids": n, "forgotten_rows": 0}, problems))
        return out


@register_store
class GreatExpectationsResults:
    """<gx_dir>/uncommitted/ (validation results and Data Docs, the newest kept): Great Expectations only ever
    sees sample ids in the ledger's form (tasks/request_check.py keys them before the suite runs), so they hold
    no row and, with deletion.hash_sample_ids, no plain id; the files naming a forgotten id (a request that failed
    on it) are counted as references, like the applied request files. Nothing to purge."""

    name = "Great Expectations results"

    def locate(self, scope: Scope) -> list[Finding]:
        return self.verify(scope)

    def purge(self, scope: Scope) -> list[Purged]:
        return []

    def verify(self, scope: Scope) -> list[Finding]:
        root = scope.params.path("gx_dir") / "uncommitted"
        n = files_naming(root, scope.forgotten) if scope.forgotten else None
        if n is None:
            return []
        field = "files_naming_hashed_forgotten_ids" if scope.hash_ids else "files_naming_forgotten_ids"
        return [Finding(self.name, str(root), {field: n})]
