"""The project's secret salt: what `deletion.hash_sample_ids` (on by default, GDPR Art. 25: data protection by
default) hashes every sample id with before the ledger, the tombstones, the kept request files or an MLflow
artifact names it (docs/erasure.md, "Hashed ids and the salt").

A sample id is often a user id or an e-mail address: a hash salted with something public (the dataset's name)
is reversed by hashing every candidate id. The salt is 32 random bytes (hex), made once per project:

- at `base.paths.salt` (default `.unlearning/salt`, mode 0600, git-ignored; `make setup` or the first command
  that needs it creates it): beside the tombstones, it outlives `unlearn reset` as they do;
- with a copy in the state folder (`state/salt`, written with every state): the state is a DVC output, so
  `dvc commit`/`dvc push` (the state's backup) carry the salt to the DVC cache and remote, never to git, and an
  archived state keeps the salt its ledger was hashed with. A missing salt is restored from that copy, with
  one line on stderr saying so.

Losing both means the erasures made so far can no longer be matched: a new request naming an erased id is not
recognised as erased (it is "not in the manifest"), `unlearn lookup` cannot answer, and the tombstones can no
longer keep those rows out of a re-prepare of the source. So a missing salt is never silently replaced while
hashed records exist (`SaltLost`, with what to restore)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from unlearning.io import StateCorrupt
from unlearning.ledger import HASH_PREFIX  # noqa: F401  (re-exported: a keyed id's form)

SALT_FILE_MODE = 0o600
STATE_COPY = "salt"  # the copy's name inside the state folder (base.paths.state_dir)


class SaltLost(StateCorrupt):
    """The salt is gone while the ledger or the tombstones hold ids hashed with it."""


def read_salt(path: str | Path) -> str | None:
    """The salt in the file at `path`, or None when there is no such file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise StateCorrupt(f"{path}: the project's salt cannot be read ({e}); restore it from its copy in the state "
                           f"(state/{STATE_COPY}, also in the DVC cache and remote)") from None
    if not text:
        raise StateCorrupt(f"{path}: the project's salt file is empty; restore it from its copy in the state "
                           f"(state/{STATE_COPY}, also in the DVC cache and remote)")
    return text


def write_salt(path: str | Path, salt: str) -> None:
    """Write `salt` to `path` with mode 0600 (atomically: a temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SALT_FILE_MODE)
    try:
        os.fchmod(fd, SALT_FILE_MODE)
        os.write(fd, (salt + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_salt(path: str | Path) -> str:
    """A new random salt at `path`, unless another process created one first (then that one): O_EXCL on a link."""
    path = Path(path)
    salt = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    write_salt(tmp, salt)
    try:
        os.link(tmp, path)  # fails when the salt exists: two first runs agree on one salt
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_salt(path)


def hashed_records(tombstones: set[str], ledger_text: str = "") -> bool:
    """Whether ids were hashed with some salt already (the tombstones or the ledger hold a hashed id)."""
    return any(t.startswith(HASH_PREFIX) for t in tombstones) or f'"sample_id": "{HASH_PREFIX}' in ledger_text


def project_salt(params, create: bool = True) -> str | None:
    """The project's salt (see the module docstring): read from base.paths.salt; restored from the state's copy
    when only that exists; created when neither exists and nothing was hashed yet (`create`; else None).
    Raises SaltLost when it is gone while the ledger or the tombstones hold hashed ids, StateCorrupt when the
    two copies differ."""
    from unlearning.erasure import read_tombstones

    path = params.path("salt")
    copy = params.path("state_dir") / STATE_COPY
    salt, backup = read_salt(path), read_salt(copy)
    if salt is not None:
        if backup is not None and backup != salt:
            raise StateCorrupt(f"{path} and its copy {copy} hold different salts: one was replaced by hand. The "
                               f"ledger in {copy.parent} was hashed with the copy's: restore {path} from it "
                               f"(`cp {copy} {path}`), or restore the state that belongs to this salt")
        return salt
    if backup is not None:
        write_salt(path, backup)
        # one line: a salt file that vanished is worth knowing about (a clean-up too wide, a fresh checkout)
        print(f"the project's salt {path} was missing: restored from its copy {copy}", file=sys.stderr)
        return backup
    ledger = params.path("state_dir") / "ledger.jsonl"
    if hashed_records(read_tombstones(params.path("tombstones")), ledger.read_text() if ledger.exists() else ""):
        raise SaltLost(
            f"{path}: the project's salt is missing, and {params.path('tombstones')} or {ledger} hold ids hashed "
            f"with it: without it no request can be matched against the past erasures and `unlearn lookup` cannot "
            f"answer. Restore it from a backup of the state (state/{STATE_COPY}: `dvc pull` or `dvc checkout "
            f"deletion`, or archive/<time>/state/{STATE_COPY}) to {path}. A project that hashed ids before the "
            f"salt file existed used the dataset's name: `printf %s <dataset name> > {path}`")
    return create_salt(path) if create else None


def id_salt(params) -> str:
    """The salt ids are keyed with: the project's salt with deletion.hash_sample_ids, else '' (ids stay as
    they are; no salt is made)."""
    return project_salt(params) if params.deletion.hash_sample_ids else ""


def keep_copy(params, folder: str | Path) -> None:
    """Write the salt's copy into a state folder being written (`folder`: its staging folder), when the project
    has a salt: `dvc commit` and `dvc push` of the state then back it up (never git)."""
    salt = project_salt(params, create=False) if params.path("salt").exists() else None
    copy = Path(folder) / STATE_COPY
    if salt is not None and read_salt(copy) != salt:  # unchanged when it holds it: `dvc status` stays clean
        write_salt(copy, salt)


def main(argv: list[str] | None = None) -> int:
    """`python -m unlearning.salt [--params params.yaml]` (`make setup`): create the project's salt when missing."""
    import argparse

    from unlearning.config import load_params

    a = argparse.ArgumentParser(description=main.__doc__)
    a.add_argument("--params", default="params.yaml")
    params = load_params(a.parse_args(argv).params)
    existed = params.path("salt").exists()
    project_salt(params)
    if not existed:
        print(f"created the project's secret salt {params.path('salt')} (mode 0600, git-ignored; back it up with the "
              f"state: docs/erasure.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
