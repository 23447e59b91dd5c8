"""What `unlearn status` reads about erasures and audits, without the stores' imports (docs/design.md §3,
"Erasure vs the DVC DAG").

`tasks.erasure` imports every store of the registry (MLflow, DVC, torch: 4-5 s on a loaded machine) and
`tasks.qualification` the certificate (torch, Prefect: 5-6 s); `unlearn status` needs neither to say what is
pending and which versions are audited. Pure core and stdlib only (pandas through the prepared store's
manifest); `tasks.erasure.pending_erasures` and `tasks.qualification.read_audits` are these functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from unlearning.config import Deletion, ProjectPaths

AUDITS = "audits.jsonl"  # in state/: the qualified versions and their audits (staging copies it along)


def reports_dir(paths: ProjectPaths) -> Path:
    """state/erasure/: one report per batch's erasure (tasks/stores/data.py, ErasureReports)."""
    return paths.path("state_dir") / "erasure"


def read_audits(paths: ProjectPaths) -> list[dict]:
    path = paths.path("state_dir") / AUDITS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tombstoned_rows(paths: ProjectPaths, deletion: Deletion, salt: str, prepared, tombstones: set[str] | None = None):
    """[n] bool: the prepared store's rows whose id is tombstoned (read from data/tombstones.txt unless given).
    `salt`: unlearning/privacy/salt.py's id_salt."""
    from unlearning.privacy.erasure import is_erased, read_tombstones

    if tombstones is None:
        tombstones = read_tombstones(paths.path("tombstones"))
    erased = is_erased(tombstones, deletion.hash_sample_ids, salt)
    return prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)


def pending_erasures(paths: ProjectPaths, deletion: Deletion, salt: Callable[[], str]) -> list[str]:
    """What `unlearn erase` would finish, one line each ([] when nothing is pending): reports marked pending (a
    batch inside `dvc repro`), ledger ids not yet tombstoned (a batch killed between its commit and its erasure),
    tombstoned rows still in the prepared store; first, every erase its journal records as unfinished (a kill
    between two stores, or a `dvc repro` pass: unlearning/privacy/erasure_journal.py). Reads no model: `unlearn status`
    calls it. `salt`: the project's id_salt, asked for only once a prepared store exists (id_salt makes the key of
    a project that has none)."""
    from unlearning.data import load_prepared
    from unlearning.privacy.erasure import read_tombstones
    from unlearning.io import read_json_file
    from unlearning.privacy.ledger import read_ledger

    from unlearning.privacy.erasure_journal import unfinished

    journals = unfinished(paths.path("state_dir"))
    out = [f"unfinished erase: {j.describe()}" for j in journals]
    for path in sorted(reports_dir(paths).glob("*.json")):
        report = read_json_file(path)
        if report.get("batch_id") in {j.batch_id for j in journals}:
            continue  # its journal's line says it, with the stores done
        out += [f"batch {report.get('batch_id', path.stem)}: {p}" for p in report.get("pending", [])]
    ledger = read_ledger(paths.path("state_dir") / "ledger.jsonl")
    missing = {str(e["sample_id"]) for e in ledger} - read_tombstones(paths.path("tombstones"))
    if missing:
        out.append(f"{len(missing)} forgotten id(s) of the ledger are not tombstoned yet (a batch stopped between "
                   f"its commit and its erasure)")
    try:
        prepared = load_prepared(paths.path("prepared_dir"))
    except FileNotFoundError:
        prepared = None
    n = int(tombstoned_rows(paths, deletion, salt(), prepared).sum()) if prepared is not None else 0
    if n and not out:
        out.append(f"the prepared store {paths.path('prepared_dir')} still holds {n} erased row(s)")
    return out
