"""Erasure after a promoted batch, and its verification (docs/design.md §3).

Deleting a row from a model without deleting it from the data is not erasure. After a batch is promoted:

1. its ids join the tombstone list (`base.paths.tombstones`, outside every DVC out; prepare leaves them out);
2. the prepared store is rewritten without those rows (staging folder, then swap), and the live manifest
   drops them too (rows of state/manifest.csv stay aligned with the prepared store; the ledger keeps the record);
3. cached ensembles trained on them are deleted (`<key>.ids.json` beside each cache file says which ids);
4. `models/original.pt` is replaced by the champion (which the gate certified as unlearned): the
   pipeline keeps a starting model, and no checkpoint trained on forgotten rows remains;
5. registered versions other than the champion (and the `erasure.keep_versions` newest others) are
   deleted from the registry with their model artifacts;
6. in a DVC repo, the rewritten outputs are re-committed (`dvc commit -f prepare train deletion`) and the
   cache (and the remote) garbage-collected (`dvc gc -w`), so no cache object holds the rows.

Inside `dvc repro` (env DVC_STAGE) steps 2, 4 and 6 cannot run (the other stages' outputs and the DVC lock
belong to the running repro): they are recorded as pending and run first thing by the next `unlearn run`
or `unlearn erase` (which `unlearn verify-erasure` reminds of). A per-batch report (`state/erasure/<batch>.json`
and the MLflow batch run's `erasure_report.json`) lists every store checked and what was purged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tasks import dvc_ops
from tasks.clock import computes
from unlearning.config import Params
from unlearning.data import load_prepared, read_state_manifest
from unlearning.data.store import manifest_csv_bytes, rewrite_without
from unlearning.ensembles import id_hashes, trained_on
from unlearning.erasure import (
    UnknownBatch, add_tombstones, clean_of_tombstones, id_key, is_erased, npy_rows_found, read_tombstones,
    row_digest, state_is_clean, tombstones_digest,
)
from unlearning.io import (
    atomic_save, atomic_write_bytes, atomic_write_json, commit_dir, discard_dir, load_checkpoint, read_json_file,
    staging_dir,
)
from unlearning.requests import REQUEST_SUFFIXES, kept_request_suffix, plain_forgotten_ids, redacted_request_bytes

# Request files the pipeline keeps: the applied ones and the rejected ones (beside their .error.json)
REQUEST_FOLDERS = (("processed request files", "processed"), ("rejected request files", "rejected"))


def in_dvc_stage() -> bool:
    return bool(os.environ.get("DVC_STAGE"))


def is_dvc_repo(params: Params) -> bool:
    return (params.root / ".dvc").is_dir()


def reports_dir(params: Params) -> Path:
    return params.path("state_dir") / "erasure"


def _remote_folder(params: Params) -> Path | None:
    remote = params.operations.dvc_remote
    if not remote:
        return None
    folder = Path(remote) if Path(remote).is_absolute() else params.root / remote
    return folder if folder.is_dir() else None


def _dvc_cache_dir(params: Params) -> Path:
    return params.root / ".dvc" / "cache"


def _drop_from_prepared(params: Params, erased) -> int:
    folder = params.path("prepared_dir")
    stage = staging_dir(folder)
    try:
        n = rewrite_without(folder, stage, erased)
        if n:
            commit_dir(stage, folder)
        else:
            discard_dir(stage)
    except BaseException:
        discard_dir(stage)
        raise
    return n


def _drop_from_state_manifest(params: Params, erased) -> int:
    path = params.path("state_dir") / "manifest.csv"
    if not path.exists():
        return 0
    m = read_state_manifest(path)
    hit = m["sample_id"].map(erased).to_numpy(dtype=bool)
    if hit.any():
        atomic_write_bytes(path, manifest_csv_bytes(m[~hit].reset_index(drop=True)))
    return int(hit.sum())


def _purge_ensembles(params: Params, cache_hashes: set[str]) -> list[str]:
    removed = []
    folder = params.path("cache_dir") / "ensembles"
    for f in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        ids = trained_on(f)
        if ids is None or ids & cache_hashes:  # unknown training rows cannot be proven clean: removed
            f.unlink(missing_ok=True)
            f.with_suffix(".ids.json").unlink(missing_ok=True)
            removed.append(f.name)
    return removed


STATE_HOLDS_ERASED = ("the state's champion holds erased rows (a state started, before this check existed, from an "
                      "original trained before them): it does not replace models/original.pt; `unlearn reset`, then "
                      "`dvc repro -f prepare` retrains the original without them")


def _state_clean(params: Params, tombstones: set[str]) -> bool:
    """Whether state/'s champion holds none of the tombstoned rows (unlearning/erasure.py, state_is_clean)."""
    from unlearning.ledger import read_ledger

    state_dir = params.path("state_dir")
    if not (state_dir / "champion.json").exists():
        return True
    ledger_keys = {str(e["sample_id"]) for e in read_ledger(state_dir / "ledger.jsonl")}
    return state_is_clean(read_json_file(state_dir / "champion.json"), ledger_keys, tombstones)


def _replace_original(params: Params, digest: str) -> str | None:
    """models/original.pt := the champion (state/model.pt), marked with the tombstones it is clean of."""
    import torch

    from tasks.state import original_path

    path, champion = original_path(params), params.path("state_dir") / "model.pt"
    if not champion.exists():
        return None
    if path.exists():
        extra = load_checkpoint(path).get("extra", {})
        if extra.get("erased_through") == digest:
            return None
    ckpt = load_checkpoint(champion)
    ckpt["extra"] = {**ckpt.get("extra", {}), "erased_through": digest, "origin": "champion after erasure"}
    atomic_save(path, lambda tmp: torch.save(ckpt, tmp))
    return str(path)


def kept_request_files(params: Params):
    """(store, folder, request files) of requests/processed/ and requests/rejected/."""
    for store, name in REQUEST_FOLDERS:
        folder = params.path(name)
        files = sorted(f for f in folder.iterdir() if f.is_file() and kept_request_suffix(f) in REQUEST_SUFFIXES) \
            if folder.is_dir() else []
        yield store, folder, files


def _redact_request_files(params: Params, key, tombstones: set[str]) -> list[dict]:
    """With deletion.hash_sample_ids: the kept request files name no forgotten id in plain text. An applied
    file is written with keyed ids when it is moved (flows.deletion_batch.processed); this pass covers a
    rejected file naming an id a later batch erased, and a file moved before it could be rewritten."""
    out = []
    for store, folder, files in kept_request_files(params):
        redacted = []
        for f in files:
            data = redacted_request_bytes(f, key, tombstones)
            if data is not None:
                atomic_write_bytes(f, data)
                redacted.append(f.name)
        out.append({"store": store, "path": str(folder), "redacted_files": redacted})
    return out


def _dvc_gc(params: Params) -> dict:
    root = params.root
    from tasks.dvc_metrics import ensure_metrics

    ensure_metrics(params)  # the stages' declared metrics outputs must exist for `dvc commit`
    out = {"committed": dvc_ops.commit(root, ["prepare", "train", "deletion"]), "gc": "workspace"}
    dvc_ops.gc_workspace(root)
    configured = dvc_ops.remotes(root)
    if configured:
        from tasks.lineage import _ensure_remote

        name = params.operations.dvc_remote
        if name not in configured:
            folder = _remote_folder(params)
            name = _ensure_remote(root, folder) if folder is not None else None
        if name:
            dvc_ops.push(root, name)
            dvc_ops.gc_workspace(root, remote=name)
            out["remote"] = name
    return out


def versions_to_keep(params: Params, tracker, champion_version) -> set[str]:
    """The registered versions an erasure keeps: the champion and the `erasure.keep_versions` newest others."""
    others = [v for v in tracker.versions(params.tracking.registered_model) if v != str(champion_version)]
    kept = others[len(others) - params.erasure.keep_versions:] if params.erasure.keep_versions else []
    return {str(champion_version), *kept}


# The report's fingerprints of the forgotten rows: kept in state/erasure/, not logged to MLflow.
FINGERPRINT_KEYS = ("row_digests", "row_ids_by_digest", "cache_id_hashes")


def _fingerprints(prepared, erased, key, forget_ids: list[str] | None, old: dict) -> tuple[dict, set[str]]:
    """({row digest: [id keys]}, cache id hashes) of the erased rows still in `prepared`, merged with an earlier
    pass's report `old`. The ids are kept in their ledger form (salted hashes with deletion.hash_sample_ids), so
    `verify_erasure` can tell a forgotten row from a retained row with the same bytes, and name it."""
    hit = prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)
    ids = prepared.manifest["sample_id"][hit].tolist()
    digest_ids: dict[str, list[str]] = {d: list(v) for d, v in old.get("row_ids_by_digest", {}).items()}
    for d in old.get("row_digests", []):  # a report from before the ids were recorded
        digest_ids.setdefault(d, [])
    for d, s in zip(digest_list(np.asarray(prepared.X)[hit]), ids):
        digest_ids.setdefault(d, [])
        if key(s) not in digest_ids[d]:
            digest_ids[d].append(key(s))
    cache_hashes = set(id_hashes(forget_ids or [])) | set(id_hashes(ids)) | set(old.get("cache_id_hashes", []))
    return dict(sorted(digest_ids.items())), cache_hashes


def digest_list(X: np.ndarray) -> list[str]:
    """[n] row digests of X [n, ...] in row order (unlearning/erasure.py's row_digest: sha256 of float32 bytes)."""
    X = np.ascontiguousarray(np.asarray(X), dtype=np.float32)
    return [row_digest(r) for r in X.reshape(len(X), -1)] if len(X) else []  # no rows: no -1 to infer


@computes
def erase(params: Params, batch_id: str, forget_ids: list[str] | None, salt: str, champion_version: str | None,
          tracker=None, run_id: str | None = None, keys: list[str] | None = None) -> dict:
    """Erase every tombstoned row (plus `forget_ids`, added first) from every store; idempotent. Returns the
    report, also written to state/erasure/<batch_id>.json and logged to the MLflow run `run_id`."""
    hash_ids = params.deletion.hash_sample_ids
    key = id_key(hash_ids, salt)
    if forget_ids or keys:
        add_tombstones(params.path("tombstones"), [key(s) for s in forget_ids or []] + list(keys or []))
    tombstones = read_tombstones(params.path("tombstones"))
    erased = is_erased(tombstones, hash_ids, salt)
    stores, pending = [], []
    path = reports_dir(params) / f"{batch_id}.json"
    old = read_json_file(path) if path.exists() else {}
    run_id = run_id or old.get("run_id")  # a later pass (`unlearn erase`) updates the batch's MLflow run too
    # Fingerprints of the rows, taken while the rows are still in the prepared store.
    digest_ids, cache_hashes = _fingerprints(load_prepared(params.path("prepared_dir")), erased, key, forget_ids, old)
    digests = sorted(digest_ids)

    dvc_locked = in_dvc_stage()
    if dvc_locked:
        pending.append("prepared store, models/original.pt and the DVC cache: inside `dvc repro`; run `unlearn erase`")
        stores.append({"store": "prepared", "path": str(params.path("prepared_dir")), "purged_rows": 0,
                       "pending": True})
    else:
        n = _drop_from_prepared(params, erased)
        m = _drop_from_state_manifest(params, erased)
        stores.append({"store": "prepared", "path": str(params.path("prepared_dir")), "purged_rows": n})
        stores.append({"store": "state manifest", "path": str(params.path("state_dir") / "manifest.csv"),
                       "purged_rows": m})
    stores.append({"store": "tombstones", "path": str(params.path("tombstones")), "entries": len(tombstones)})
    if hash_ids:
        stores.extend(_redact_request_files(params, key, tombstones))
    stores.append({"store": "ensemble cache", "path": str(params.path("cache_dir") / "ensembles"),
                   "purged_files": _purge_ensembles(params, cache_hashes)})
    if not dvc_locked:
        models = {"store": "models", "path": str(params.path("models_dir"))}
        if _state_clean(params, tombstones):
            stores.append({**models, "replaced": _replace_original(params, tombstones_digest(tombstones))})
        else:
            stores.append({**models, "replaced": None, "refused": STATE_HOLDS_ERASED})
    if tracker is not None:
        name = params.tracking.registered_model
        keep = versions_to_keep(params, tracker, champion_version)
        stores.append({"store": "MLflow registry", "uri": tracker.tracking_uri,
                       "purged_versions": tracker.purge_versions(name, keep), "kept": sorted(keep)})
    if is_dvc_repo(params) and params.erasure.dvc_gc:
        if dvc_locked:
            stores.append({"store": "DVC cache", "path": str(_dvc_cache_dir(params)), "pending": True})
        else:
            stores.append({"store": "DVC cache", "path": str(_dvc_cache_dir(params)), **_dvc_gc(params)})
    # Each pass's stores are kept: the pass inside `dvc repro` purges the ensemble cache and the registry, the
    # `unlearn erase` after it the rest; the report must say what each one removed, not only the last.
    earlier = old.get("earlier_passes", []) + ([{k: old[k] for k in ("erased_at", "stores", "pending") if k in old}]
                                               if old else [])
    report = {"batch_id": batch_id, "run_id": run_id, "erased_at": datetime.now(timezone.utc).isoformat(),
              "n_ids": len(forget_ids or []) or old.get("n_ids", 0), "n_tombstones": len(tombstones),
              "hashed_ids": hash_ids, "stores": stores, "pending": pending, "earlier_passes": earlier,
              "row_digests": digests, "row_ids_by_digest": digest_ids, "cache_id_hashes": sorted(cache_hashes)}
    atomic_write_json(path, report)
    if any(s["store"] == "DVC cache" and s.get("committed") for s in stores):
        dvc_ops.commit(params.root, ["deletion"])  # the report just written is in state/: `dvc status` stays clean
        dvc_ops.gc_workspace(params.root)  # that commit left the deletion stage's previous objects unreferenced
    if tracker is not None and run_id is not None:
        tracker.log_json(run_id, {k: v for k, v in report.items() if k not in FINGERPRINT_KEYS},
                         "erasure_report.json")
    return report


@computes
def erase_pending(params: Params, tracker=None, champion_version: str | None = None) -> list[dict]:
    """Finish erasures left pending (by `dvc repro`, or a kill between the commit and the erasure): ledger
    ids not yet tombstoned, tombstoned rows still in the prepared store, reports marked pending."""
    from unlearning.ledger import read_ledger

    # Inside `dvc repro` (a rerun after a kill) the erasure goes as far as the batch's own would there: the
    # ids are tombstoned, the ensemble cache and registry erased, the rest recorded as pending for `unlearn
    # erase` (DVC holds prepare's and train's outputs). A report already pending waits for it as it is.
    dvc_locked = in_dvc_stage()
    ledger = read_ledger(params.path("state_dir") / "ledger.jsonl")
    missing = sorted({str(e["sample_id"]) for e in ledger} - read_tombstones(params.path("tombstones")))
    out = []
    try:
        salt = load_prepared(params.path("prepared_dir")).info["name"]
    except FileNotFoundError:
        return out
    if missing:  # killed after the commit, before the erasure
        batches = sorted({e["batch_id"] for e in ledger if str(e["sample_id"]) in set(missing)})
        out.append(erase(params, batches[-1], None, salt, champion_version, tracker, keys=missing))
    waiting = False
    for path in sorted(reports_dir(params).glob("*.json")):
        rep = read_json_file(path)
        if rep.get("pending") and dvc_locked:
            waiting = True
        elif rep.get("pending"):
            out.append(erase(params, rep["batch_id"], None, salt, champion_version, tracker))
    if not out and not waiting and _prepared_holds_tombstoned(params):
        out.append(erase(params, "recovered", None, salt, champion_version, tracker))
    return out


def pending_erasures(params: Params) -> list[str]:
    """What `unlearn erase` would finish, one line each ([] when nothing is pending): reports marked pending (a
    batch inside `dvc repro`), ledger ids not yet tombstoned (a batch killed between its commit and its erasure),
    tombstoned rows still in the prepared store. Reads no model: `unlearn status` calls it."""
    from unlearning.ledger import read_ledger

    out = []
    for path in sorted(reports_dir(params).glob("*.json")):
        report = read_json_file(path)
        out += [f"batch {report.get('batch_id', path.stem)}: {p}" for p in report.get("pending", [])]
    ledger = read_ledger(params.path("state_dir") / "ledger.jsonl")
    missing = {str(e["sample_id"]) for e in ledger} - read_tombstones(params.path("tombstones"))
    if missing:
        out.append(f"{len(missing)} forgotten id(s) of the ledger are not tombstoned yet (a batch stopped between "
                   f"its commit and its erasure)")
    prepared = _prepared_or_none(params)
    n = int(tombstoned_rows(params, prepared).sum()) if prepared is not None else 0
    if n and not out:
        out.append(f"the prepared store {params.path('prepared_dir')} still holds {n} erased row(s)")
    return out


def _prepared_holds_tombstoned(params: Params) -> bool:
    try:
        prepared = load_prepared(params.path("prepared_dir"))
    except FileNotFoundError:
        return False
    return tombstoned_rows(params, prepared).any()


def tombstoned_rows(params: Params, prepared, tombstones: set[str] | None = None) -> np.ndarray:
    """[n] bool: the prepared store's rows whose id is tombstoned (read from data/tombstones.txt unless given)."""
    if tombstones is None:
        tombstones = read_tombstones(params.path("tombstones"))
    erased = is_erased(tombstones, params.deletion.hash_sample_ids, prepared.info["name"])
    return prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)


TEXT_SUFFIXES = {".json", ".csv", ".txt", ".yaml", ".yml", ".html", ".md", ".jsonl", ".parquet"}


def id_references(params: Params, forgotten: set[str], max_bytes: int = 50_000_000) -> list[dict]:
    """Files that still NAME a forgotten id (not its row): the batches' MLflow artifacts (per-sample KLoM,
    leverage and partition tables) and the applied request files in requests/processed/. With
    deletion.hash_sample_ids off (the default) they are kept on purpose: the review's and the audit's
    references to what was forgotten. One entry per store: {"store", "path", "files_naming_forgotten_ids"}."""
    import re

    if not forgotten:
        return []
    pattern = re.compile("|".join(re.escape(i) for i in sorted(forgotten, key=len, reverse=True)).encode())
    out = []
    for store, root in (("MLflow artifacts", params.path("mlflow_artifacts")),
                        ("processed request files", params.path("processed"))):
        if not root.is_dir():
            continue
        files = [f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES
                 and f.stat().st_size <= max_bytes]
        n = sum(1 for f in files if pattern.search(f.read_bytes()))
        out.append({"store": store, "path": str(root), "files_naming_forgotten_ids": n})
    return out


def source_table_checks(params: Params, prepared, key, forgotten: set[str]) -> list[dict]:
    """The team's own table (prepare.table.path): the pipeline never rewrites a team's source data, and the
    tombstones keep its forgotten rows out of every prepared store; the check says how many are still there,
    so that they can be deleted at the source too (`unlearn verify-erasure` prints it as a note)."""
    from unlearning.data.registry import DataError
    from unlearning.data.sources import read_table

    source = (prepared.info.get("source") or {}) if prepared is not None else {}
    if source.get("type") != "table" or not forgotten or not Path(source.get("path", "")).is_file():
        return []
    path, column = Path(source["path"]), source.get("id_column")
    try:
        ids = read_table(path, [column])[column]  # as prepare read it (ids as text)
    except (DataError, KeyError) as e:
        return [{"store": "source table", "path": str(path), "unreadable": str(e)}]
    n = int(ids.dropna().astype(str).map(lambda s: key(s) in forgotten).sum())
    return [{"store": "source table", "path": str(path), "forgotten_rows_at_the_source": n}]


def source_folder_checks(params: Params, prepared, key, forgotten: set[str]) -> list[dict]:
    """The team's own image folder (prepare.image_folder.path), like `source_table_checks`: the pipeline never
    deletes a team's source images; the check counts the forgotten ones still there and names the first files."""
    from unlearning.data.registry import DataError
    from unlearning.data.sources import image_id, scan_image_folder

    source = (prepared.info.get("source") or {}) if prepared is not None else {}
    if source.get("type") != "image_folder" or not forgotten or not Path(source.get("path", "")).is_dir():
        return []
    root = Path(source["path"])
    try:
        _, entries = scan_image_folder(root)
    except DataError as e:
        return [{"store": "source image folder", "path": str(root), "unreadable": str(e)}]
    left = [f.relative_to(root).as_posix() for f, _, _ in entries if key(image_id(root, f)) in forgotten]
    return [{"store": "source image folder", "path": str(root), "forgotten_rows_at_the_source": len(left),
             "first_files": left[:5]}]


@dataclass
class Scope:
    """What `verify_erasure` checks: the forgotten ids (one batch's, or every erased one), the erasure reports of
    their batches, and the fingerprints of their rows."""

    ledger: list[dict]  # the ledger entries in scope
    forgotten: set[str]  # id keys as the ledger writes them (salted hashes with deletion.hash_sample_ids)
    tombstones: set[str]
    reports: list[dict]  # state/erasure/<batch>.json of the batches in scope
    digest_ids: dict[str, list[str]]  # row digest of a forgotten row -> its id keys ([]: a report from before them)
    cache_hashes: set[str]
    prepared: Any  # the prepared store (None before prepare)
    key: Callable[[str], str]
    # row digest of a forgotten row -> the retained rows (ids) with the same bytes: another person's row, kept
    kept: dict[str, list[str]] = field(default_factory=dict)

    @property
    def digests(self) -> set[str]:
        return set(self.digest_ids)

    @property
    def n_features(self) -> int:
        return int(self.prepared.X.shape[1]) if self.prepared is not None else -1

    def row_name(self, digest: str) -> str:
        """A forgotten row as a person reads it: its id (keyed like the ledger), else its digest."""
        ids = self.digest_ids.get(digest) or []
        return "/".join(map(repr, ids)) if ids else f"row digest {digest[:12]}"


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)

    def store(self, store: str, path, ids: list[str] = (), rows: list[str] = (), **extra) -> None:
        """One store's check; a forgotten id or raw row left in it is a problem that names the store and them."""
        self.checks.append({"store": store, "path": str(path), "forgotten_ids": len(ids), "forgotten_rows": len(rows),
                            **extra})
        if ids:
            self.problems.append(f"{store} ({path}): {len(ids)} forgotten id(s) remain: {_shown(ids)}")
        if rows:
            self.problems.append(f"{store} ({path}): {len(rows)} forgotten raw row(s) remain: {_shown(rows)}")


def _shown(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def verify_erasure(params: Params, batch: str | None = None, tracker=None) -> tuple[list[str], list[dict]]:
    """Re-check every store; returns (problems, checks). `batch`: only that batch's rows and ids.

    A problem: a forgotten id left in the prepared store or the state manifest, a forgotten raw row (by its
    digest) in a store, a model or an ensemble trained on it, a registry version beyond erasure.keep_versions.
    Rows are judged by identity, not by bytes alone: a forgotten row whose bytes equal a retained row's (a
    duplicate row in the data, another person's) is listed in the checks as `identical_to_retained`, not a
    problem; a store without ids (the DVC cache, MLflow artifacts) fails only when it holds more copies of such
    bytes than the prepared store keeps. Files that only name a forgotten id (the ledger, the tombstones, MLflow
    artifacts and applied request files with plain ids: `id_references`) are listed in the checks, not
    problems: they are the audit trail."""
    scope, out = _scope(params, batch), Findings()
    _check_reports(scope, out)
    _check_tombstones(params, scope, out)
    _check_prepared(params, scope, out)
    _check_state_manifest(params, scope, out)
    _check_ensembles(params, scope, out)
    _check_models(params, scope, out)
    _check_raw_stores(params, scope, out)
    _check_request_files(params, scope, out)
    if tracker is not None and scope.forgotten:
        _check_registry(params, tracker, out)
    return out.problems, out.checks


def _scope(params: Params, batch: str | None) -> Scope:
    from unlearning.ledger import read_ledger

    every = read_ledger(params.path("state_dir") / "ledger.jsonl")
    ledger = [e for e in every if batch is None or e["batch_id"] == batch]
    if batch is not None and not ledger:
        raise UnknownBatch(_unknown_batch(params, batch, every))
    tombstones = read_tombstones(params.path("tombstones"))
    forgotten = {str(e["sample_id"]) for e in ledger}
    if batch is None:  # every erased id, also those of a ledger `unlearn reset` archived (the tombstones stay)
        forgotten |= tombstones
    every_report = [read_json_file(p) for p in sorted(reports_dir(params).glob("*.json"))]
    # a batch whose rows a later pass erased under another name ("recovered") has no report of its own
    reports = [r for r in every_report if batch is None or r.get("batch_id") == batch] or every_report
    digest_ids: dict[str, list[str]] = {}
    for r in reports:
        for d in r.get("row_digests", []):
            digest_ids.setdefault(d, [])
        for d, ids in r.get("row_ids_by_digest", {}).items():
            digest_ids[d] = list(dict.fromkeys(digest_ids.get(d, []) + list(ids)))
    prepared = _prepared_or_none(params)
    key = id_key(params.deletion.hash_sample_ids, prepared.info["name"] if prepared is not None else "")
    scope = Scope(ledger, forgotten, tombstones, reports, digest_ids,
                  set().union(*[set(r.get("cache_id_hashes", [])) for r in reports]), prepared, key)
    scope.kept = _retained_twins(scope)
    return scope


def _unknown_batch(params: Params, batch: str, every: list[dict]) -> str:
    known = list(dict.fromkeys(e["batch_id"] for e in every))
    return (f"batch {batch!r} is not in the ledger {params.path('state_dir') / 'ledger.jsonl'}; "
            + (f"its batches: {known[-10:]}{' (the 10 newest)' if len(known) > 10 else ''}" if known
               else "it holds no batch yet") + " (`unlearn status` lists them)")


def _prepared_or_none(params: Params):
    try:
        return load_prepared(params.path("prepared_dir"))
    except FileNotFoundError:
        return None


def _prepared_rows(scope: Scope) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The prepared store's rows: ([n] digests, [n] id keys, [n] bool: the id is forgotten or tombstoned)."""
    keys = scope.prepared.manifest["sample_id"].map(scope.key).to_numpy(dtype=object)
    gone = np.array([k in scope.forgotten or k in scope.tombstones for k in keys], dtype=bool)
    return digest_list(scope.prepared.X) if scope.digest_ids else [""] * len(keys), keys, gone


def _retained_twins(scope: Scope) -> dict[str, list[str]]:
    """{digest of a forgotten row: the retained rows' ids with the same bytes}: a duplicate row in the data is
    another person's row, kept; its bytes prove nothing about the forgotten one."""
    if scope.prepared is None or not scope.digest_ids:
        return {}
    digests, _, gone = _prepared_rows(scope)
    ids = scope.prepared.manifest["sample_id"].astype(str).to_numpy(dtype=object)
    kept: dict[str, list[str]] = {}
    for d, i, g in zip(digests, ids, gone):
        if not g and d in scope.digest_ids:
            kept.setdefault(d, []).append(i)
    return kept


def _twins(scope: Scope) -> list[dict]:
    return [{"forgotten": scope.row_name(d), "retained": ids[:5], "n_retained": len(ids)}
            for d, ids in sorted(scope.kept.items())]


def _check_reports(scope: Scope, out: Findings) -> None:
    if scope.ledger and not scope.reports:
        out.problems.append("no erasure report in state/erasure/: the erasure never ran (run `unlearn erase`)")
    for r in scope.reports:
        for p in r.get("pending", []):
            out.problems.append(f"batch {r['batch_id']}: erasure pending ({p})")


def _check_tombstones(params: Params, scope: Scope, out: Findings) -> None:
    out.store("tombstones", params.path("tombstones"))
    missing = sorted(scope.forgotten - scope.tombstones)
    if missing:
        out.problems.append(f"tombstones ({params.path('tombstones')}): {len(missing)} forgotten id(s) are not "
                            f"tombstoned: a re-prepare would bring them back: {_shown(list(map(repr, missing)))}")


def _check_prepared(params: Params, scope: Scope, out: Findings) -> None:
    """Forgotten ids left in the prepared store, and forgotten rows by identity: a row with a forgotten row's
    bytes fails only when its own id is forgotten; under a retained id it is that person's row (a twin)."""
    if scope.prepared is None:
        return
    digests, keys, _ = _prepared_rows(scope)
    hit = [k in scope.forgotten for k in keys]
    ids = [repr(k) for k, h in zip(keys, hit) if h]
    rows = [repr(k) for k, h, d in zip(keys, hit, digests) if h and d in scope.digest_ids]
    twins = _twins(scope)
    out.store("prepared store", params.path("prepared_dir"), ids, rows,
              **({"identical_to_retained": twins} if twins else {}))


def _check_state_manifest(params: Params, scope: Scope, out: Findings) -> None:
    path = params.path("state_dir") / "manifest.csv"
    if path.exists():
        keys = read_state_manifest(path)["sample_id"].map(scope.key)
        out.store("state manifest", path, [repr(k) for k in keys if k in scope.forgotten])


def _check_ensembles(params: Params, scope: Scope, out: Findings) -> None:
    folder = params.path("cache_dir") / "ensembles"
    bad = [f.name for f in (sorted(folder.glob("*.pt")) if folder.is_dir() else [])
           if (trained_on(f) is None) or (trained_on(f) & scope.cache_hashes)]
    out.checks.append({"store": "ensemble cache", "path": str(folder), "trained_on_forgotten": len(bad)})
    if bad:
        out.problems.append(f"ensemble cache ({folder}): {len(bad)} file(s) trained on forgotten rows (or on unknown "
                            f"rows): {bad[:5]}")


def _check_models(params: Params, scope: Scope, out: Findings) -> None:
    """models/*.pt and the state's champion: none trained on a tombstoned row (whole-list digests: every batch)."""
    models, state_dir, tomb = params.path("models_dir"), params.path("state_dir"), scope.tombstones
    if scope.forgotten:
        for f in sorted(models.glob("*.pt")) if models.is_dir() else []:
            clean = clean_of_tombstones(load_checkpoint(f).get("extra", {}), tomb)
            out.checks.append({"store": "models", "path": str(f), "trained_on_forgotten": not clean})
            if not clean:
                out.problems.append(f"models ({f}): a checkpoint trained before the last erasure remains")
    if tomb and (state_dir / "champion.json").exists():
        clean = _state_clean(params, tomb)
        out.checks.append({"store": "state model", "path": str(state_dir / "model.pt"),
                           "trained_on_forgotten": not clean})
        if not clean:
            out.problems.append(f"state model ({state_dir / 'model.pt'}): {STATE_HOLDS_ERASED}")


def _check_raw_stores(params: Params, scope: Scope, out: Findings) -> None:
    """The stores without ids (DVC cache and remote, MLflow artifacts): .npy files searched for the forgotten
    rows' bytes. A copy of a retained twin's bytes is allowed as many times as the prepared store keeps it."""
    for store, root in (("DVC cache", _dvc_cache_dir(params)), ("DVC remote", _remote_folder(params)),
                        ("MLflow artifacts", params.path("mlflow_artifacts"))):
        if root is None or not root.is_dir():
            continue
        left, twins = [], 0
        for f in (f for f in root.rglob("*") if f.is_file()):
            extra, same = _rows_beyond_twins(f, scope)
            left += [f"{scope.row_name(d)} in {f.relative_to(root)}" for d in extra]
            twins += same
        out.store(store, root, rows=left, rows_identical_to_retained=twins)


def _rows_beyond_twins(path: Path, scope: Scope) -> tuple[list[str], int]:
    """(digests of forgotten rows in the .npy file at `path` beyond the retained twins' count, one per extra
    copy; how many of its rows are a retained twin's bytes)."""
    from collections import Counter

    if not scope.digest_ids or not npy_rows_found(path, scope.digests, scope.n_features):
        return [], 0
    counts = Counter(d for d in digest_list(np.load(path, mmap_mode="r", allow_pickle=False)) if d in scope.digest_ids)
    extra = [d for d, c in sorted(counts.items()) for _ in range(c - len(scope.kept.get(d, [])))]
    return extra, sum(counts.values()) - len(extra)


def _check_request_files(params: Params, scope: Scope, out: Findings) -> None:
    if not params.deletion.hash_sample_ids:  # plain ids are references (the audit trail)
        out.checks.extend(id_references(params, scope.forgotten))
    else:  # hashed ids promise no plain forgotten id: the kept request files are read and their ids keyed
        for store, folder, files in kept_request_files(params):
            n = sum(plain_forgotten_ids(f, scope.key, scope.forgotten) for f in files)
            out.checks.append({"store": store, "path": str(folder), "forgotten_ids": n, "forgotten_rows": 0})
            if n:
                out.problems.append(f"{store} ({folder}): {n} forgotten id(s) remain in plain text (`unlearn erase` "
                                    f"rewrites them with hashed ids)")
    out.checks.extend(source_table_checks(params, scope.prepared, scope.key, scope.forgotten))
    out.checks.extend(source_folder_checks(params, scope.prepared, scope.key, scope.forgotten))


def _check_registry(params: Params, tracker, out: Findings) -> None:
    champion = read_json_file(params.path("state_dir") / "champion.json").get("model_version")
    versions = tracker.versions(params.tracking.registered_model)
    extra = [v for v in versions if v != str(champion)]
    out.checks.append({"store": "MLflow registry", "uri": tracker.tracking_uri, "versions": versions})
    if len(extra) > params.erasure.keep_versions:
        out.problems.append(f"MLflow registry: {len(extra)} version(s) besides the champion v{champion} remain "
                            f"(erasure.keep_versions = {params.erasure.keep_versions}): {extra[:10]}")
