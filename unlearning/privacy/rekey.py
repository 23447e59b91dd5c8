"""Re-keying every stored id (docs/erasure.md, "Migrating from the salt" and "Rotating the key"): in place,
idempotent and crash-safe.

Two re-keyings, one procedure:

- the migration from an older version's salt: that salt was copied into state/ and so into the DVC cache and
  remote, where anyone who reads them recovered every erased id by hashing the table's ids with it. The stored
  `sha256:` forms get an HMAC layer under a new random key (`hmac-sha256:` forms); the key becomes
  `legacy-salt:<salt>` + `hmac-sha256:<new>` (a new id goes through both, so it matches an id erased before);
- a rotation: every stored `hmac-sha256:` form gets one more HMAC layer under a new key, appended to the key.

A stored keyed form is rewritten without its plain id (none is kept): the new form is the new layer of the old one.
What holds keyed ids: every text file the project writes (the ledgers, live and archived, the tombstones, the
erasure reports, the kept request files, the shard plan, GX's results, metrics, the local MLflow artifacts), the
digests of the tombstone list the checkpoints and champion.json record (`tombstones_digest` of the same sets,
re-keyed), and the ensemble cache, whose file names are digests of keyed id sets: it is deleted (it is a cache;
its ensembles are trained again when needed). The DVC cache and remote are content-addressed: tasks/rekey.py
re-commits and garbage-collects them and deletes every copy of the old salt.

Crash safety (a journal beside the key file, mode 0600, holding the new key): phase `prepare` writes each new file
as a temporary sibling (`.<name>.rekey`); phase `commit` (recorded first) renames them over the old files, deletes
what goes, then writes the new key and removes the journal. A run killed during `prepare` starts again with the
same key; one killed during `commit` finishes the renames (each is done or still to do). Until the journal is
gone, `unlearning.privacy.salt.project_salt` refuses to hand out a key (KeyMigrationNeeded), so no id is compared
against half re-keyed files."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Callable, Iterable

from unlearning.privacy.erasure import read_tombstones, tombstones_digest
from unlearning.io import StateCorrupt, load_checkpoint
from unlearning.privacy.ledger import read_ledger
from unlearning.privacy.salt import (
    HMAC_LAYER, KEY_ENV, LEGACY_LAYER, STATE_COPY, hash_sample_id, is_legacy, journal_path, key_secrets, key_text,
    new_layer, read_salt, rewrap, write_salt,
)

# A stored keyed form, not part of a longer token (`--hash=sha256:...` in a requirements file is no id).
LEGACY_FORM = re.compile(rb"(?<![0-9A-Za-z_=+/.-])sha256:[0-9a-f]{64}(?![0-9a-f])")
KEYED_FORM = re.compile(rb"(?<![0-9A-Za-z_=+/.-])hmac-sha256:[0-9a-f]{64}(?![0-9a-f])")
TEMP_SUFFIX = ".rekey"
SNIFF = 8192  # a file with a NUL byte in its first 8 KiB is binary (a checkpoint, a .npy, a figure): not text


class Rekeying:
    """One re-keying: the key it installs (`key`), which stored forms it rewrites (`pattern`) and how
    (`rewrite`: an old keyed form -> the new one)."""

    def __init__(self, key: str, pattern: re.Pattern, rewrite: Callable[[str], str]):
        self.key, self.pattern, self.rewrite = key, pattern, rewrite

    def bytes(self, data: bytes) -> bytes | None:
        """`data` with every stored form rewritten; None when it holds none."""
        new, n = self.pattern.subn(lambda m: self.rewrite(m.group().decode()).encode(), data)
        return new if n else None

    def text(self, value: str) -> str | None:
        """`value` (a text, as a database holds it) with every stored form rewritten; None when it holds none."""
        new = self.bytes(value.encode())
        return None if new is None else new.decode()

    def keys(self, keys: Iterable[str]) -> set[str]:
        return {self.rewrite(k) if self.pattern.fullmatch(k.encode()) else k for k in keys}


def migration(legacy_salt: str, layer: str | None = None) -> Rekeying:
    """From an older version's salt: key = legacy-salt + a new HMAC layer; `sha256:` forms get the HMAC layer."""
    key = f"{LEGACY_LAYER}{legacy_salt}\n{layer or new_layer()}"
    return Rekeying(key, LEGACY_FORM, lambda old: hash_sample_id(old, key))


def rotation(current: str, layer: str | None = None) -> Rekeying:
    """One more HMAC layer: key = current + the new layer; `hmac-sha256:` forms get it."""
    layer = layer or new_layer()
    return Rekeying(f"{current}\n{layer}", KEYED_FORM, lambda old: rewrap(old, layer))


# `path` below: the project's `Params.path` (base.paths' name -> the path under the project root), the slice of
# the params a re-keying reads.

# --- what holds keyed ids ----------------------------------------------------------------------------------------
TEXT_ROOTS = ("state_dir", "tombstones", "processed", "rejected", "cache_dir", "models_dir", "metrics_dir",
              "reports_dir", "mlflow_artifacts", "archive_dir", "gx_dir")


def text_files(path) -> list[Path]:
    """Every text file the project writes (not the DVC cache and remote: content-addressed, re-committed and
    garbage-collected instead; not the inbox: the team's input; not the key)."""
    out, key = [], path("salt").resolve()
    for name in TEXT_ROOTS:
        root = path(name)
        found = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        for f in found:
            if f.is_symlink() or not f.is_file() or f.name.endswith(TEMP_SUFFIX) or f.resolve() == key:
                continue
            if f.name == STATE_COPY and f.parent.name == "state":
                continue  # an older version's copy of the salt: deleted, not re-keyed
            with open(f, "rb") as fh:
                if b"\0" in fh.read(SNIFF):
                    continue
            out.append(f)
    return out


def ensemble_caches(path) -> list[Path]:
    """The ensemble caches (live and archived): their file names are digests of keyed id sets."""
    found = [path("cache_dir") / "ensembles"]
    found += sorted(path("archive_dir").glob("*/cache/ensembles"))
    return [f for f in found if f.is_dir()]


def state_copies(path) -> list[Path]:
    """An older version's copies of its salt in state folders (live and archived)."""
    return [p for p in [path("state_dir") / STATE_COPY, *path("archive_dir").glob(f"*/state/{STATE_COPY}")]
            if p.is_file() or p.is_symlink()]


def tombstone_sets(path) -> list[set[str]]:
    """The tombstone lists checkpoints may record a digest of: the list now, and the list after each batch of
    every ledger (archived ones first, in time order), starting from the rows no ledger names."""
    tombstones = read_tombstones(path("tombstones"))
    ledgers = [*sorted(path("archive_dir").glob("*/state/ledger.jsonl")),
               path("state_dir") / "ledger.jsonl"]
    batches: dict[str, set[str]] = {}
    for ledger in ledgers:
        for e in read_ledger(ledger):
            batches.setdefault(f"{ledger}:{e['batch_id']}", set()).add(str(e["sample_id"]))
    every = set().union(*batches.values()) if batches else set()
    sets, current = [tombstones], tombstones - every
    sets.append(set(current))
    for ids in batches.values():
        current = current | ids
        sets.append(set(current))
    return sets


def digest_map(path, rekeying: Rekeying) -> dict[str, str]:
    """{tombstones_digest of a list before: its digest after re-keying} for every list `tombstone_sets` gives."""
    return {tombstones_digest(s): tombstones_digest(rekeying.keys(s)) for s in tombstone_sets(path)}


# --- the two phases ----------------------------------------------------------------------------------------------
def temp_of(file: Path) -> Path:
    return file.with_name(f".{file.name}{TEMP_SUFFIX}")


def write_temp(final: Path, data: bytes) -> Path:
    """`data` into `final`'s temporary sibling, with `final`'s mode."""
    tmp = temp_of(final)
    mode = stat.S_IMODE(final.stat().st_mode) if final.exists() else 0o600
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def prepare_texts(path, rekeying: Rekeying) -> list[tuple[str, str]]:
    renames = []
    for f in text_files(path):
        new = rekeying.bytes(f.read_bytes())
        if new is not None:
            renames.append((str(write_temp(f, new)), str(f)))
    return renames


def prepare_digests(path, digests: dict[str, str]) -> list[tuple[str, str]]:
    """champion.json's `started_clean_of` (live and archived states) and the models' `clean_of`/`erased_through`
    (models_dir/*.pt): the same tombstone lists' digests after re-keying."""
    import torch

    renames = []
    for f in [path("state_dir") / "champion.json", *path("archive_dir").glob("*/state/champion.json")]:
        if f.is_file():
            champion = json.loads(f.read_text())
            if champion.get("started_clean_of") in digests:
                champion["started_clean_of"] = digests[champion["started_clean_of"]]
                renames.append((str(write_temp(f, (json.dumps(champion, indent=2, sort_keys=True) + "\n").encode())),
                                str(f)))
    models = path("models_dir")
    for f in sorted(models.glob("*.pt")) if models.is_dir() else []:
        ckpt = load_checkpoint(f)
        extra = ckpt.get("extra") or {}
        fields = {k: digests[v] for k, v in extra.items() if k in ("clean_of", "erased_through") and v in digests}
        if fields:
            ckpt["extra"] = {**extra, **fields}
            tmp = temp_of(f)
            torch.save(ckpt, tmp)
            os.chmod(tmp, stat.S_IMODE(f.stat().st_mode))
            renames.append((str(tmp), str(f)))
    return renames


def read_journal(path) -> dict | None:
    file = journal_path(path)
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StateCorrupt(f"{file}: the re-keying journal cannot be read ({e}); it holds the new key of an "
                           f"interrupted re-keying: restore it from a backup, or ask for help before deleting it")


def write_journal(path, journal: dict) -> None:
    """The journal, mode 0600 (it holds the new key), replaced atomically."""
    file = journal_path(path)
    tmp = file.with_name(f".{file.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(journal).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, file)


def finish(path, journal: dict) -> dict:
    """Phase `commit`: rename each prepared file over its original, delete what goes, write the new key, remove
    the journal. Idempotent: a run killed half way is finished by the next."""
    for tmp, final in journal["renames"]:
        if Path(tmp).exists():
            os.replace(tmp, final)
    for gone in journal["deletes"]:
        p = Path(gone)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    write_salt(path("salt"), journal["key"])
    journal_path(path).unlink(missing_ok=True)
    return {"rewritten": [final for _, final in journal["renames"]], "deleted": journal["deletes"],
            "key": str(path("salt"))}


def rekey(path, rekeying: Rekeying, extra: Iterable[Callable[[Rekeying], list[tuple[str, str]]]] = (),
          extra_deletes: Iterable[Path] = ()) -> dict:
    """Re-key every stored id with `rekeying` (the module docstring's two phases). `extra`: preparers of stores
    this layer does not know (a local MLflow database: tasks/rekey.py), each returning (temporary, final) pairs;
    `extra_deletes`: files that go at the commit too (the old salt's copies in the DVC cache and remote). A journal
    left by a killed run wins: its key is used, or its commit finished."""
    journal = read_journal(path)
    if journal is not None and journal.get("phase") == "commit":
        return finish(path, journal)
    if journal is not None:  # a prepare that was killed: the same key again, so no two keys ever exist
        rekeying = Rekeying(journal["key"], rekeying.pattern, _rewrite_for(journal, rekeying))
    else:
        journal = {"phase": "prepare", "key": rekeying.key, "kind": _kind(rekeying)}
        write_journal(path, journal)
    digests = digest_map(path, rekeying)
    renames = prepare_texts(path, rekeying) + prepare_digests(path, digests)
    for prepare in extra:
        renames += prepare(rekeying)
    deletes = [str(p) for p in ensemble_caches(path) + state_copies(path) + list(extra_deletes)]
    journal = {**journal, "phase": "commit", "renames": renames, "deletes": deletes}
    write_journal(path, journal)
    return finish(path, journal)


def _kind(rekeying: Rekeying) -> str:
    return "migration" if rekeying.pattern is LEGACY_FORM else "rotation"


def _rewrite_for(journal: dict, rekeying: Rekeying) -> Callable[[str], str]:
    """The rewrite of a resumed journal's key: a migration's (through the whole key), or a rotation's (its last
    layer)."""
    key = journal["key"]
    if journal.get("kind") == "migration":
        return lambda old: hash_sample_id(old, key)
    last = key.splitlines()[-1]
    return lambda old: rewrap(old, last)


# --- entry points (tasks/rekey.py adds the DVC cache and MLflow) ------------------------------------------------
def legacy_salt(path) -> str | None:
    """The older version's salt the project's ids are keyed with: the key file's bare salt, or (the key file
    lost) the state's copy of it; None when there is none."""
    text = read_salt(path("salt"))
    if text is not None:
        return text if is_legacy(text) else None
    copy = path("state_dir") / STATE_COPY
    text = read_salt(copy) if copy.is_file() else None
    return text if text is not None and is_legacy(text) else None


def migrate(path, extra=(), extra_deletes: Callable[[str], list[Path]] = lambda salt: []) -> dict | None:
    """Re-key an older version's salted ids (or finish an interrupted re-keying); None when there is nothing to
    do. `extra_deletes(salt)`: more copies of the salt to delete at the commit. The environment's key cannot be
    rewritten: with UNLEARNING_ID_KEY set the migration stops first."""
    journal = read_journal(path)
    if journal is not None:
        return rekey(path, migration("") if journal.get("kind") == "migration" else rotation(journal["key"]), extra)
    salt = legacy_salt(path)
    if salt is None:
        copies = state_copies(path)
        if copies:  # the key is current: an older copy of it only goes
            for c in copies:
                c.unlink()
            return {"rewritten": [], "deleted": [str(c) for c in copies], "key": str(path("salt"))}
        return None
    if os.environ.get(KEY_ENV):
        raise StateCorrupt(f"{path('salt')} holds an older version's salt while {KEY_ENV} is set: unset "
                           f"{KEY_ENV} for the one-time migration, which writes the new key to that file; then "
                           f"move it to your secret store")
    return rekey(path, migration(salt), extra, extra_deletes(salt))


def rotate(path, extra=()) -> dict:
    """A new HMAC layer for every stored id (docs/erasure.md, "Rotating the key")."""
    journal = read_journal(path)
    if journal is not None:
        raise StateCorrupt(f"an interrupted re-keying ({journal_path(path)}) must finish first: run any `unlearn` "
                           f"command outside `dvc repro`")
    if os.environ.get(KEY_ENV):
        raise StateCorrupt(f"{KEY_ENV} holds the key: a rotation writes the new one to {path('salt')}; unset "
                           f"{KEY_ENV} for it, then move the new key to your secret store")
    current = read_salt(path("salt"))
    if current is None or is_legacy(current):
        why = ("it holds an older version's salt: run any `unlearn` command first, which migrates it" if current
               else "there is none yet")
        raise StateCorrupt(f"{path('salt')}: no current id key to rotate ({why})")
    return rekey(path, rotation(key_text(current)), extra)


__all__ = ["HMAC_LAYER", "LEGACY_FORM", "KEYED_FORM", "Rekeying", "key_secrets", "migrate", "migration", "rekey",
           "rotate", "rotation"]
