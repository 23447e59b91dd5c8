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
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tasks import dvc_ops
from tasks.clock import computes
from unlearning.config import Params
from unlearning.data import load_prepared, read_state_manifest
from unlearning.data.store import manifest_csv_bytes, rewrite_without
from unlearning.ensembles import id_hashes, trained_on
from unlearning.erasure import (
    UnknownBatch, add_tombstones, clean_of_tombstones, id_key, is_erased, npy_rows_found, read_tombstones,
    row_digests, state_is_clean, tombstones_digest,
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
    # Fingerprints of the rows, taken while the rows are still in the prepared store.
    prepared = load_prepared(params.path("prepared_dir"))
    hit = prepared.manifest["sample_id"].map(erased).to_numpy(dtype=bool)
    digests = sorted(row_digests(np.asarray(prepared.X)[hit])) if hit.any() else []
    cache_hashes = set(id_hashes(forget_ids or []))
    cache_hashes |= set(id_hashes(prepared.manifest["sample_id"][hit].tolist()))
    path = reports_dir(params) / f"{batch_id}.json"
    old = read_json_file(path) if path.exists() else {}
    run_id = run_id or old.get("run_id")  # a later pass (`unlearn erase`) updates the batch's MLflow run too
    digests = sorted(set(digests) | set(old.get("row_digests", [])))
    cache_hashes |= set(old.get("cache_id_hashes", []))

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
              "row_digests": digests, "cache_id_hashes": sorted(cache_hashes)}
    atomic_write_json(path, report)
    if any(s["store"] == "DVC cache" and s.get("committed") for s in stores):
        dvc_ops.commit(params.root, ["deletion"])  # the report just written is in state/: `dvc status` stays clean
        dvc_ops.gc_workspace(params.root)  # that commit left the deletion stage's previous objects unreferenced
    if tracker is not None and run_id is not None:
        tracker.log_json(run_id, {k: v for k, v in report.items() if k not in ("row_digests", "cache_id_hashes")},
                         "erasure_report.json")
    return report


@computes
def erase_pending(params: Params, tracker=None, champion_version: str | None = None) -> list[dict]:
    """Finish erasures left pending (by `dvc repro`, or a kill between the commit and the erasure): ledger
    ids not yet tombstoned, tombstoned rows still in the prepared store, reports marked pending."""
    from unlearning.ledger import read_ledger

    if in_dvc_stage():
        return []
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
    for path in sorted(reports_dir(params).glob("*.json")):
        rep = read_json_file(path)
        if rep.get("pending"):
            out.append(erase(params, rep["batch_id"], None, salt, champion_version, tracker))
    if not out and _prepared_holds_tombstoned(params):
        out.append(erase(params, "recovered", None, salt, champion_version, tracker))
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


def verify_erasure(params: Params, batch: str | None = None, tracker=None) -> tuple[list[str], list[dict]]:
    """Re-check every store; returns (problems, checks). A problem: a forgotten raw row (by its digest), a
    forgotten id left in the prepared store or the state manifest, a model or an ensemble trained on it, a
    registry version beyond erasure.keep_versions. Files that only name a forgotten id (the ledger, the
    tombstones, MLflow artifacts and applied request files with plain ids: `id_references`) are listed in
    the checks, not problems: they are the audit trail."""
    from unlearning.ledger import read_ledger

    state_dir = params.path("state_dir")
    ledger = [e for e in read_ledger(state_dir / "ledger.jsonl") if batch is None or e["batch_id"] == batch]
    if batch is not None and not ledger:
        known = list(dict.fromkeys(e["batch_id"] for e in read_ledger(state_dir / "ledger.jsonl")))
        raise UnknownBatch(f"batch {batch!r} is not in the ledger {state_dir / 'ledger.jsonl'}; "
                           + (f"its batches: {known[-10:]}{' (the 10 newest)' if len(known) > 10 else ''}" if known
                              else "it holds no batch yet") + " (`unlearn status` lists them)")
    forgotten = {str(e["sample_id"]) for e in ledger}
    tomb = read_tombstones(params.path("tombstones"))
    if batch is None:  # every erased id, also those of a ledger `unlearn reset` archived (the tombstones stay)
        forgotten |= tomb
    reports = [read_json_file(p) for p in sorted(reports_dir(params).glob("*.json"))]
    digests = set().union(*[set(r.get("row_digests", [])) for r in reports]) if reports else set()
    cache_hashes = set().union(*[set(r.get("cache_id_hashes", [])) for r in reports]) if reports else set()
    problems, checks = [], []
    try:
        prepared = load_prepared(params.path("prepared_dir"))
    except FileNotFoundError:
        prepared = None
    salt = prepared.info["name"] if prepared is not None else ""
    key = id_key(params.deletion.hash_sample_ids, salt)
    n_features = int(prepared.X.shape[1]) if prepared is not None else -1
    if ledger and not reports:
        problems.append("no erasure report in state/erasure/: the erasure never ran (run `unlearn erase`)")
    for r in reports:
        for p in r.get("pending", []):
            problems.append(f"batch {r['batch_id']}: erasure pending ({p})")

    def check(store, path, ids=0, rows=0, note=""):
        checks.append({"store": store, "path": str(path), "forgotten_ids": ids, "forgotten_rows": rows})
        if ids:
            problems.append(f"{store} ({path}): {ids} forgotten id(s) remain{note}")
        if rows:
            problems.append(f"{store} ({path}): {rows} forgotten raw row(s) remain{note}")

    check("tombstones", params.path("tombstones"), ids=0)
    missing = forgotten - tomb
    if missing:
        problems.append(f"tombstones ({params.path('tombstones')}): {len(missing)} forgotten id(s) are not "
                        f"tombstoned: a re-prepare would bring them back")
    if prepared is not None:
        ids = int(prepared.manifest["sample_id"].map(lambda s: key(s) in forgotten).sum())
        check("prepared store", params.path("prepared_dir"), ids,
              npy_rows_found(params.path("prepared_dir") / "features.npy", digests, n_features))
    sm = state_dir / "manifest.csv"
    if sm.exists():
        m = read_state_manifest(sm)
        check("state manifest", sm, int(m["sample_id"].map(lambda s: key(s) in forgotten).sum()))
    folder = params.path("cache_dir") / "ensembles"
    bad = [f.name for f in (sorted(folder.glob("*.pt")) if folder.is_dir() else [])
           if (trained_on(f) is None) or (trained_on(f) & cache_hashes)]
    checks.append({"store": "ensemble cache", "path": str(folder), "trained_on_forgotten": len(bad)})
    if bad:
        problems.append(f"ensemble cache ({folder}): {len(bad)} file(s) trained on forgotten rows (or on unknown "
                        f"rows): {bad[:5]}")
    models = params.path("models_dir")
    if forgotten:
        for f in sorted(models.glob("*.pt")) if models.is_dir() else []:
            extra = load_checkpoint(f).get("extra", {})
            clean = clean_of_tombstones(extra, tomb)
            checks.append({"store": "models", "path": str(f), "trained_on_forgotten": not clean})
            if not clean:
                problems.append(f"models ({f}): a checkpoint trained before the last erasure remains")
    if tomb and (state_dir / "champion.json").exists():
        clean = _state_clean(params, tomb)
        checks.append({"store": "state model", "path": str(state_dir / "model.pt"), "trained_on_forgotten": not clean})
        if not clean:
            problems.append(f"state model ({state_dir / 'model.pt'}): {STATE_HOLDS_ERASED}")
    for store, root in (("DVC cache", _dvc_cache_dir(params)), ("DVC remote", _remote_folder(params)),
                        ("MLflow artifacts", params.path("mlflow_artifacts"))):
        if root is None or not root.is_dir():
            continue
        rows = sum(npy_rows_found(f, digests, n_features) for f in root.rglob("*") if f.is_file())
        check(store, root, 0, rows)
    if not params.deletion.hash_sample_ids:  # plain ids are references (the audit trail)
        checks.extend(id_references(params, forgotten))
    else:  # hashed ids promise no plain forgotten id: the kept request files are read and their ids keyed
        for store, folder, files in kept_request_files(params):
            check(store, folder, sum(plain_forgotten_ids(f, key, forgotten) for f in files),
                  note=" in plain text (`unlearn erase` rewrites them with hashed ids)")
    checks.extend(source_table_checks(params, prepared, key, forgotten))
    checks.extend(source_folder_checks(params, prepared, key, forgotten))
    if tracker is not None and forgotten:
        champion = read_json_file(state_dir / "champion.json").get("model_version")
        versions = tracker.versions(params.tracking.registered_model)
        extra = [v for v in versions if v != str(champion)]
        checks.append({"store": "MLflow registry", "uri": tracker.tracking_uri, "versions": versions})
        if len(extra) > params.erasure.keep_versions:
            problems.append(f"MLflow registry: {len(extra)} version(s) besides the champion v{champion} remain "
                            f"(erasure.keep_versions = {params.erasure.keep_versions}): {extra[:10]}")
    return problems, checks
