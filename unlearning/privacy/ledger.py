"""The append-only deletion ledger (docs/design.md §3), one JSON object per processed request.

Keyed by `request_id`: a request id appears at most once, earlier lines are never rewritten (a re-keying of the
stored ids, unlearning/privacy/rekey.py, rewrites the file whole), and re-processing a file whose requests are all in the
ledger is a no-op. Sample ids are stored keyed with the project's secret id key (unlearning/privacy/salt.py
`hash_sample_id`, re-exported here) when `deletion.hash_sample_ids` is set (the default).
"""

from __future__ import annotations

import json
from pathlib import Path

from unlearning.io import StateCorrupt
from unlearning.privacy.salt import HASH_PREFIX, hash_sample_id  # noqa: F401  (the ledger's id form; callers import it here)

LEDGER_FIELDS = ("request_id", "sample_id", "batch_id", "request_file", "file_sha256", "reason", "objective",
                 "requested_at", "method", "verdict", "model_version_before", "model_version_after",
                 "processed_at")


# `kind` of an entry (entries written before it are "unlearned"): a training row the batch unlearned, or a
# validation row it erased from the stores without unlearning (no model trained on it: docs/requests.md).
UNLEARNED, ERASED_NOT_TRAINED_ON = "unlearned", "erased_not_trained_on"


def trained_on(entries) -> list[dict]:
    """The entries of rows some model trained on (the debt and the original training set count these)."""
    return [e for e in entries if e.get("kind", UNLEARNED) != ERASED_NOT_TRAINED_ON]


class LedgerError(StateCorrupt):
    pass


def read_ledger(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    entries = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise LedgerError(f"{path}:{n}: corrupt ledger line ({e}); the ledger is append-only, restore it "
                                  f"from DVC (`dvc checkout state`)") from None
    return entries


def processed_request_ids(entries: list[dict]) -> set[str]:
    return {e["request_id"] for e in entries}


def appended(entries: list[dict], new: list[dict]) -> list[dict]:
    """The ledger after appending `new`; refuses a request id that is already recorded."""
    seen = processed_request_ids(entries)
    for e in new:
        missing = [f for f in LEDGER_FIELDS if f not in e]
        if missing:
            raise LedgerError(f"ledger entry for request {e.get('request_id')!r} lacks fields {missing}")
        if e["request_id"] in seen:
            raise LedgerError(f"request_id {e['request_id']!r} is already in the ledger; entries are never rewritten")
        seen.add(e["request_id"])
    return [*entries, *new]


def ledger_text(entries: list[dict]) -> str:
    return "".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in entries)
