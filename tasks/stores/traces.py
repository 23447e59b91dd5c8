"""Traces of an erased id in every file the project wrote (docs/erasure.md, "Hashed ids and the salt"): its plain
text, or an unsalted hash of it (12 or more hex characters of its md5, sha1, sha2, sha3 or blake2 digest), which
hashing every id of the dataset undoes. With deletion.hash_sample_ids the pipeline keys ids with the project's salt
only, so the verification knows the erased ids by their salted keys alone: it recovers them as anyone holding the
source could (prepare's dataset read again, erased rows included: the pipeline never rewrites a team's source),
then searches every file the project wrote for them. It never prints an id: a problem names the file and what it
holds. With hashing off the ids are plain on purpose (the ledger names them) and nothing is searched."""

from __future__ import annotations

from pathlib import Path

from tasks.stores.base import (
    CountedOnly, Scope, dvc_cache_dir, read_head, register_store, remote_folder, unreadable_finding, walk_files,
)
from unlearning.config import Operations, ProjectPaths
from unlearning.privacy.erasure import Finding, plain_pattern, shown, unsalted_hashes_in, unsalted_prefixes

MAX_BYTES = 64 * 2**20  # a larger file is searched in its first 64 MiB


def written_roots(paths: ProjectPaths, operations: Operations) -> list[Path]:
    """Every file or folder the project writes (the team's own source and the inbox are its input, the salt file
    its secret): the state, the prepared store, the tombstones, the request files it moved, the caches, the
    models, the metrics and reports, MLflow's store and artifacts, the archive, GX's results, the DVC cache and
    remote."""
    names = ("state_dir", "prepared_dir", "tombstones", "processed", "rejected", "cache_dir", "models_dir",
             "metrics_dir", "reports_dir", "mlflow_db", "mlflow_artifacts", "archive_dir", "gx_dir")
    remote = remote_folder(paths, operations)
    return [paths.path(n) for n in names] + [dvc_cache_dir(paths)] + ([remote] if remote else [])


def written_files(paths: ProjectPaths, operations: Operations, unreadable: list[str] | None = None):
    """Every file under `written_roots` (links not followed); an entry that cannot be read goes to `unreadable`."""
    unreadable = [] if unreadable is None else unreadable
    for root in written_roots(paths, operations):
        if not root.is_symlink():
            yield from walk_files(root, unreadable, follow_links=False)


def erased_plain_ids(scope: Scope) -> list[str] | str:
    """The plain ids of the forgotten keys, recovered from the source; a line saying why not when it cannot be read."""
    from tasks.training import load_source

    try:
        ids = map(str, load_source(scope.settings.prepare, scope.settings.paths.root, scope.settings.seed).sample_id)
    except Exception as e:  # a source moved or deleted: nothing to recover from, and nothing to search for
        return f"the source cannot be read ({type(e).__name__}: {str(e)[:200]})"
    return sorted({s for s in ids if scope.key(s) in scope.forgotten or s in scope.forgotten})


@register_store
class IdTraces(CountedOnly):
    """Every file the project wrote, searched for the plain text and any unsalted hash of a forgotten id. Plain
    text in the kept request files is the request store's to judge (erasure.keep_request_files)."""

    name = "id traces"

    def verify(self, scope: Scope) -> list[Finding]:
        if not scope.hash_ids or not scope.forgotten:
            return []
        paths = scope.settings.paths
        root = paths.root
        ids = erased_plain_ids(scope)
        if isinstance(ids, str):
            return [Finding(self.name, str(root), {"not_searched": ids})]
        prefixes, pattern = unsalted_prefixes(ids), plain_pattern(ids)
        requests = [paths.path("processed"), paths.path("rejected")]
        plain, hashed, unreadable, n = [], [], [], 0
        for f in written_files(paths, scope.settings.operations, unreadable) if ids else []:
            data = read_head(f, MAX_BYTES, unreadable, root)
            if data is None:
                continue
            n += 1
            name = str(f.relative_to(root)) if f.is_relative_to(root) else str(f)
            if pattern is not None and not any(f.is_relative_to(r) for r in requests) and pattern.search(data):
                plain.append(name)
            digests = unsalted_hashes_in(data, prefixes)
            if digests:
                hashed.append(f"{name} ({', '.join(sorted(digests))})")
        problems = ([f"id traces: {len(plain)} file(s) name a forgotten id in plain text: {shown(plain)}"]
                    if plain else []) + \
            ([f"id traces: {len(hashed)} file(s) hold an unsalted hash of a forgotten id, which hashing every id "
              f"undoes: {shown(hashed)}"] if hashed else [])
        return [Finding(self.name, str(root),
                        {"files_searched": n, "erased_ids_recovered": len(ids), "plain_text": len(plain),
                         "unsalted_hashes": len(hashed)}, tuple(problems))] + \
            unreadable_finding(self.name, root, unreadable)
