"""The project's id key: what `deletion.hash_sample_ids` (on by default, GDPR Art. 25: data protection by default)
keys every sample id with before the ledger, the tombstones, the kept request files or an MLflow artifact names it
(docs/erasure.md, "Hashed ids and the salt"; the threat model there says who must not be able to undo it).

A sample id is often a user id or an e-mail address: a hash keyed with anything the team shares (the dataset's
name, a salt backed up beside the ledger) is undone by hashing every candidate id with it. So an id's stored form
is HMAC-SHA256 (RFC 2104) under a secret key that lives only where nobody but the pipeline reads it:

- the environment variable UNLEARNING_ID_KEY (`KEY_ENV`: a deployment's secret store), or
- the file `base.paths.salt` (default `.unlearning/salt`): mode 0600 in a 0700 folder, git-ignored, no DVC output;
  never copied into the state, the DVC cache or remote, or MLflow.

The key is a list of layers, one a line, applied in order:

- `hmac-sha256:<64 hex>`: HMAC-SHA256 under that key, written `hmac-sha256:<64 hex>` (`HASH_PREFIX`);
- `legacy-salt:<salt>` (first, in a project an older version salted): that version's sha256("<salt>:<id>"),
  written `sha256:<64 hex>` (`LEGACY_PREFIX`). That salt was copied into state/ and so into the DVC cache and
  remote: unlearning/privacy/rekey.py re-keys every stored id with an HMAC layer on top, after which the salt alone
  matches nothing.

A rotation appends a layer and re-keys every stored id with it (unlearning/privacy/rekey.py): stored ids then need the
newest key, so an older one that leaked recovers nothing. `hash_sample_id` is the one keyed hash of the project.

Losing the key means the erasures made so far can no longer be matched: a new request naming an erased id is not
recognised as erased, `unlearn lookup` cannot answer, and the tombstones can no longer keep those rows out of a
re-prepare of the source. So a missing key is never silently replaced while hashed records exist (`SaltLost`)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from unlearning.io import StateCorrupt

KEY_ENV = "UNLEARNING_ID_KEY"  # the key's text (its layers, one a line or `;`-separated), instead of the file
HASH_PREFIX = "hmac-sha256:"  # a keyed id's form: what tells it from a plain id
LEGACY_PREFIX = "sha256:"  # an older version's salted id (sha256 of "<salt>:<id>"): re-keyed by unlearning/privacy/rekey.py
HMAC_LAYER, LEGACY_LAYER = "hmac-sha256:", "legacy-salt:"
KEY_FILE_MODE, KEY_DIR_MODE = 0o600, 0o700
STATE_COPY = "salt"  # the copy an older version kept in the state folder (and so in the DVC cache): removed
HEADER = ("# The project's secret id key (docs/erasure.md, \"Hashed ids and the salt\"): HMAC-SHA256 layers, one a "
          "line.\n# Never commit it, copy it into state/, DVC or MLflow, or share it: whoever reads it can undo every "
          "hashed id.\n")
KEY_HEX = re.compile(r"[0-9a-f]{64}")


class SaltLost(StateCorrupt):
    """The key is gone while the ledger or the tombstones hold ids hashed with it."""


class KeyMigrationNeeded(StateCorrupt):
    """The project's ids are keyed with an older version's salt (or a re-keying was interrupted): re-key them
    (unlearning/privacy/rekey.py) before any id is compared."""


# --- the keyed hash -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def key_layers(key: str) -> tuple[tuple[str, bytes], ...]:
    """The key's layers, in order: ("legacy", salt) or ("hmac", key bytes). A text of layer lines (the key file's,
    UNLEARNING_ID_KEY's) is read as such; any other string is one HMAC key (its UTF-8 bytes)."""
    lines = [s.strip() for s in re.split(r"[\n;]", key) if s.strip() and not s.strip().startswith("#")]
    if not lines or not all(s.startswith((HMAC_LAYER, LEGACY_LAYER)) for s in lines):
        return (("hmac", key.encode()),)
    layers = []
    for n, line in enumerate(lines):
        if line.startswith(LEGACY_LAYER):
            if n:
                raise StateCorrupt(f"the id key's layer {n + 1} is a {LEGACY_LAYER} layer: only the first may be")
            layers.append(("legacy", line.removeprefix(LEGACY_LAYER).encode()))
        else:
            hexed = line.removeprefix(HMAC_LAYER)
            if not KEY_HEX.fullmatch(hexed):
                raise StateCorrupt(f"the id key's layer {n + 1} is not {HMAC_LAYER}<64 hex digits>: the key was "
                                   f"edited by hand or cut; restore it from its backup (docs/erasure.md)")
            layers.append(("hmac", bytes.fromhex(hexed)))
    return tuple(layers)


def _apply(kind: str, secret: bytes, value: str) -> str:
    if kind == "legacy":
        return LEGACY_PREFIX + hashlib.sha256(secret + b":" + value.encode()).hexdigest()
    return HASH_PREFIX + hmac.digest(secret, value.encode(), "sha256").hex()


def hash_sample_id(sample_id, key: str) -> str:
    """The one keyed hash of the project (docs/erasure.md, "Hashed ids and the salt"): an id as the ledger and the
    tombstones key it, and as the ensemble cache, the shard plan and the erasure reports' row digests do.
    `key`: the project's key (`id_salt`). An id already in keyed form is returned as it is; an older version's
    salted form (`sha256:...`) skips the legacy layer it already went through."""
    value = str(sample_id)
    if value.startswith(HASH_PREFIX):
        return value
    layers = key_layers(key)
    if layers[0][0] == "legacy" and value.startswith(LEGACY_PREFIX):
        layers = layers[1:]
    for kind, secret in layers:
        value = _apply(kind, secret, value)
    return value


def rewrap(keyed: str, layer: str) -> str:
    """A stored keyed id (or row digest) under one more HMAC layer (`layer`: `hmac-sha256:<hex>`): a rotation."""
    [(kind, secret)] = key_layers(layer)
    return _apply(kind, secret, keyed)


def is_keyed(value) -> bool:
    """Whether a stored id is in keyed form (this version's or an older version's salted one), not plain."""
    return isinstance(value, str) and value.startswith((HASH_PREFIX, LEGACY_PREFIX))


def hashed_records(tombstones: set[str], ledger_text: str = "") -> bool:
    """Whether ids were keyed already (the tombstones or the ledger hold a keyed id)."""
    return any(is_keyed(t) for t in tombstones) or any(f'"sample_id": "{p}' in ledger_text
                                                          for p in (HASH_PREFIX, LEGACY_PREFIX))


def new_layer() -> str:
    """A fresh HMAC layer: 32 random bytes."""
    return HMAC_LAYER + secrets.token_hex(32)


# --- the key file ---------------------------------------------------------------------------------------------
def key_text(raw: str) -> str:
    """The key's layers, one a line, without comments or blank lines (the form `id_salt` returns)."""
    return "\n".join(s.strip() for s in re.split(r"[\n;]", raw) if s.strip() and not s.strip().startswith("#"))


def is_legacy(text: str) -> bool:
    """Whether a key file's text is an older version's bare salt (one line, no layer): it must be re-keyed."""
    return bool(text) and not all(s.startswith((HMAC_LAYER, LEGACY_LAYER)) for s in text.splitlines())


def read_salt(path: str | Path) -> str | None:
    """The key text in the file at `path` (`key_text`; an older version's bare salt as it is), or None."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise StateCorrupt(f"{path}: the project's id key cannot be read ({e}); restore it from its backup "
                           f"(docs/erasure.md, \"Backing up the key\")") from None
    text = key_text(raw)
    if not text:
        raise StateCorrupt(f"{path}: the project's id key file is empty; restore it from its backup "
                           f"(docs/erasure.md, \"Backing up the key\")")
    return text


def write_salt(path: str | Path, text: str) -> None:
    """Write the key `text` to `path`, mode 0600 from its first byte, its folder 0700 (a temporary file, then
    rename: a reader sees the old key or the new one, never half of one). A text of layers gets the header."""
    path = Path(path)
    path.parent.mkdir(mode=KEY_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.parent.stat().st_mode) & 0o077 and path.parent.stat().st_uid == os.getuid():
        path.parent.chmod(KEY_DIR_MODE)  # the key's own folder lists no name to anyone else
    body = (HEADER if not is_legacy(text) else "") + text + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_FILE_MODE)
    try:
        os.fchmod(fd, KEY_FILE_MODE)
        os.write(fd, body.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_salt(path: str | Path) -> str:
    """A new random key at `path`, unless another process created one first (then that one): O_EXCL on a link."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    write_salt(tmp, new_layer())
    try:
        os.link(tmp, path)  # fails when the key exists: two first runs agree on one key
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_salt(path)


def env_key() -> str | None:
    """UNLEARNING_ID_KEY's key text, or None; StateCorrupt (naming the variable, never its value) when it is not
    a key of layers."""
    raw = os.environ.get(KEY_ENV)
    if not raw:
        return None
    text = key_text(raw)
    if not text or is_legacy(text):
        raise StateCorrupt(f"{KEY_ENV} is set but holds no key of `{HMAC_LAYER}<64 hex>` layers (one a line or "
                           f"`;`-separated; the text of {'.unlearning/salt'} without its comments): fix or unset it")
    key_layers(text)  # a cut layer is refused here, with its line
    return text


# `path`: a project's `Params.path` (base.paths' name -> the path under the project root): what the key and the
# re-keying touch, a slice of the params.
def journal_path(path) -> Path:
    """Where unlearning/privacy/rekey.py records a re-keying in progress (beside the key file)."""
    key = path("salt")
    return key.with_name(key.name + ".rekeying")


def migration_pending(path) -> bool:
    """Whether the stored ids must be re-keyed before any is compared: the key file holds an older version's bare
    salt, a state folder still holds that version's copy of it, or a re-keying was interrupted."""
    text = read_salt(path("salt"))
    return (text is not None and is_legacy(text)) or journal_path(path).exists() or \
        (text is None and env_key() is None and (path("state_dir") / STATE_COPY).exists())


def project_salt(params, create: bool = True) -> str | None:
    """The project's id key text (see the module docstring): UNLEARNING_ID_KEY, else the file base.paths.salt;
    created when neither exists and nothing was hashed yet (`create`; else None). Raises KeyMigrationNeeded when
    the stored ids are keyed with an older version's salt, SaltLost when the key is gone while the ledger or the
    tombstones hold keyed ids, StateCorrupt when the variable and the file hold different keys."""
    path = params.path("salt")
    if migration_pending(params.path):
        raise KeyMigrationNeeded(
            f"{path}: the project's ids are keyed with an older version's salt, which was copied into state/ and so "
            f"into the DVC cache and remote (or a re-keying was interrupted): they are re-keyed with a new secret "
            f"key once by any `unlearn` command run outside `dvc repro` (`unlearn status`), or by `make setup` "
            f"(docs/erasure.md, \"Migrating from the salt\")")
    text, env = read_salt(path), env_key()
    if env is not None:
        if text is not None and text != env:
            raise StateCorrupt(f"{KEY_ENV} and {path} hold different id keys: keep one (the key the ledger was "
                               f"hashed with), delete or fix the other")
        return env
    if text is not None:
        return text
    if _hashed_records_exist(params.path):
        raise SaltLost(
            f"{path}: the project's id key is missing, and {params.path('tombstones')} or "
            f"{params.path('state_dir') / 'ledger.jsonl'} hold ids hashed with it: without it no request can be "
            f"matched against the past erasures and `unlearn lookup` cannot answer. Restore it from your backup of "
            f"the key to {path}, or set {KEY_ENV} (docs/erasure.md, \"Backing up the key\")")
    return create_salt(path) if create else None


def _hashed_records_exist(path) -> bool:
    """Whether the tombstones or the ledger name a keyed id (read as text: this module imports neither reader)."""
    texts = []
    for p in (path("tombstones"), path("state_dir") / "ledger.jsonl"):
        try:
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            continue
    return any(f'"{prefix}' in t for t in texts for prefix in (HASH_PREFIX, LEGACY_PREFIX))


def id_salt(params) -> str:
    """The key ids are keyed with: the project's key with deletion.hash_sample_ids, else '' (ids stay as they
    are; no key is made)."""
    return project_salt(params) if params.deletion.hash_sample_ids else ""


def remove_state_copy(folder: str | Path) -> bool:
    """Remove the key's copy an older version wrote into a state folder being written (`folder`): a state is a
    DVC output, so `dvc push` would carry it to the remote beside the ledger. Returns whether one was there."""
    copy = Path(folder) / STATE_COPY
    if copy.is_file() or copy.is_symlink():
        copy.unlink()
        return True
    return False


# --- where the key can be read ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyPlace:
    """One place the key can be read from: `where` (a path, or the variable), `readers` (who can read it), and
    `problem` (why it must not be there, with the fix) or None where it belongs."""

    where: str
    readers: str
    problem: str | None = None

    def as_dict(self) -> dict:
        return {"where": self.where, "readers": self.readers, **({"problem": self.problem} if self.problem else {})}


def key_secrets(text: str) -> list[bytes]:
    """The secret parts of a key text as they would appear in a copy: each layer's text (hex key, legacy salt)."""
    return [line.split(":", 1)[1].encode() for line in text.splitlines() if ":" in line] or [text.encode()]


def readers_of(path: Path) -> str:
    """Who can read the file at `path`, from its mode bits: its owner alone, its group, or every local user."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o004:
        return "every local user (mode %o)" % mode
    if mode & 0o040:
        return "its group (mode %o)" % mode
    return "its owner (mode %o)" % mode


MAX_COPY_BYTES = 1 << 20  # a copy of the key is a small file: larger files are not searched


def key_exposure(path, shared_roots=()) -> list[KeyPlace]:
    """Where the project's id key can be read from (`unlearn verify-erasure` prints it): the variable or the key
    file (a problem when another local user can read it), and every copy of its secret under `shared_roots`
    (folders the team shares: the state, the DVC cache and remote, MLflow's store, the archive...: each one a
    problem) or in a state folder (an older version's copy). Changes nothing."""
    places, text = [], None
    env = os.environ.get(KEY_ENV)
    if env:
        text = key_text(env)
        places.append(KeyPlace(f"environment variable {KEY_ENV}", "this user's processes (and root)"))
    key = path("salt")
    file_text = read_salt(key) if key.exists() else None
    if file_text is not None:
        text = text or file_text
        readers = readers_of(key)
        problem = None if not stat.S_IMODE(key.stat().st_mode) & 0o077 else (
            f"{key} can be read by {readers.split(' (')[0]}: `chmod 600 {key}`")
        places.append(KeyPlace(str(key), readers, problem))
    copies = [path("state_dir") / STATE_COPY] + sorted(path("archive_dir").glob(f"*/state/{STATE_COPY}"))
    for copy in copies:
        if copy.is_file():
            places.append(KeyPlace(str(copy), readers_of(copy), f"{copy}: a copy of the key (or of an older "
                                   f"version's salt) in a state folder, which DVC backs up: delete it"))
    if text:
        needles = key_secrets(text)
        for f in small_files(shared_roots, {key.resolve(), *(c.resolve() for c in copies)}):
            try:
                data = f.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                places.append(KeyPlace(str(f), readers_of(f), f"{f}: holds the id key's secret, in a place the team "
                                       f"shares: delete it (and re-key: `unlearn rotate-key`)"))
    return places


def small_files(roots, skip: set[Path] = frozenset()):
    """Files of at most MAX_COPY_BYTES under `roots` (files or folders), each once, not the paths in `skip`."""
    seen = set()
    for root in map(Path, roots):
        found = [root] if root.is_file() else (root.rglob("*") if root.is_dir() else [])
        for f in found:
            try:
                if f.is_symlink() or not f.is_file() or f.stat().st_size > MAX_COPY_BYTES:
                    continue
            except OSError:
                continue
            r = f.resolve()
            if r not in skip and r not in seen:
                seen.add(r)
                yield f
