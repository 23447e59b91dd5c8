"""The erasure's stores: what each one is asked, the scope it is asked about, and the registry (docs/erasure.md,
docs/design.md §3).

A store is one place the project writes that can hold a forgotten row or name a forgotten id: the prepared store,
the ensemble cache, the MLflow registry, the DVC cache... Each is one small class with three methods over a
`Scope` (the forgotten ids in the ledger's form, the fingerprints of their rows, the erasure's settings):

- `locate(scope)`: where the forgotten ids and rows are in it now; changes nothing;
- `purge(scope)`: remove them (idempotent); the records go into the erasure report;
- `verify(scope)`: look again and judge: a `Finding` whose `problems` are not empty fails `unlearn verify-erasure`.

`tasks/erasure.py`'s `erase` and `verify_erasure` are loops over `STORES`, in the order `tasks/stores/__init__.py`
declares (`ORDER`: the DVC cache last, since it re-commits what the others rewrote). Adding a store is one class
with `@register_store` (on `StoreBase`, which gives the default `locate`), its name in `ORDER` and one test
(tests/unit/test_erasure_stores.py).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import numpy as np

from adapters.tracker import tracker_at
from tasks.id_key import IdKey
from unlearning.config import Deletion, Erasure, Operations, Params, Prepare, ProjectPaths, Tracking
from unlearning.privacy.erasure import Finding, Purged, npy_rows_found, row_digest, shown


@dataclass(frozen=True)
class ErasureSettings:
    """What the erasure, its verification, the reconcile around the batches and every store read of the params
    (docs/erasure.md, "The stores" and "The journal"), as slices: none of them takes the whole params. Where the
    project's files are (base.paths against the project folder: every store's files), how ids are keyed
    (deletion.hash_sample_ids; with the paths, the id key: `key`), what an erasure purges and keeps (erasure), the
    DVC remote (operations), the team's source the id traces read again (prepare, base.seed), the registry and its
    alias (tracking) and the tracking store a reconcile opens (`tracker`)."""

    paths: ProjectPaths
    deletion: Deletion  # hash_sample_ids: ids keyed or plain, in every store and report
    erasure: Erasure  # enabled, dvc_gc, keep_versions, keep_request_files
    operations: Operations  # dvc_remote: the DVC store, the id traces, where the id key may be exposed
    prepare: Prepare  # the source the id traces recover the erased ids from (tasks/training.py load_source)
    seed: int  # base.seed: load_source's
    tracking: Tracking  # registered_model, alias, experiment
    tracking_uri: str  # params.mlflow_tracking_uri(): MLFLOW_TRACKING_URI, else the project's SQLite store

    # Builds the slice record from the whole params, its one job.
    @classmethod
    def of(cls, params: Params) -> "ErasureSettings":
        return cls(params.project_paths, params.deletion, params.erasure, params.operations, params.prepare,
                   params.base.seed, params.tracking, params.mlflow_tracking_uri())

    @property
    def key(self) -> IdKey:
        """The id key (`.salt()`: what unlearning/privacy/salt.py id_salt returns for the same params)."""
        return IdKey(self.deletion.hash_sample_ids, self.paths)

    def tracker(self):
        """The project's tracker, as adapters/tracker.py tracker_for opens it from the params."""
        return tracker_at(self.tracking_uri, self.tracking.experiment, self.paths.path("mlflow_artifacts"))


@dataclass
class Scope:
    """What a store is asked about. `forgotten`: id keys as the ledger writes them (salted hashes with
    deletion.hash_sample_ids): for an erasure every tombstone, for a verification one batch's ids or every
    erased one. `digest_ids`: the salted row digest of each forgotten row -> its id keys, known while `erase`
    runs only (the erasure reports keep the digests alone: [] from a report). `cache_hashes`: the forgotten ids
    as the ensemble cache's `<key>.ids.json` and the shard plan key them (unlearning/privacy/erasure.py keyed_forms)."""

    settings: ErasureSettings  # the slices of the params the stores read
    forgotten: set[str]
    tombstones: set[str]
    key: Callable[[str], str]  # a sample id -> its key (the ledger's and the tombstones' form)
    prepared: Any = None  # the prepared store (None before prepare)
    digest_ids: dict[str, list[str]] = field(default_factory=dict)
    cache_hashes: set[str] = field(default_factory=set)
    ledger: list[dict] = field(default_factory=list)  # the ledger entries in scope (verification)
    reports: list[dict] = field(default_factory=list)  # state/erasure/<batch>.json of the batches in scope
    tracker: Any = None  # the MLflow adapter (adapters/tracking.py), None without a tracking store
    champion_version: str | None = None  # the erasure's champion (a verification reads state/champion.json)
    dvc_locked: bool = False  # inside `dvc repro`: the stores DVC holds leave their purge pending
    # row digest of a forgotten row -> the retained rows (ids) with the same bytes: another person's row, kept
    kept: dict[str, list[str]] = field(default_factory=dict)
    unreadable_reports: list[str] = field(default_factory=list)  # erasure reports a verification could not read

    @property
    def hash_ids(self) -> bool:
        return self.settings.deletion.hash_sample_ids

    @property
    def digests(self) -> set[str]:
        return set(self.digest_ids)

    @property
    def n_features(self) -> int:
        return int(self.prepared.X.shape[1]) if self.prepared is not None else -1

    def is_forgotten(self, sample_id) -> bool:
        return self.key(sample_id) in self.forgotten

    def row_name(self, digest: str) -> str:
        """A forgotten row as a person reads it: its id (keyed like the ledger), else its digest."""
        ids = self.digest_ids.get(digest) or []
        return "/".join(map(repr, ids)) if ids else f"row digest {digest.split(':')[-1][:12]}"


@runtime_checkable
class Store(Protocol):
    """One place that can hold a forgotten row or name a forgotten id (see the module's docstring)."""

    name: str

    def locate(self, scope: Scope) -> list[Finding]:
        """Where the forgotten ids and rows are in this store now, unjudged (`problems` empty); changes nothing."""
        ...

    def purge(self, scope: Scope) -> list[Purged]:
        """Remove them; idempotent ([] when this store has nothing to do)."""
        ...

    def verify(self, scope: Scope) -> list[Finding]:
        """Look again after the erasure; a finding with problems fails `unlearn verify-erasure`."""
        ...


class StoreBase:
    """The stores' common base: `locate` is what `verify` finds, unjudged (the same counts, no problems), as the
    `Store` protocol says. Subclasses give `name`, `purge` and `verify`; a store whose `locate` looks somewhere
    `verify` does not overrides it."""

    def locate(self, scope: Scope) -> list[Finding]:
        return unjudged(self.verify(scope))


class CountedOnly(StoreBase):
    """A store the pipeline never rewrites (the team's own sources, Great Expectations' results): `locate` counts
    what `verify` counts, and `purge` has nothing to do. Subclasses give `name` and `verify`."""

    def purge(self, scope: Scope) -> list[Purged]:
        return []


STORES: list[Store] = []


def register_store(cls: type) -> type:
    """Class decorator: one instance of the store joins `STORES` (its name must be new)."""
    if any(s.name == cls.name for s in STORES):
        raise ValueError(f"a store named {cls.name!r} is registered already: {[s.name for s in STORES]}")
    store = cls()
    if not isinstance(store, Store):
        raise TypeError(f"store {cls.__name__} lacks one of name, locate, purge, verify")
    STORES.append(store)
    return cls


def in_declared_order(stores: list[Store], order: tuple[str, ...]) -> list[Store]:
    """`stores` in the order `order` names them (tasks/stores/__init__.py's `ORDER`): the order `erase` purges
    and `verify_erasure` checks is declared, not the order the modules happen to be imported in. A registered
    store that `order` does not name, or a name no store has, is an error that says which."""
    by_name = {s.name: s for s in stores}
    unlisted = [n for n in by_name if n not in order]
    unknown = [n for n in order if n not in by_name]
    if unlisted or unknown:
        raise ValueError(f"the stores' ORDER (tasks/stores/__init__.py) does not match the registered stores: "
                         f"not in ORDER {unlisted}, no such store {unknown}; add each new store's name to ORDER")
    return [by_name[n] for n in order]


def get_store(name: str) -> Store:
    for s in STORES:
        if s.name == name:
            return s
    raise KeyError(f"unknown store {name!r}; registered: {[s.name for s in STORES]}")


# --- shared by several stores ------------------------------------------------------------------------------
def in_dvc_stage() -> bool:
    return bool(os.environ.get("DVC_STAGE"))


def is_dvc_repo(paths: ProjectPaths) -> bool:
    return (paths.root / ".dvc").is_dir()


def dvc_cache_dir(paths: ProjectPaths) -> Path:
    return paths.root / ".dvc" / "cache"


def remote_path(paths: ProjectPaths, operations: Operations) -> Path | None:
    """operations.dvc_remote as a path: absolute, or relative to the project root; None when unset."""
    remote = operations.dvc_remote
    if not remote:
        return None
    return Path(remote) if Path(remote).is_absolute() else paths.root / remote


def remote_folder(paths: ProjectPaths, operations: Operations) -> Path | None:
    """The DVC remote folder when it exists (None: unset, or not created yet)."""
    folder = remote_path(paths, operations)
    return folder if folder is not None and folder.is_dir() else None


def digest_list(X: np.ndarray, key: Callable[[str], str] = str) -> list[str]:
    """[n] row digests of X [n, ...] in row order (unlearning/privacy/erasure.py's row_digest: sha256 of float32 bytes,
    keyed with `key`: a scope's `key`, salted)."""
    X = np.ascontiguousarray(np.asarray(X), dtype=np.float32)
    return [row_digest(r, key) for r in X.reshape(len(X), -1)] if len(X) else []  # no rows: no -1 to infer


def prepared_rows(scope: Scope) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The prepared store's rows: ([n] digests, [n] id keys, [n] bool: the id is forgotten or tombstoned)."""
    keys = scope.prepared.manifest["sample_id"].map(scope.key).to_numpy(dtype=object)
    gone = np.array([k in scope.forgotten or k in scope.tombstones for k in keys], dtype=bool)
    return digest_list(scope.prepared.X, scope.key) if scope.digest_ids else [""] * len(keys), keys, gone


def retained_twins(scope: Scope) -> dict[str, list[str]]:
    """{digest of a forgotten row: the retained rows' ids with the same bytes}: a duplicate row in the data is
    another person's row, kept; its bytes prove nothing about the forgotten one."""
    if scope.prepared is None or not scope.digest_ids:
        return {}
    digests, _, gone = prepared_rows(scope)
    ids = scope.prepared.manifest["sample_id"].astype(str).to_numpy(dtype=object)
    kept: dict[str, list[str]] = {}
    for d, i, g in zip(digests, ids, gone):
        if not g and d in scope.digest_ids:
            kept.setdefault(d, []).append(i)
    return kept


def rows_beyond_twins(path: Path, scope: Scope) -> tuple[list[str], int]:
    """(digests of forgotten rows in the .npy file at `path` beyond the retained twins' count, one per extra
    copy; how many of its rows are a retained twin's bytes)."""
    if not scope.digest_ids or not npy_rows_found(path, scope.digests, scope.n_features, scope.key):
        return [], 0
    counts = Counter(d for d in digest_list(np.load(path, mmap_mode="r", allow_pickle=False), scope.key)
                     if d in scope.digest_ids)
    extra = [d for d, c in sorted(counts.items()) for _ in range(c - len(scope.kept.get(d, [])))]
    return extra, sum(counts.values()) - len(extra)


def raw_rows_finding(store: str, root: Path | None, scope: Scope) -> list[Finding]:
    """A store without ids (the DVC cache and remote, MLflow artifacts): its .npy files searched for the forgotten
    rows' bytes. A copy of a retained twin's bytes is allowed as many times as the prepared store keeps it. An
    entry that cannot be read is named and counted (`unreadable_finding`), and the others are searched."""
    if root is None or not root.is_dir():
        return []
    left, twins, unreadable = [], 0, []
    for f in walk_files(root, unreadable):
        extra, same = rows_beyond_twins(f, scope)
        left += [f"{scope.row_name(d)} in {f.relative_to(root)}" for d in extra]
        twins += same
    return [Finding.left(store, root, rows=left, rows_identical_to_retained=twins)] + \
        unreadable_finding(store, root, unreadable)


def unjudged(findings: list[Finding]) -> list[Finding]:
    """`locate`'s form of `verify`'s findings: the same counts, no problems."""
    return [Finding(f.store, f.where, f.counts, (), f.where_key) for f in findings]


TEXT_SUFFIXES = {".json", ".csv", ".txt", ".yaml", ".yml", ".html", ".md", ".jsonl", ".parquet"}


# --- entries a verification cannot read: named and counted, never the end of it ---------------------------------
def _entry(path, root: Path | None, error: OSError) -> str:
    path = Path(path)
    name = str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else str(path)
    return f"{name} ({error.strerror or type(error).__name__})"


def walk_files(root: Path, unreadable: list[str], follow_links: bool = True) -> Iterator[Path]:
    """Every regular file under `root` (or `root` itself when it is a file), links to files followed unless
    `follow_links` is False. A folder that cannot be listed, or a file that cannot be opened, is appended to
    `unreadable` ("<path> (<reason>)") and skipped: one unreadable entry never stops a verification, it is named
    and counted (`unreadable_finding`)."""
    if root.is_file():
        if _opens(root, root.parent, unreadable):
            yield root
        return
    if not root.is_dir():
        return
    for folder, _dirs, names in os.walk(root, onerror=lambda e: unreadable.append(_entry(e.filename, root, e))):
        for name in sorted(names):
            f = Path(folder) / name
            if (f.is_symlink() and not follow_links) or not f.is_file():
                continue
            if _opens(f, root, unreadable):
                yield f


def _opens(f: Path, root: Path | None, unreadable: list[str]) -> bool:
    try:
        with open(f, "rb"):
            return True
    except OSError as e:
        unreadable.append(_entry(f, root, e))
        return False


def read_head(f: Path, limit: int, unreadable: list[str], root: Path | None = None) -> bytes | None:
    """The file's first `limit` bytes; None (and the file named in `unreadable`) when it cannot be read."""
    try:
        with open(f, "rb") as fh:
            return fh.read(limit)
    except OSError as e:
        unreadable.append(_entry(f, root, e))
        return None


def unreadable_finding(store: str, where, unreadable: list[str]) -> list[Finding]:
    """[] or one finding naming the entries of `store` a verification could not read (a problem: what it could
    not read, it cannot vouch for), with the fix."""
    if not unreadable:
        return []
    return [Finding(store, str(where), {"unreadable": len(unreadable), "unreadable_entries": unreadable[:5]},
                    (f"{store} ({where}): {len(unreadable)} entr(ies) could not be read, so were not checked: "
                     f"{shown(unreadable)}; make them readable by the pipeline's user, then run `unlearn "
                     f"verify-erasure` again",))]


def files_naming(root: Path, forgotten: set[str], max_bytes: int = 50_000_000,
                 unreadable: list[str] | None = None) -> int | None:
    """How many text files under `root` name a forgotten id (None: no such folder); a file that cannot be read
    is named in `unreadable` (when given) and not counted."""
    import re

    if not root.is_dir():
        return None
    if not forgotten:
        return 0
    pattern = re.compile("|".join(re.escape(i) for i in sorted(forgotten, key=len, reverse=True)).encode())
    unreadable = [] if unreadable is None else unreadable
    n = 0
    for f in walk_files(root, unreadable):
        if f.suffix.lower() in TEXT_SUFFIXES and f.stat().st_size <= max_bytes:
            data = read_head(f, max_bytes, unreadable, root)
            n += bool(data is not None and pattern.search(data))
    return n
