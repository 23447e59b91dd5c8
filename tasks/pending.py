"""What `unlearn status` reads about erasures and audits, without the stores' imports (docs/design.md §3,
"Erasure vs the DVC DAG").

`tasks.erasure` imports every store of the registry (MLflow, DVC, torch: 4-5 s on a loaded machine) and
`tasks.qualification` the certificate (torch, Prefect: 5-6 s); `unlearn status` needs neither to say what is
pending and which versions are audited. Pure core and stdlib only (pandas through the prepared store's
manifest); `tasks.erasure.pending_erasures` and `tasks.qualification.read_audits` are these functions."""

from __future__ import annotations

import json
from pathlib import Path

from unlearning.config import Params

AUDITS = "audits.jsonl"  # in state/: the qualified versions and their audits (staging copies it along)


def reports_dir(params: Params) -> Path:
    """state/erasure/: one report per batch's erasure (tasks/stores/data.py, ErasureReports)."""
    return params.path("state_dir") / "erasure"


def read_audits(params: Params) -> list[dict]:
    path = params.path("state_dir") / AUDITS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tombstoned_rows(params: Params, prepared, tombstones: set[str] | None = None):
    """[n] bool: the prepared store's rows whose id is tombstoned (read from data/tombstones.txt unless given)."""
    from unlearning.privacy.erasure import is_erased, read_tombstones
    from unlearning.privacy.salt import id_salt

    if tombstones is None:
        tombstones = read_tombstones(params.path("tombstones"))
    erased = is_erased(tombstones, params.deletion.hash_sample_ids, id_salt(params))
    return prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)


def pending_erasures(params: Params) -> list[str]:
    """What `unlearn erase` would finish, one line each ([] when nothing is pending): reports marked pending (a
    batch inside `dvc repro`), ledger ids not yet tombstoned (a batch killed between its commit and its erasure),
    tombstoned rows still in the prepared store; first, every erase its journal records as unfinished (a kill
    between two stores, or a `dvc repro` pass: unlearning/privacy/erasure_journal.py). Reads no model: `unlearn status`
    calls it."""
    from unlearning.data import load_prepared
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.io import read_json_file
    from unlearning.privacy.ledger import read_ledger

    from unlearning.privacy.erasure_journal import unfinished

    journals = unfinished(params.path("state_dir"))
    out = [f"unfinished erase: {j.describe()}" for j in journals]
    for path in sorted(reports_dir(params).glob("*.json")):
        report = read_json_file(path)
        if report.get("batch_id") in {j.batch_id for j in journals}:
            continue  # its journal's line says it, with the stores done
        out += [f"batch {report.get('batch_id', path.stem)}: {p}" for p in report.get("pending", [])]
    ledger = read_ledger(params.path("state_dir") / "ledger.jsonl")
    missing = {str(e["sample_id"]) for e in ledger} - read_tombstones(params.path("tombstones"))
    if missing:
        out.append(f"{len(missing)} forgotten id(s) of the ledger are not tombstoned yet (a batch stopped between "
                   f"its commit and its erasure)")
    try:
        prepared = load_prepared(params.path("prepared_dir"))
    except FileNotFoundError:
        prepared = None
    n = int(tombstoned_rows(params, prepared).sum()) if prepared is not None else 0
    if n and not out:
        out.append(f"the prepared store {params.path('prepared_dir')} still holds {n} erased row(s)")
    return out
