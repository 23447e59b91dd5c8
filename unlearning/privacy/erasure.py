"""Erasure bookkeeping (docs/design.md §3): the tombstone list and fingerprints of forgotten rows.

The tombstone list (`base.paths.tombstones`, one id a line as a JSON string, salted-hashed with
`deletion.hash_sample_ids`) lies outside every DVC stage's outs: the deletion flow appends to it, prepare
reads it and leaves those rows out, so neither `dvc repro` nor a forced re-prepare brings an erased row back.

Forgotten rows are recognised later by their digest (`row_digest`: sha256 of the row's float32 bytes, keyed with
the project's salt like an id, `id_key`): the erasure report keeps these salted digests, never the rows nor which
id a row was, so `unlearn verify-erasure` can search every store for them while someone holding the source
features cannot tell from the report which rows were erased (an unsalted digest of each source row would).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from unlearning.io import StateCorrupt, atomic_write_text
from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id
from unlearning.privacy.salt import is_keyed

NPY_MAGIC = b"\x93NUMPY"


class UnknownBatch(LookupError):
    """A batch id that no ledger entry has (a typo, or a batch of an archived state): bad input, exit 2."""


def id_key(hash_ids: bool, salt: str) -> Callable[[str], str]:
    """How an id is written to the ledger and the tombstones: itself, or salted-hashed."""
    return (lambda s: hash_sample_id(str(s), salt)) if hash_ids else (lambda s: str(s))


def keyed_forms(keys: Iterable[str], salt: str) -> set[str]:
    """The forgotten ids (keys as the ledger and the tombstones write them) in the form the ensemble cache's
    `.ids.json` and the shard plan name rows by (`hash_sample_id` with the project's salt): a salted key as it
    is; a plain id (hashing off, or a tombstone from before hashing) keyed with `salt`."""
    return {k if k.startswith(HASH_PREFIX) else hash_sample_id(k, salt) for k in map(str, keys)}


def salted_digests(digests: Iterable[str], key: Callable[[str], str], hash_ids: bool) -> list[str]:
    """Row digests as the erasure report keeps them: keyed with `key` (the salt) under hashing; an older
    report's unsalted digest is keyed here, so it keeps matching the rows it names."""
    return sorted({d if not hash_ids or d.startswith(HASH_PREFIX) else key(d) for d in digests})


# Each id is written as a JSON string, one a line, so any id survives: one starting with "#", holding a line
# break, or with spaces at its ends. The first version wrote ids bare (and read them stripped, skipping lines
# that start with "#"): a file without this marker line is read that way, and rewritten in this form.
TOMBSTONE_FORMAT = "# format: one JSON string per line"


def read_tombstones(path: str | Path) -> set[str]:
    path = Path(path)
    if not path.exists():
        return set()
    lines = path.read_text(encoding="utf-8").splitlines()
    if TOMBSTONE_FORMAT not in lines[:3]:  # the first version's bare ids
        return {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    keys = set()
    for n, line in enumerate(lines, 1):
        if line.startswith("#") or not line.strip():
            continue
        try:
            key = json.loads(line)
        except json.JSONDecodeError:
            key = None
        if not isinstance(key, str):
            raise StateCorrupt(f"{path}: line {n} is not a JSON string ({line[:60]!r}); the tombstone list was "
                               f"edited by hand or truncated: restore it from git or a backup")
        keys.add(key)
    return keys


def add_tombstones(path: str | Path, keys: Iterable[str]) -> int:
    """Add keys to the tombstone list (idempotent, atomic); returns how many were new."""
    have = read_tombstones(path)
    new = sorted(set(map(str, keys)) - have)
    if new:
        header = ("# erased sample ids (hashed when deletion.hash_sample_ids): prepare leaves these rows out. "
                  f"Append-only; never edit by hand.\n{TOMBSTONE_FORMAT}\n")
        atomic_write_text(path, header + "".join(json.dumps(k, ensure_ascii=False) + "\n"
                                                 for k in sorted(have | set(new))))
    return len(new)


def tombstones_digest(keys: set[str]) -> str:
    """A short digest of the whole tombstone list: what a checkpoint records it is clean of."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


def clean_of_tombstones(extra: dict, tombstones: set[str]) -> bool:
    """Whether a checkpoint (its saved `extra`) holds none of the tombstoned rows: there are none, it was
    trained (or loaded by the train stage) on a prepared store without any of them (`clean_of`, written by the
    train stage), or it is the champion that replaced models/original.pt at the erasure of all of them
    (`erased_through`). A checkpoint from before later erasures matches neither digest: it was trained on
    rows erased since, and a state started from it would hold them again."""
    if not tombstones:
        return True
    digest = tombstones_digest(tombstones)
    return digest in (extra.get("erased_through"), extra.get("clean_of"))


def state_is_clean(champion: dict, ledger_keys: set[str], tombstones: set[str]) -> bool:
    """Whether the state's champion holds none of the tombstoned rows.

    A state starts from an original clean of the tombstones of that moment, T0 (tasks/state.py refuses any
    other, and records tombstones_digest(T0) as champion.json's `started_clean_of`); its batches forget the
    ledger's rows and tombstone them. So the champion is clean of T exactly when T less the ledger's keys is T0.
    A state from before that record counts as started with T0 empty: clean when every tombstone is its own."""
    started = champion.get("started_clean_of", tombstones_digest(set()))
    return tombstones_digest(set(tombstones) - set(ledger_keys)) == started


def is_erased(tombstones: set[str], hash_ids: bool, salt: str) -> Callable[[str], bool]:
    """Whether an id is tombstoned. With hashed ids a plain entry still counts: one written while
    deletion.hash_sample_ids was off (its default until it became true) keeps its row out after the switch."""
    key = id_key(hash_ids, salt)
    if hash_ids and any(not is_keyed(t) for t in tombstones):
        return lambda s: key(s) in tombstones or str(s) in tombstones
    return lambda s: key(s) in tombstones


def row_digest(row: np.ndarray, key: Callable[[str], str] = str) -> str:
    """The row's digest: sha256 of its float32 bytes, keyed with `key` (the erasure's `id_key`: salted)."""
    return key(hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).hexdigest())


def row_digests(X: np.ndarray, key: Callable[[str], str] = str) -> set[str]:
    X = np.ascontiguousarray(np.asarray(X), dtype=np.float32)
    return {key(hashlib.sha256(r.tobytes()).hexdigest()) for r in X.reshape(len(X), -1)}


def npy_rows_found(path: str | Path, digests: set[str], n_features: int, key: Callable[[str], str] = str) -> int:
    """How many rows of the .npy file at `path` (any name: DVC cache objects have none) are forgotten rows
    (`digests` keyed with `key`). Files that are not 2-D float arrays with `n_features` columns count 0."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(6) != NPY_MAGIC:
                return 0
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception:
        return 0
    if X.ndim != 2 or X.shape[1] != n_features or not np.issubdtype(X.dtype, np.floating):
        return 0
    return len(row_digests(X, key) & digests)


def bytes_found(path: str | Path, needles: Iterable[bytes], limit: int = 64 * 2**20) -> list[bytes]:
    """Which of `needles` occur in the file (its first `limit` bytes)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return []
    return [n for n in needles if n and n in data]


# --- the records of the erasure's stores (tasks/stores/; docs/design.md §3) ------------------------------------
def shown(names: list[str], n: int = 5) -> str:
    """The first `n` names, and how many there are in all when there are more."""
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


@dataclass(frozen=True)
class Finding:
    """One place of a store, looked at by a store's `locate` or `verify`: what it holds of the forgotten ids and
    rows (`counts`), and, from `verify` only, what must not remain (`problems`: each names the store, the place
    and what is left). `as_dict` is the line `unlearn verify-erasure` prints."""

    store: str  # the store as a person reads it: "prepared store", "DVC cache", ...
    where: str  # a path, or the tracking URI (where_key "uri")
    counts: dict = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    where_key: str = "path"

    def as_dict(self) -> dict:
        return {"store": self.store, self.where_key: self.where, **self.counts}

    @classmethod
    def left(cls, store: str, where, ids: list[str] = (), rows: list[str] = (), **counts) -> "Finding":
        """A store that holds ids (and raw rows): a forgotten id or raw row left in it is a problem naming them."""
        problems = ([f"{store} ({where}): {len(ids)} forgotten id(s) remain: {shown(list(ids))}"] if ids else []) + \
            ([f"{store} ({where}): {len(rows)} forgotten raw row(s) remain: {shown(list(rows))}"] if rows else [])
        return cls(store, str(where), {"forgotten_ids": len(ids), "forgotten_rows": len(rows), **counts},
                   tuple(problems))


@dataclass(frozen=True)
class Purged:
    """What one store's `purge` did to one place (`done`: rows, files or versions removed), or `pending`: what
    waits for `unlearn erase` (a store a running `dvc repro` holds). `as_dict` is the erasure report's entry."""

    store: str
    where: str
    done: dict = field(default_factory=dict)
    pending: str = ""  # e.g. "prepared store": the report's pending line names it
    where_key: str = "path"

    def as_dict(self) -> dict:
        return {"store": self.store, self.where_key: self.where, **self.done, **({"pending": True} if self.pending
                                                                                   else {})}


# --- traces of an erased id: its plain text, or an unsalted hash of it ---------------------------------------------
# The digests a hash of an id is commonly made with; any 12 or more hex characters of one of them, hashed from the
# id alone, is undone by hashing every id of the dataset (docs/erasure.md, "Hashed ids and the salt").
COMMON_DIGESTS = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "sha3_256", "sha3_512", "blake2b",
                  "blake2s")
MIN_HEX = 12
HEX_RUN = re.compile(rb"[0-9a-fA-F]{%d,}" % MIN_HEX)
MIN_PLAIN = 6  # shorter ids (a bare number) are not searched as text: they occur in any file by chance


def unsalted_prefixes(ids: Iterable[str]) -> dict[bytes, str]:
    """{the first MIN_HEX hex characters of an unsalted digest of an id: the digest's name}."""
    return {hashlib.new(name, str(s).encode()).hexdigest()[:MIN_HEX].encode(): name
            for s in ids for name in COMMON_DIGESTS}


def plain_pattern(ids: Iterable[str]) -> re.Pattern | None:
    """An id as a whole word of text (not inside a longer id or number); None when no id is long enough."""
    words = sorted({str(s) for s in ids if len(str(s)) >= MIN_PLAIN}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(rb"(?<![0-9A-Za-z])(?:" + b"|".join(re.escape(w.encode()) for w in words) + rb")(?![0-9A-Za-z])")


def unsalted_hashes_in(data: bytes, prefixes: dict[bytes, str]) -> set[str]:
    """The digests (names) of which `data` holds an unsalted hash prefix, anywhere in a run of hex characters."""
    found = set()
    for run in HEX_RUN.findall(data):
        run = run.lower()
        found |= {prefixes[run[i:i + MIN_HEX]] for i in range(len(run) - MIN_HEX + 1) if run[i:i + MIN_HEX] in prefixes}
    return found
