"""`unlearn lookup ID`: was this sample id erased, when and by which batch? (docs/erasure.md, "Looking an id up").

With deletion.hash_sample_ids (the default) no store names an erased id in plain text: the answer is found by
hashing ID with the project's secret salt (unlearning/privacy/salt.py) and searching the ledger (the live one and those
`unlearn reset` archived), the tombstones, the live manifest and the inbox. Without the salt nothing can be
matched: the lookup says so (SaltLost) instead of answering "never seen". Reads only; no torch, no Prefect."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unlearning.config import ProjectPaths

# the answers, one of
ERASED = "erased"  # a ledger records it (and its erasure ran, or is pending: `erasure_pending`)
ERASED_NO_RECORD = "erased (no ledger record here)"  # tombstoned; its ledger was archived elsewhere or lost
PENDING = "pending"  # named by a request file in the inbox, not applied yet
NOT_ERASED = "not erased"  # a row of the prepared dataset, named by no request
NEVER_SEEN = "never seen"  # in no ledger, tombstone, inbox file or the dataset


def _ledgers(paths: ProjectPaths) -> list[tuple[Path, list[dict]]]:
    """(file, entries) of the live ledger, then of every ledger `unlearn reset` archived (oldest first)."""
    from unlearning.privacy.ledger import read_ledger

    state_dir = paths.path("state_dir")
    files = [state_dir / "ledger.jsonl"]
    archive = paths.path("archive_dir")
    if archive.is_dir():
        files += sorted(archive.glob(f"*/{state_dir.name}/ledger.jsonl"))
    return [(f, read_ledger(f)) for f in files if f.is_file()]


def _inbox_files_naming(paths: ProjectPaths, forms: set[str]) -> list[str]:
    """The inbox request files whose sample_id column names the id (in plain or keyed form)."""
    from unlearning.requests import RequestValidationError, read_request_file, scan_inbox

    out = []
    for f in scan_inbox(paths.path("inbox"))[0]:
        try:
            ids = read_request_file(f)["sample_id"]
        except (RequestValidationError, KeyError, OSError, ValueError):
            continue  # a file the batch will reject names nothing it will apply
        if ids.astype(str).isin(forms).any():
            out.append(f.name)
    return out


def _state_row(paths: ProjectPaths, sample_id: str):
    """The live manifest's row of the id (its split, status, deleted_in_batch), or None."""
    import pandas as pd

    path = paths.path("state_dir") / "manifest.csv"
    if not path.exists():
        return None
    m = pd.read_csv(path, dtype=str, keep_default_na=False)
    rows = m[m["sample_id"] == sample_id]
    return rows.iloc[0].to_dict() if len(rows) else None


def _prepared_split(paths: ProjectPaths, sample_id: str) -> str | None:
    import pandas as pd

    path = paths.path("prepared_dir") / "manifest.csv"
    if not path.exists():
        return None
    m = pd.read_csv(path, dtype=str, keep_default_na=False, usecols=["sample_id", "split"])
    rows = m.loc[m["sample_id"] == sample_id, "split"]
    return str(rows.iloc[0]) if len(rows) else None


def lookup(paths: ProjectPaths, hash_sample_ids: bool, sample_id: str) -> dict:
    """What the project knows of `sample_id`: {"status": one of the answers above, "sample_id", "hashed", "key",
    "entries": the ledger records (batch_id, request_id, request_file, processed_at, kind, method, verdict,
    model_version_after, ledger file), "tombstoned", "erasure_pending", "inbox_files", "split", "message"}.
    `hash_sample_ids`: deletion.hash_sample_ids. Raises unlearning.privacy.salt.SaltLost when ids are hashed and
    the salt is gone."""
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.privacy.ledger import ERASED_NOT_TRAINED_ON, hash_sample_id
    from unlearning.privacy.salt import project_salt

    hashed = hash_sample_ids
    tombstones = read_tombstones(paths.path("tombstones"))
    # SaltLost when hashed records exist without it: no answer rather than a false "never seen"; None when nothing
    # was hashed yet (then nothing hashed can match)
    salt = project_salt(paths, create=False) if hashed else None
    key = hash_sample_id(sample_id, salt) if salt else sample_id
    forms = {sample_id, key}  # a record from before hashing was on names the id itself
    entries = []
    for path, ledger in _ledgers(paths):
        for e in ledger:
            if str(e.get("sample_id")) in forms:
                entries.append({k: e.get(k) for k in ("batch_id", "request_id", "request_file", "processed_at",
                                                      "requested_at", "method", "verdict", "model_version_after")}
                               | {"kind": e.get("kind", "unlearned"), "ledger": str(path)})
    tombstoned = bool(forms & tombstones)
    row = _state_row(paths, sample_id)
    inbox = _inbox_files_naming(paths, forms)
    out = {"sample_id": sample_id, "hashed": hashed, "key": key if hashed else None, "entries": entries,
           "tombstoned": tombstoned, "erasure_pending": bool(entries) and not tombstoned, "inbox_files": inbox,
           "split": None}
    if entries:
        e = entries[-1]
        how = ("erased, not trained on (a validation row)" if e["kind"] == ERASED_NOT_TRAINED_ON
               else f"unlearned with {e['method']} and erased")
        pending = ("; its erasure from the stores is still pending (`unlearn erase`)" if out["erasure_pending"]
                   else "")
        archived = "" if Path(e["ledger"]) == paths.path("state_dir") / "ledger.jsonl" else \
            f" (recorded in the archived ledger {e['ledger']})"
        again = f"; named again by inbox file(s) {inbox}" if inbox else ""
        return {**out, "status": ERASED, "message": (
            f"{ERASED}: {how} by batch {e['batch_id']} at {e['processed_at']} (request {e['request_id']} in "
            f"{e['request_file']}, requested at {e['requested_at']}; champion v{e['model_version_after']})"
            f"{archived}{pending}{again}")}
    if tombstoned:
        return {**out, "status": ERASED_NO_RECORD, "message": (
            f"{ERASED_NO_RECORD}: tombstoned in {paths.path('tombstones')}, so prepare leaves its row out, but no "
            f"ledger here records the batch (a state archived or restored elsewhere)")}
    if row is not None and row.get("status") == "deleted":
        return {**out, "status": PENDING, "split": row.get("split"), "message": (
            f"{PENDING}: deleted by batch {row.get('deleted_in_batch')} in the live manifest, not yet recorded as "
            f"erased (`unlearn erase` finishes it)")}
    if inbox:
        return {**out, "status": PENDING, "message": (
            f"{PENDING}: named by {len(inbox)} request file(s) in {paths.path('inbox')} not applied yet: {inbox} "
            f"(the next `unlearn run` applies them)")}
    split = _prepared_split(paths, sample_id)
    if split is not None:
        return {**out, "status": NOT_ERASED, "split": split, "message": (
            f"{NOT_ERASED}: a {split} row of the dataset; no request named it")}
    return {**out, "status": NEVER_SEEN, "message": (
        f"{NEVER_SEEN}: no ledger, tombstone, inbox file or dataset row holds this id (check its spelling; ids are "
        f"compared character by character)")}


__all__ = ["lookup", "ERASED", "ERASED_NO_RECORD", "PENDING", "NOT_ERASED", "NEVER_SEEN"]
