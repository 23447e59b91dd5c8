"""Erasure after a promoted batch, and its verification (docs/design.md §3, docs/erasure.md).

Deleting a row from a model without deleting it from the data is not erasure. The places a forgotten row or id
can be are stores (tasks/stores/: the prepared store, the state manifest, the ensemble cache, the checkpoints,
the MLflow registry and artifacts, the DVC cache and remote, the kept request files, the Great Expectations
results, the tombstones, the team's own sources), each one class with `locate`, `purge` and `verify`.
`erase` and `verify_erasure` are loops over the registered stores:

1. `erase` adds the batch's ids to the tombstone list (`base.paths.tombstones`, outside every DVC out; prepare
   leaves them out), fingerprints the rows while the prepared store still holds them, then asks every store to
   purge every tombstoned row; idempotent;
2. `verify_erasure` asks every store to look again; a finding with problems fails `unlearn verify-erasure`.

Inside `dvc repro` (env DVC_STAGE) the stores DVC holds (the prepared store, the state manifest,
models/original.pt, the DVC cache) cannot be purged: their purge is recorded as pending and run first thing by
the next `unlearn run` or `unlearn erase` (`erase_pending`; `unlearn verify-erasure` reminds of it). A per-batch
report (`state/erasure/<batch>.json` and the MLflow batch run's `erasure_report.json`) lists every store's
purge, pass by pass.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from adapters import dvc_ops
from adapters.clock import computes
from tasks.pending import pending_erasures, tombstoned_rows  # noqa: F401  (unlearn status: without the stores)
from tasks.stores import STORES, Scope
from tasks.stores.base import (  # noqa: F401
    ErasureSettings, digest_list, files_naming, in_dvc_stage, is_dvc_repo, retained_twins,
)
from tasks.stores.data import (  # noqa: F401
    LEGACY_KEYS, legacy_report, reports_dir, source_folder_checks, source_table_checks,
)
from tasks.stores.requests import kept_request_files, redact_request_files  # noqa: F401
from tasks.stores.tracking import versions_to_keep  # noqa: F401  (tasks/inbox_ops.py)
from unlearning.config import Deletion, ProjectPaths
from unlearning.data import load_prepared
from unlearning.privacy.erasure import (  # noqa: F401  (read_tombstones: tasks/inbox_ops.py)
    Finding, UnknownBatch, add_tombstones, id_key, is_erased, keyed_forms, read_tombstones, salted_digests,
)
from unlearning.privacy.erasure_journal import Journal, journal_dir, unfinished
from unlearning.io import StateCorrupt, atomic_write_json, fault, read_json_file

_redact_request_files = redact_request_files  # the name tests and older callers use
__all__ = ["STORES", "Scope", "UnknownBatch", "erase", "erase_pending", "pending_erasures", "verify_erasure",
           "id_references", "kept_request_files", "source_folder_checks", "source_table_checks", "tombstoned_rows",
           "versions_to_keep", "digest_list", "reports_dir", "read_tombstones", "in_dvc_stage", "is_dvc_repo",
           "resume_unfinished"]


# The report's fingerprints of the forgotten rows: kept in state/erasure/, not logged to MLflow. An older version
# also wrote `row_ids_by_digest` (which id each row was) and `cache_id_hashes` (unsalted id hashes): anyone holding
# the source features or the ids could match them; `migrate_reports` drops them.
FINGERPRINT_KEYS = ("row_digests",)


def _fingerprints(prepared, erased, key, hash_ids: bool, old: dict) -> dict[str, list[str]]:
    """{salted row digest: [id keys]} of the erased rows still in `prepared`, with an earlier pass's digests
    (report `old`; their ids unknown). The ids name the rows in this pass's messages only: the report keeps the
    digests alone, so it never tells which id a row was."""
    hit = prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)
    ids = prepared.manifest["sample_id"][hit].tolist()
    digest_ids: dict[str, list[str]] = {d: [] for d in salted_digests(old.get("row_digests", []), key, hash_ids)}
    for d, s in zip(digest_list(np.asarray(prepared.X)[hit], key), ids):
        if key(s) not in digest_ids.setdefault(d, []):
            digest_ids[d].append(key(s))
    return dict(sorted(digest_ids.items()))


def migrate_reports(paths: ProjectPaths, deletion: Deletion, key) -> int:
    """Rewrite the older versions' erasure reports (`legacy_report`): row digests salted, the id map and the
    unsalted id hashes dropped; one line says how many. Returns that count."""
    hash_ids, n = deletion.hash_sample_ids, 0
    for path in sorted(reports_dir(paths).glob("*.json")):
        report = read_json_file(path)
        if legacy_report(report, hash_ids):
            kept = {k: v for k, v in report.items() if k not in LEGACY_KEYS}
            atomic_write_json(path, {**kept, "row_digests": salted_digests(report.get("row_digests", []), key,
                                                                           hash_ids)})
            n += 1
    if n:
        from tasks.reporting import run_logger

        run_logger().warning(f"{reports_dir(paths)}: {n} erasure report(s) of an older version rewritten: row digests "
                             f"salted, the map from rows to ids and the unsalted id hashes removed")
    return n


def pending_line(stores: list[str]) -> str:
    """The report's pending line: the stores a running `dvc repro` holds, and what finishes them."""
    named = ", ".join(stores[:-1]) + (" and " if len(stores) > 1 else "") + stores[-1]
    return f"{named}: inside `dvc repro`; run `unlearn erase`"


def _slug(store: str) -> str:
    return store.replace(" ", "_")


def _open_journal(paths: ProjectPaths, deletion: Deletion, batch_id: str, new_keys: list[str], n_ids: int, key,
                  salt: str, champion_version, run_id: str | None, prepared) -> tuple[Journal, dict]:
    """(the batch's journal, its erasure report so far): the journal of an erase a kill stopped (taken up again),
    or a new one, written before anything is purged, with the salted digests of the rows taken while the prepared
    store still holds them (unlearning/privacy/erasure_journal.py)."""
    path = journal_dir(paths.path("state_dir"))
    report_path = reports_dir(paths) / f"{batch_id}.json"
    old = read_json_file(report_path) if report_path.exists() else {}
    found = [j for j in unfinished(paths.path("state_dir")) if j.batch_id == batch_id]
    if found:
        found[0].resumed()
        return found[0], old
    hash_ids = deletion.hash_sample_ids
    erased = is_erased(read_tombstones(paths.path("tombstones")) | set(new_keys), hash_ids, salt)
    digests = sorted(_fingerprints(prepared, erased, key, hash_ids, old))
    journal = Journal.start(path, batch_id, run_id=run_id or old.get("run_id"), champion_version=champion_version,
                            keys=new_keys, n_ids=n_ids or old.get("n_ids", 0), row_digests=digests,
                            order=[s.name for s in STORES])
    fault("erase:start")
    return journal, old


def _purge_stores(scope: Scope, journal: Journal) -> None:
    """Each registered store's purge, in ORDER, recorded in the journal the moment it returns; a store the journal
    records as finished (by an earlier pass that a kill stopped) is not asked again. Fault points (tests only):
    `erase:before:<store>` and `erase:after:<store>` (purged, not yet recorded), spaces as underscores."""
    for store in STORES:
        if journal.finished(store.name):
            continue
        fault(f"erase:before:{_slug(store.name)}")
        purged = store.purge(scope)
        fault(f"erase:after:{_slug(store.name)}")
        journal.record(store.name, [p.as_dict() for p in purged], ", ".join(p.pending for p in purged if p.pending))


@computes
def erase(settings: ErasureSettings, batch_id: str, forget_ids: list[str] | None, salt: str,
          champion_version: str | None, tracker=None, run_id: str | None = None, keys: list[str] | None = None) -> dict:
    """Erase every tombstoned row (plus `forget_ids`, added first) from every registered store; idempotent and
    journaled: an erase of `batch_id` that a kill stopped is taken up where its journal says, never restarted
    blind nor reported done. Returns the report, also written to state/erasure/<batch_id>.json and logged to the
    MLflow run `run_id`; the journal goes once the report is written, committed and logged, unless a store waits
    for `unlearn erase` (inside `dvc repro`)."""
    paths, hash_ids = settings.paths, settings.deletion.hash_sample_ids
    key = id_key(hash_ids, salt)
    migrate_reports(paths, settings.deletion, key)
    prepared = load_prepared(paths.path("prepared_dir"))
    new_keys = [key(s) for s in forget_ids or []] + list(keys or [])
    journal, old = _open_journal(paths, settings.deletion, batch_id, new_keys, len(forget_ids or []), key, salt,
                                 champion_version, run_id, prepared)
    add_tombstones(paths.path("tombstones"), journal.keys)
    tombstones = read_tombstones(paths.path("tombstones"))
    # a resumed erase finds the rows its first pass purged gone: their digests come from the journal
    digest_ids = _fingerprints(prepared, is_erased(tombstones, hash_ids, salt), key, hash_ids,
                               {"row_digests": journal.row_digests})
    scope = Scope(settings, forgotten=tombstones, tombstones=tombstones, key=key, prepared=prepared,
                  digest_ids=digest_ids, cache_hashes=keyed_forms(tombstones, salt), tracker=tracker,
                  champion_version=champion_version or journal.champion_version, dvc_locked=in_dvc_stage())
    _purge_stores(scope, journal)
    report = _report(settings.deletion, journal, old, tombstones, digest_ids)
    atomic_write_json(reports_dir(paths) / f"{batch_id}.json", report)
    fault("erase:report_written")
    if any(r.get("store") == "DVC cache" and r.get("committed") for r in report["stores"]):
        dvc_ops.commit(paths.root, ["deletion"])  # the report just written is in state/: `dvc status` stays clean
        dvc_ops.gc_workspace(paths.root)  # that commit left the deletion stage's previous objects unreferenced
    if tracker is not None and report["run_id"] is not None:
        tracker.log_json(report["run_id"], {k: v for k, v in report.items() if k not in FINGERPRINT_KEYS},
                         "erasure_report.json")
        from tasks.stores.tracking import batch_page_after_erasure

        batch_page_after_erasure(tracker, report)
    fault("erase:before_close")
    if not journal.pending:
        journal.close()
    return report


def _report(deletion: Deletion, journal: Journal, old: dict, tombstones: set[str], digest_ids: dict) -> dict:
    """The erasure report of this pass, from the journal's records (every store, in ORDER). Each pass's stores are
    kept: the pass inside `dvc repro` purges the ensemble cache and the registry, the `unlearn erase` after it the
    rest; the report says what each one removed, not only the last. A report of this same erase that a kill cut
    off before the journal closed is this pass again, not an earlier one."""
    stores = [r for s in STORES for r in journal.stores.get(s.name, [])]
    waiting = [journal.pending[s.name] for s in STORES if s.name in journal.pending]
    same = old.get("erase_started_at") == journal.started_at and not old.get("pending")
    earlier = old.get("earlier_passes", []) + ([{k: old[k] for k in ("erased_at", "stores", "pending") if k in old}]
                                               if old and not same else [])
    return {"batch_id": journal.batch_id, "run_id": journal.run_id, "erased_at": datetime.now(timezone.utc).isoformat(),
            "erase_started_at": journal.started_at, "passes": journal.passes,
            "n_ids": journal.n_ids or old.get("n_ids", 0), "n_tombstones": len(tombstones),
            "hashed_ids": deletion.hash_sample_ids, "stores": stores,
            "pending": [pending_line(waiting)] if waiting else [], "earlier_passes": earlier,
            "row_digests": sorted(digest_ids)}


def resume_unfinished(settings: ErasureSettings, tracker=None, champion_version: str | None = None) -> list[dict]:
    """Take up every erase a kill stopped (its journal exists), oldest first: the first thing every entry point
    does (`unlearn run`, `unlearn erase`, the deletion stage and the deployments through the flow, `make run` and
    `unlearn repro` through `unlearn erase` before `dvc repro`). Inside `dvc repro` the stores DVC holds stay
    pending (and the journal with them) until `unlearn erase`. Returns the reports, each with `deferred`: its
    journal had stores left pending on purpose (a `dvc repro` pass), rather than being stopped by a kill."""
    journals = unfinished(settings.paths.path("state_dir"))
    if not journals:
        return []
    salt = settings.key.salt()
    return [{**erase(settings, j.batch_id, None, salt, champion_version, tracker, j.run_id),
             "deferred": bool(j.pending)} for j in journals]


@computes
def erase_pending(settings: ErasureSettings, tracker=None, champion_version: str | None = None,
                  resume: bool = True) -> list[dict]:
    """Finish erasures left unfinished: a journaled erase a kill stopped (`resume_unfinished`; `resume` False:
    the caller took them up already), ledger ids not
    yet tombstoned (a kill between the batch's commit and its erasure), reports marked pending (a `dvc repro`
    pass of an older version, without a journal), tombstoned rows still in the prepared store."""
    from unlearning.privacy.ledger import read_ledger

    paths = settings.paths
    try:
        load_prepared(paths.path("prepared_dir"))  # nothing prepared yet: nothing to erase
    except FileNotFoundError:
        return []
    out = resume_unfinished(settings, tracker, champion_version) if resume else []
    # Inside `dvc repro` (a rerun after a kill) the erasure goes as far as the batch's own would there: the
    # ids are tombstoned, the ensemble cache and registry erased, the rest recorded as pending for `unlearn
    # erase` (DVC holds prepare's and train's outputs). A report already pending waits for it as it is.
    dvc_locked = in_dvc_stage()
    journaled = {j.batch_id for j in unfinished(paths.path("state_dir"))}
    ledger = read_ledger(paths.path("state_dir") / "ledger.jsonl")
    missing = sorted({str(e["sample_id"]) for e in ledger} - read_tombstones(paths.path("tombstones")))
    salt = settings.key.salt()
    if missing:  # killed after the commit, before the erasure
        batches = sorted({e["batch_id"] for e in ledger if str(e["sample_id"]) in set(missing)})
        out.append(erase(settings, batches[-1], None, salt, champion_version, tracker, keys=missing))
    waiting = bool(journaled)
    for path in sorted(reports_dir(paths).glob("*.json")):
        rep = read_json_file(path)
        if not rep.get("pending") or rep.get("batch_id") in journaled:
            continue
        if dvc_locked:
            waiting = True
        else:
            out.append(erase(settings, rep["batch_id"], None, salt, champion_version, tracker))
    if not out and not waiting and _prepared_holds_tombstoned(paths, settings.deletion, salt):
        out.append(erase(settings, "recovered", None, salt, champion_version, tracker))
    return out


def _prepared_holds_tombstoned(paths: ProjectPaths, deletion: Deletion, salt: str) -> bool:
    try:
        prepared = load_prepared(paths.path("prepared_dir"))
    except FileNotFoundError:
        return False
    return tombstoned_rows(paths, deletion, salt, prepared).any()


def id_references(paths: ProjectPaths, forgotten: set[str], max_bytes: int = 50_000_000) -> list[dict]:
    """Files that still NAME a forgotten id (not its row): the batches' MLflow artifacts (per-sample KLoM,
    leverage and partition tables) and the applied request files in requests/processed/. With
    deletion.hash_sample_ids off they are kept on purpose: the review's and the audit's references to what was
    forgotten. One entry per store: {"store", "path", "files_naming_forgotten_ids"}."""
    if not forgotten:
        return []
    out = []
    for store, root in (("MLflow artifacts", paths.path("mlflow_artifacts")),
                        ("processed request files", paths.path("processed"))):
        n = files_naming(root, forgotten, max_bytes)
        if n is not None:
            out.append({"store": store, "path": str(root), "files_naming_forgotten_ids": n})
    return out


def verify_erasure(settings: ErasureSettings, batch: str | None = None, tracker=None) -> tuple[list[str], list[dict]]:
    """Ask every registered store to look again; returns (problems, checks). `batch`: only that batch's rows and
    ids. Each store's findings are checks (the lines `unlearn verify-erasure` prints); their problems fail it.

    A problem: a forgotten id left in the prepared store or the state manifest, a forgotten raw row (by its
    digest) in a store, a model or an ensemble trained on it, a registry version beyond erasure.keep_versions,
    an erasure still pending. Rows are judged by identity, not by bytes alone: a forgotten row whose bytes equal
    a retained row's (a duplicate row in the data, another person's) is listed in the checks as
    `identical_to_retained`, not a problem; a store without ids (the DVC cache, MLflow artifacts) fails only when
    it holds more copies of such bytes than the prepared store keeps. Files that only name a forgotten id (the
    ledger, the tombstones, MLflow artifacts, applied request files and Great Expectations results with plain
    ids: `files_naming_forgotten_ids`) are listed in the checks, not problems: they are the audit trail."""
    from tasks.rekey import key_findings
    from unlearning.progress import Progress

    scope = _scope(settings, batch, tracker)
    findings = []
    # lines on stderr once it has run 2 s, naming the store it searches (a large DVC cache takes tens of seconds)
    with Progress(len(STORES), "verify-erasure", unit="stores", enabled=None, after_s=2.0, heartbeat_s=1.0) as bar:
        for store in STORES:
            bar.stage(store.name)
            findings += _verified(store, scope)
            bar.update()
    # where the id key can be read from (a copy in a shared place undoes every hashed id)
    findings += key_findings(settings.paths, settings.operations)
    return [p for f in findings for p in f.problems], [f.as_dict() for f in findings]


def _verified(store, scope: Scope) -> list[Finding]:
    """The store's findings; a store that cannot be read at all (a folder or file it needs, unreadable or
    damaged) is one finding that names it, and the other stores are still checked: an unreadable entry never
    stops a verification."""
    try:
        return store.verify(scope)
    except (OSError, StateCorrupt) as e:
        what = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return [Finding(store.name, str(getattr(e, "filename", "") or scope.settings.paths.root), {"unreadable": 1},
                        (f"{store.name}: could not be checked ({what}); make it readable by the pipeline's user, "
                         f"then run `unlearn verify-erasure` again",))]


def _scope(settings: ErasureSettings, batch: str | None, tracker=None) -> Scope:
    from unlearning.privacy.ledger import read_ledger

    paths, hash_ids = settings.paths, settings.deletion.hash_sample_ids
    every = read_ledger(paths.path("state_dir") / "ledger.jsonl")
    ledger = [e for e in every if batch is None or e["batch_id"] == batch]
    if batch is not None and not ledger:
        raise UnknownBatch(_unknown_batch(paths, batch, every))
    tombstones = read_tombstones(paths.path("tombstones"))
    forgotten = {str(e["sample_id"]) for e in ledger}
    if batch is None:  # every erased id, also those of a ledger `unlearn reset` archived (the tombstones stay)
        forgotten |= tombstones
    every_report, unread = [], []
    for path in sorted(reports_dir(paths).glob("*.json")):
        try:
            every_report.append(read_json_file(path))
        except (OSError, StateCorrupt) as e:  # named by the reports' store, and the other reports still count
            unread.append(f"{path.name} ({getattr(e, 'strerror', None) or type(e).__name__})")
    # a batch whose rows a later pass erased under another name ("recovered") has no report of its own
    reports = [r for r in every_report if batch is None or r.get("batch_id") == batch] or every_report
    prepared = _prepared_or_none(paths)
    salt = settings.key.salt()
    key = id_key(hash_ids, salt)
    # an older report's unsalted digests are keyed here (verify changes nothing; `unlearn erase` rewrites them)
    digests = salted_digests([d for r in reports for d in r.get("row_digests", [])], key, hash_ids)
    scope = Scope(settings, forgotten, tombstones, key, prepared, {d: [] for d in digests},
                  keyed_forms(forgotten, salt), ledger, reports, tracker=tracker if forgotten else None)
    scope.kept = retained_twins(scope)
    scope.unreadable_reports = unread
    return scope


def _unknown_batch(paths: ProjectPaths, batch: str, every: list[dict]) -> str:
    known = list(dict.fromkeys(e["batch_id"] for e in every))
    return (f"batch {batch!r} is not in the ledger {paths.path('state_dir') / 'ledger.jsonl'}; "
            + (f"its batches: {known[-10:]}{' (the 10 newest)' if len(known) > 10 else ''}" if known
               else "it holds no batch yet") + " (`unlearn status` lists them)")


def _prepared_or_none(paths: ProjectPaths):
    try:
        return load_prepared(paths.path("prepared_dir"))
    except FileNotFoundError:
        return None
