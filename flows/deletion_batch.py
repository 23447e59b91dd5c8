"""Flow `deletion_batch`: one deletion request file through the whole pipeline (docs/design.md §1).

validate -> partition -> diagnose -> select -> unlearn -> validate against oracles -> gate
-> promote (MLflow alias) -> append to the ledger -> update the manifest.
All or nothing: the new state is written to a staging folder and swapped in only after the gate passed
and the model was registered; any failure leaves the previous model, manifest and ledger standing.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow

from flows.common import (
    base_parser, device_of, params_or_exit, prefect_api, task_runner_for, tracker_for, ui_hint, use_project_path,
)
from flows.common import deletion_run_name
from flows.errors import EXIT_BAD_INPUT, EXIT_GATE_REJECTED, one_line_errors
from flows.intake import reject  # noqa: F401  (one writer of <name>.error.json; tests and flows import it from here)
from tasks import stages as S
from adapters.clock import computes
from adapters.dvc_metrics import write_deletion_metrics
from tasks.lineage import commit_lineage
from tasks.quality import BatchRejected, announce_quality  # a quality refusal is a rejection too
from tasks.reporting import run_logger
from tasks.state import batch_lock, ensure_state, load_state, original_path, stale_unbatched_state
from tasks.training import recipe
from unlearning.config import Params, load_params
from unlearning.history import n_original_train
from unlearning.io import atomic_write_bytes, atomic_write_json, move_unique, open_for_writing, read_json_file
from unlearning.ledger import hash_sample_id
from unlearning.requests import (
    RequestValidationError, file_sha256, in_inbox, leftover_dot_files, read_request_file, scan_inbox,
)
from unlearning.salt import id_salt, keep_copy
from unlearning.selection import check_method_config




class AfterCommitError(RuntimeError):
    """A failure after the batch was committed to state/: the batch IS applied; the message says what is not."""


def _batch_id(request_ids: list[str]) -> str:
    return "batch-" + hashlib.sha256("\n".join(sorted(request_ids)).encode()).hexdigest()[:12]


def run_name(path: Path, when: datetime | None = None) -> str:
    """A name a person can read in the MLflow runs table: the request file and the date (the hash is a tag)."""
    when = when or datetime.now(timezone.utc)
    return f"{path.stem} @ {when.strftime('%Y-%m-%d %H:%M')} UTC"


@computes  # validating the batch is the pipeline's first step (adapters/clock.py: Great Expectations' validation)
def check_file(path: Path, params: Params, state) -> "FileCheck":
    """The one validation path (`unlearn validate` calls the same check_file_for): ledger, structure,
    manifest (the persisted GX suite, with Data Docs), objective, time. Not a task of its own: its verdict
    decides whether a batch (and its MLflow run) opens at all; `stages.validate` logs it to the batch's run."""
    from adapters.request_check import LiveState, check_file_for

    return check_file_for(path, params, LiveState(state.manifest, state.ledger, state.prepared.info))


def process_request_file(path: Path, params: Params, device: str) -> dict:
    """One request file through the pipeline (the diagram in tasks/stages.py), all or nothing."""
    started = time.perf_counter()
    state = load_state(params, device)
    check = check_file(path, params, state)
    if check.status == "already_processed":
        run_logger().info(check.summary())
        return {"file": path.name, "status": "already_processed"}
    pending = check.pending if check.pending is not None else read_request_file(path)
    batch = open_batch(path, params, state, pending, device, started)
    try:
        requests, objective, invalid = S.validate(batch, check, pending, params.deletion.objective)
        if invalid is not None:
            raise invalid
        state, requests, forget_ids = split_requests(batch, params, state, requests, objective)
        if not forget_ids:  # validation rows only: erased, nothing to unlearn, no new model version
            return apply_not_trained_on(batch, params, state, requests, objective)
        rows, report = diagnose_and_partition(batch, params, state, forget_ids, objective)
        licensing = None
        if params.validation.mode == "qualified" and objective == "retrain_equivalence":
            outcome, licensing = qualified_run(batch, params, state, rows, objective, report)
        else:
            outcome = plan_and_run(batch, params, state, rows, objective, report)
        quality = announce_quality(batch, outcome, state, rows, params)  # said out loud; refused if declared
        promoted = S.promote(batch, params, state, requests, objective, outcome, rows,
                             n_original_train(state.manifest, state.ledger), warnings=quality)
        if licensing is not None:
            mark_qualified(batch, params, promoted["version"], outcome.method, licensing)
            if licensing["audit_due"] and outcome.method == licensing["license"]["method"] != "retrain":
                from flows.qualify import audit_after_promotion  # its own flow run; the alias has moved

                promoted = audit_after_promotion(batch, params, state, rows, objective, outcome.method, licensing,
                                                 promoted, requests, device)
        erasure = (S.erase(batch, params, requests["sample_id"].tolist(), id_salt(params), promoted["version"])
                   if params.erasure.enabled else None)
        S.finish(batch, outcome, promoted, erasure)
    except BaseException as e:
        S.fail(batch, e, rejected=isinstance(e, BatchRejected))
        if batch.committed:  # say what was applied and what was not
            raise AfterCommitError(f"{path.name}: batch {batch.batch_id} WAS applied (state/ holds the new model, "
                                   f"manifest and ledger); what failed afterwards is not: {type(e).__name__}: {e}. "
                                   f"The next run reconciles the registry alias and finishes the erasure") from e
        raise
    return {"file": path.name, "status": "applied", "batch_id": batch.batch_id, "method": outcome.method,
            "model_version": promoted["version"], "run_id": batch.parent, "metrics": outcome.tracked_metrics()}


def split_requests(batch: S.BatchRun, params: Params, state, requests, objective: str):
    """(the state the batch computes on, the requests with their kind, the ids to unlearn); logs the batch's
    params. The validation rows a file names are erased, not unlearned (no model trained on them): the state's
    manifest marks them deleted, so the batch's metrics and gate use the other validation rows (tasks/stages.py
    split_by_kind)."""
    state, requests = S.split_by_kind(state, requests, batch.batch_id)
    forget_ids = requests["sample_id"][S.unlearned_mask(requests)].tolist()
    batch.summary.update(n_forgotten=len(forget_ids))
    log_batch_params(batch, params, objective, forget_ids)
    return state, requests, forget_ids


def apply_not_trained_on(batch: S.BatchRun, params: Params, state, requests, objective: str) -> dict:
    """A file of validation rows only: recorded in the ledger and erased; nothing to unlearn, the champion stays."""
    erased_ids = requests["sample_id"].tolist()
    promoted = S.record_not_trained_on(batch, params, state, requests, objective)
    erasure = (S.erase(batch, params, erased_ids, id_salt(params), promoted["version"])
               if params.erasure.enabled else None)
    S.finish_not_trained_on(batch, promoted, erasure, len(erased_ids))
    return {"file": batch.path.name, "status": "applied", "batch_id": batch.batch_id, "method": None,
            "model_version": promoted["version"], "run_id": batch.parent, "metrics": {},
            "erased_not_trained_on": len(erased_ids)}


def plan_and_run(batch: S.BatchRun, params: Params, state, rows, objective: str, report):
    """Select, plan, then train only what the plan needs: each step in order until one is accepted
    (unlearning/plan.py). Raises BatchRejected when none is."""
    from tasks.references import ReferencePool

    n_train = n_original_train(state.manifest, state.ledger)
    batch_index = len(state.champion.get("history", []))
    selection = S.select(batch, params.deletion, params.train.epochs, state, rows, objective, report, None, n_train)
    the_plan = S.plan(batch, params, state, rows, selection, objective)
    pool = ReferencePool(params, state, rows, batch.device, batch_index, the_plan.chunk_size, the_plan.workers)
    if S.needs_noise_floor(selection, params.deletion.weigh_cost):
        # a rule waits for the oracles' noise floor: train the first look's references, then select again
        first = (params.validation.looks or [params.validation.n_oracles])[0]
        _, oracles = pool.ensure(min(first, params.validation.n_shadows), min(first, params.validation.n_oracles))
        selection = S.select(batch, params.deletion, params.train.epochs, state, rows, objective, report, oracles,
                             n_train)
        the_plan = S.plan(batch, params, state, rows, selection, objective)
    outcome, spent = None, 0.0
    try:
        for step in the_plan.steps:
            if step.certificate == "audit":  # oracle 0 is the retrain; the test splits the others in two halves
                others = step.references[1] - 1
                S.warn_if_the_test_cannot_fail(params, others // 2, others - others // 2)
            elif step.looks:
                S.warn_if_the_test_cannot_fail(params, *step.references)
            out = S.unlearn_and_certify(batch, step, params, state, rows, pool, the_plan, objective, batch_index)
            spent += float(out.cost.get("wall_seconds", 0.0))
            if S.accepted(batch, out, params.gate.exact_retrain_overrides):
                outcome = out
                break
    finally:
        S.references_report(batch, params, state, rows, pool)
        S.plan_vs_actual(batch, the_plan, pool, spent)
    if outcome is None:
        raise BatchRejected(f"no candidate passed the gate for {batch.path.name}; the previous champion stays")
    return outcome


def diagnose_and_partition(batch: S.BatchRun, params: Params, state, forget_ids: list[str], objective: str):
    """(rows, report): the leverage partition ranks retain rows by the diagnostics, so they come first there;
    otherwise the partition comes first, and the diagnostics run only when a candidate the plan could try needs
    them (`diagnostics_unused`), saying on the console when they are skipped."""
    def diagnose(skipped: str | None = None):
        return S.diagnose(batch, params.diagnostics, params.train.weight_decay, params.base.seed, params.base.progress,
                          state, forget_ids, params.train.label_smoothing, params.train.epochs,
                          params.deletion.partition.mode == "leverage", skipped=skipped)

    def partition(report):
        return S.partition(batch, params.deletion.partition, state, forget_ids,
                           report.cross_leverage if report is not None else None, str(params.path("prepared_dir")))

    if params.deletion.partition.mode == "leverage":
        report = diagnose()
        return partition(report), report
    rows = partition(None)
    if not wants_diagnostics(params, state, objective):
        return rows, None
    return rows, diagnose(diagnostics_unused(batch, params, state, rows, objective))


def diagnostics_unused(batch: S.BatchRun, params: Params, state, rows, objective: str) -> str | None:
    """Why no candidate this batch could try would use the leverage diagnostics (None: one could). The
    candidates are those the rules pick without them plus every method of a rule that waits for a fact only
    they give (it might fire), and the fallbacks; planned as the batch plans (deletion.weigh_cost drops an
    approximate candidate whose certificate costs more than the retrain, with the batch's own timing probe,
    kept for its plan). Only exact steps left: the diagnostics decide nothing. The qualified mode reads them
    for its licence (wants_diagnostics decides there); a sharded original skips them in S.diagnose;
    diagnostics.record keeps them for every batch's record."""
    if params.diagnostics.record or (params.validation.mode == "qualified" and objective == "retrain_equivalence"):
        return None
    if getattr(state.model, "shard_state", None) is not None:
        return None  # S.diagnose says why it skips them
    from tasks.sharding import sisa_share
    from unlearning.plan import PlanRefused, plan_steps
    from unlearning.policy import FALLBACK, parse_key, select_methods
    from unlearning.selection import batch_facts

    d = params.deletion
    if d.method == "auto":
        facts = batch_facts(d, params.train.epochs, objective, rows, None, device=batch.device)
        sel = select_methods(d.rules, facts)
        waiting = [r.method for r in d.rules
                   if any(facts.get(parse_key(k)[0]) is None for k in r.when)]  # a diagnostics or oracle fact
        possible = [*sel.candidates, *waiting]
    else:
        possible = [d.method]
    possible = list(dict.fromkeys([m for m in [*possible, *d.fallback] if m != FALLBACK] + [FALLBACK]))
    if batch.probe is None:
        from tasks.planning import probe

        batch.probe = probe(params, state, rows, batch.device)  # S.plan reuses it
    try:
        steps, _ = plan_steps(possible, objective, params.validation, params.gate, weigh_cost=d.weigh_cost,
                              explicit=d.method != "auto", member_in_retrains=batch.probe[0].member_in_retrains,
                              sisa_cost=sisa_share(state, rows))
    except PlanRefused:
        return None  # the batch's own plan refuses it, with its one line
    if any(s.certificate not in ("exact", "audit") for s in steps):
        return None
    return (f"the only candidate(s) the plan could try ({', '.join(s.method for s in steps)}) are exact, so no "
            f"selection rule or certificate would read them (candidates considered: {', '.join(possible)})")


def wants_diagnostics(params: Params, state, objective: str) -> bool:
    """The leverage partition needs them; otherwise diagnostics.enabled, except in qualified mode when the
    qualification licenses nothing at any gap: the batch is an exact retrain whatever they predict."""
    if params.deletion.partition.mode == "leverage":
        return True
    if params.diagnostics.enabled and params.validation.mode == "qualified" and objective == "retrain_equivalence":
        from tasks.qualification import diagnostics_decide

        return diagnostics_decide(params, state)
    return params.diagnostics.enabled


def qualified_run(batch: S.BatchRun, params: Params, state, rows, objective: str, report):
    """validation.mode qualified (docs/certificate.md, "Two modes"): the method the model's qualification
    licenses at this batch's predicted gap, judged by the cheap checks alone (no reference model); exact retrain
    when nothing is licensed, the debt is due, or the licensed candidate fails a cheap check. Returns the accepted
    outcome and the licensing (the row, the gap, whether the batch is due an audit); raises BatchRejected when
    even the retrain misses a floor."""
    from tasks.qualification import license_for_batch
    from unlearning.plan import Step
    from unlearning.qualification import EXACT, audit_due

    batch_index = len(state.champion.get("history", []))
    lic, gap, q, debt = license_for_batch(params, state, rows, report, n_original_train(state.manifest, state.ledger))
    a = params.validation.audit
    due = audit_due(a.every, a.probability, params.base.seed, batch_index)
    steps = ([Step(lic.method, "qualified")] if lic.method != EXACT else []) + [Step(EXACT, "exact")]
    licensing = {"license": lic.to_dict(), "gap_to_noise": gap, "noise_unit": q.noise, "audit_due": due,
                 "batch_index": batch_index, "qualification": q.tag()}
    batch.summary.update(
        debt=debt, selection={"candidates": [st.method for st in steps], "fired": [("qualification", lic.reason)],
                              "rule_methods": {"qualification": lic.method}, "skipped": [],
                              "facts": {"predicted_gap_to_noise": gap}},
        plan=[f"validation.mode qualified: predicted gap {gap:.3g} noise units; licensed `{lic.method}` by "
              f"{lic.row.row_id if lic.row else 'no row'}",
              "cheap checks, no reference model: accuracy per split against the original's, membership test of "
              "the forget rows against validation; exact retrain when they fail",
              f"audit: {'due' if due else 'not drawn'} for batch {batch_index} (validation.audit)"])
    batch.tracker.log_json(batch.parent, licensing, "qualification_license.json")
    batch.tracker.set_tags(batch.parent, {"validation_mode": "qualified", "licensed": lic.method,
                                          "qualification_row": lic.row.row_id if lic.row else "none"})
    run_logger().info(f"{batch.path.name}: qualified mode: predicted gap {gap:.3g} noise units; {lic.reason}")
    for step in steps:
        out = S.unlearn_and_certify(batch, step, params, state, rows, None, None, objective, batch_index)
        if S.accepted(batch, out, params.gate.exact_retrain_overrides):
            return out, licensing
    raise BatchRejected(f"no candidate passed the cheap checks for {batch.path.name}; the previous champion stays")


def mark_qualified(batch: S.BatchRun, params: Params, version: str, method: str, licensing: dict) -> None:
    """Tag the promoted version with what promised it: "qualified, not audited" (the licensed method passed the
    cheap checks), or exact retrain (exact by construction, nothing to audit)."""
    row = (licensing["license"].get("row") or {}).get("row_id")
    qualified = method == licensing["license"]["method"] and method != "retrain"
    tags = {"validation_mode": "qualified",
            "qualified": "qualified, not audited" if qualified else "exact retrain",
            "qualification_row": row if qualified and row else "none",
            "audit": ("due" if licensing["audit_due"] else "not drawn") if qualified else "not needed"}
    batch.tracker.set_version_tags(params.tracking.registered_model, version, tags)
    if qualified:  # `unlearn status` lists the qualified versions not audited yet
        from tasks.qualification import append_audit

        append_audit(params, {"kind": "promoted", "batch_id": batch.batch_id, "version": str(version), "method": method,
                              "row": row, "gap_to_noise": licensing["gap_to_noise"], "audit": tags["audit"]})


def open_batch(path: Path, params: Params, state, pending, device: str, started: float) -> S.BatchRun:
    """The batch's MLflow run (named after the request file and date; the hash is a tag) and its summary."""
    batch_id = _batch_id([str(r) for r in pending.get("request_id", [])])
    tracker = tracker_for(params)
    if params.deletion.hash_sample_ids:  # MLflow artifacts, params and tags carry hashed ids only
        salt = id_salt(params)
        tracker.redaction = {s: hash_sample_id(s, salt) for s in state.manifest["sample_id"].astype(str)}
    parent = tracker.start_run(run_name(path), tags={"stage": "deletion_batch", "request_file": path.name,
                                                     "batch_id": batch_id, "dataset": state.prepared.info["name"]})
    summary = {"request_file": path.name, "batch_id": batch_id, "n_forgotten": len(pending),
               "objective": params.deletion.objective, "candidates": [], "selection": {}, "chosen": None,
               "version_before": state.champion.get("model_version"), "version_after": None, "debt": None}
    return S.BatchRun(tracker, parent, path, batch_id, device, summary, started=started)


def log_batch_params(batch: S.BatchRun, params: Params, objective: str, forget_ids: list[str]) -> None:
    batch.tracker.log_params(batch.parent, {
        "objective": objective, "n_forget": len(forget_ids), "batch_id": batch.batch_id,
        "deletion": params.deletion.model_dump(), "validation": params.validation.model_dump(),
        "train": params.train.model_dump(), "seed": params.base.seed, "device": batch.device})


def files_to_process(request_path: str | None, inbox: Path) -> list[Path]:
    """Every inbox file in name order; for a triggered run, the inbox files up to and including its own.

    Name order is arrival order (name request files with a sortable timestamp prefix). A run triggered by
    file c that starts before the run for an earlier file b processes b first, and b's own run then finds
    nothing left to do: batches apply in order, each exactly once, whatever order the runs start in."""
    pending = scan_inbox(inbox)[0]
    if request_path is None:
        return pending
    path = Path(request_path)
    if path.resolve().parent != inbox.resolve():
        return [path]
    # (a file already moved to processed/ or rejected/ by an earlier run, or an entry scan_inbox refused, is
    # not processed again)
    return [p for p in pending if p.name <= path.name]


def processed(path: Path, params: Params) -> Path:
    """Move an applied (or already applied) inbox file to requests/processed/. With deletion.hash_sample_ids
    its sample ids are written in their keyed form (the ledger's), so no forgotten id stays there in plain text;
    under erasure.keep_request_files = N days it keeps them N days from now (its mtime), then a run rewrites it
    (tasks/stores/requests.py expire_request_files)."""
    dest_dir = params.path("processed")
    keep_days = params.erasure.request_file_days()
    keyed = _keyed_request_bytes(path, params) if params.deletion.hash_sample_ids and not keep_days else None
    same = dest_dir / path.name
    if same.is_file() and not path.is_symlink() and file_sha256(same) == (
            hashlib.sha256(keyed).hexdigest() if keyed is not None else file_sha256(path)):
        path.unlink()  # the same file was processed before: keep one copy
        return same
    dest = move_unique(path, dest_dir)
    if keyed is not None:
        atomic_write_bytes(dest, keyed)
    elif keep_days:
        os.utime(dest)  # applied now: its plain ids are kept keep_request_files days from this time
    return dest


def _expire_request_files(params: Params) -> list[str]:
    from tasks.stores.requests import expire_request_files
    from unlearning.erasure import id_key

    if not params.deletion.hash_sample_ids or not params.erasure.request_file_days():
        return []
    return expire_request_files(params, id_key(True, id_salt(params)))


def _keyed_request_bytes(path: Path, params: Params) -> bytes | None:
    from unlearning.erasure import id_key
    from unlearning.requests import redacted_request_bytes

    return redacted_request_bytes(path, id_key(True, id_salt(params)))


def reconcile(params: Params, tracker) -> list[str]:
    """state/ decides: point the registry alias at state/champion.json's version, mark runs of killed batches
    FAILED, tag never-promoted versions, finish pending erasures, and (once rows were erased) purge the
    never-promoted versions the erasure's keep rule does not keep. Idempotent; returns what it changed."""
    notes = []
    champion_file = params.path("state_dir") / "champion.json"
    # StateCorrupt (one line, exit 1) for a truncated file, as everywhere else: json.loads raised a traceback
    version = read_json_file(champion_file).get("model_version") if champion_file.exists() else None
    name, alias = params.tracking.registered_model, params.tracking.alias
    # a batch-less state built from other params follows the retrained original at the next batch (ensure_state):
    # until then the alias stays on that original (`unlearn erase` after `dvc repro train` moved it back)
    if version is not None and not stale_unbatched_state(params):
        before, changed = tracker.reconcile_alias(name, alias, str(version))
        if changed:
            notes.append(f"reconciled {name}@{alias}: v{before} -> v{version} (state/champion.json decides)")
    failed = tracker.fail_stale_runs()
    if failed:
        notes.append(f"marked {len(failed)} run(s) of killed batches FAILED")
    tagged = tracker.tag_unpromoted(name, version)
    if version is not None:  # the salt's copy in the state (a first batch's state, or one with erasure off)
        keep_copy(params, params.path("state_dir"))
    if tagged:
        notes.append(f"tagged never-promoted version(s) {tagged} promoted=false")
    if params.erasure.enabled:
        from tasks.erasure import erase_pending, read_tombstones, versions_to_keep

        done = erase_pending(params, tracker, version)
        if done:
            notes.append(f"finished {len(done)} pending erasure(s)")
        expired = _expire_request_files(params)
        if expired:
            notes.append(f"rewrote {len(expired)} applied request file(s) with hashed ids: their "
                         f"erasure.keep_request_files = {params.erasure.keep_request_files} day(s) are over: {expired}")
        if version is not None and read_tombstones(params.path("tombstones")):
            # a batch that failed after registering its model left a version no erasure ran for: the registry
            # keeps what an erasure keeps (verify-erasure failed on such an orphan until a later batch's erasure)
            keep = versions_to_keep(params, tracker, version)
            orphans = [v for v in tracker.unpromoted_versions(name) if v not in keep]
            if orphans:
                tracker.purge_versions(name, set(tracker.versions(name)) - set(orphans))
                notes.append(f"purged never-promoted version(s) {orphans} (erasure.keep_versions = "
                             f"{params.erasure.keep_versions})")
    return notes


def preflight(params: Params) -> None:
    """Before any state changes: the tracking store, the DVC cache (and a remote folder) must be usable."""
    import os

    from adapters.store_check import state_champion_store_problem
    from adapters.tracking import TrackingUnavailable, preflight as tracking_preflight

    tracking_preflight(params.mlflow_tracking_uri())
    problem, note = state_champion_store_problem(params)
    if problem:
        raise TrackingUnavailable(problem)
    if note:
        run_logger().warning(note)
    api = os.environ.get("PREFECT_API_URL")
    if api:  # a deployment's Prefect server: fail in seconds, not after the client's retries
        import urllib.request

        from adapters.server_auth import prefect_login_problem, prefect_tls

        try:
            urllib.request.urlopen(api.rstrip("/") + "/health", timeout=5, context=prefect_tls()).close()
        except Exception as e:
            raise ConnectionError(f"Prefect API {api} is unreachable ({getattr(e, 'reason', e)}); start it "
                                  f"(`prefect server start`) or unset PREFECT_API_URL; nothing was changed") from None
        problem = prefect_login_problem(api)
        if problem:
            raise ConnectionError(problem)
    root = params.root
    if (root / ".dvc").is_dir():
        cache = root / ".dvc" / "cache"
        remote = params.operations.dvc_remote
        remote_dir = (Path(remote) if Path(remote).is_absolute() else root / remote) if remote else None
        for what, folder in (("DVC cache", cache if cache.exists() else root / ".dvc"),
                             ("DVC remote folder", remote_dir)):
            if folder is not None and folder.exists() and not os.access(folder, os.W_OK):
                raise PermissionError(f"{what} {folder} is not writable: fix its permissions (nothing was changed)")


@flow(name="deletion_batch", flow_run_name=deletion_run_name)  # `deletion <request file>` in the Prefect UI
def deletion_batch(request_path: str | None = None, params_path: str = "params.yaml",
                   overrides: dict | None = None, dvc_commit: bool = False) -> list[dict]:
    """Process one request file, or (without `request_path`) every file in the inbox, in name order.

    Holds the pipeline's batch lock throughout: one batch per model at a time. Deployment runs pass
    `dvc_commit=True` to record the new state in the DVC cache (dvc repro does that itself).
    Inbox files: applied ones move to requests/processed/, rejected ones (validation or gate) to
    requests/rejected/ with <name>.error.json, and the later files proceed. A file outside the inbox is never
    moved; its rejection raises."""
    params = load_params(params_path, overrides)
    check_method_config(params.deletion)
    use_project_path(params)
    device = device_of(params)
    preflight(params)
    log = run_logger()
    state_dir, inbox = params.path("state_dir"), params.path("inbox")
    with batch_lock(params, params.operations.lock_timeout_seconds):
        # A state that holds no batch and was built from other params or data follows the retrained original
        # (ensure_state rewrites only such a state), before the registry alias is reconciled with it.
        if (state_dir / "model.pt").exists() and ensure_state(params, device):
            log.info(f"{state_dir} held no batch and was built from other params or data: it now starts from "
                     f"the retrained {original_path(params)}")
        for note in reconcile_if_started(params):
            log.info(note)
        in_scope = request_path is None or in_inbox(Path(request_path), inbox)
        if in_scope:
            report_leftover_dot_files(inbox)
        results = reject_unreadable_entries(inbox, params) if in_scope else []
        results += [process_inbox_file(f, params, device, inbox) for f in files_to_process(request_path, inbox)]
        created = ensure_state(params, device)  # every file rejected on a first run: the state (a DVC output) exists
        if all(r.get("reason") == "not a request file" for r in results):  # no request file was among them
            log.info(f"no request files in {inbox}; nothing to do"
                     + ("; state initialised from the trained original" if created else ""))
        write_deletion_metrics(params)
        if dvc_commit and params.operations.dvc_commit and any(r["status"] == "applied" for r in results):
            commit_applied(params, results)
    log.info(ui_hint(params, tracker_for(params).batches_url_hint() if results else ""))
    return final_state(results)


def final_state(results: list[dict]):
    """The results, or, when a file was rejected or left in the inbox, a Completed state named so: a deployment
    run shows "Completed with rejections" in the Prefect UI (not a plain green "Completed" an operator would
    pass over), with the files in its message; the caller still gets the results."""
    from prefect.states import Completed

    held = [f"{r['file']} ({r['status']}{': ' + r['reason'] if r.get('reason') else ''})" for r in results
            if r["status"] in ("rejected", "changed")]
    if not held:
        return results
    return Completed(name="Completed with rejections", data=results,
                     message=f"{len(held)} of {len(results)} file(s) not applied: {'; '.join(held)}")


def reconcile_if_started(params: Params) -> list[str]:
    """Reconcile the registry with state/ once anything exists to reconcile (a first run has nothing)."""
    import os

    if ((params.path("state_dir") / "champion.json").exists() or params.path("mlflow_db").exists()
            or os.environ.get("MLFLOW_TRACKING_URI")):
        return reconcile(params, tracker_for(params))
    return []


def report_leftover_dot_files(inbox: Path) -> None:
    """Temporary dot-files left unchanged in the inbox (a writer that never renamed its file): never processed
    nor moved, so each run says so rather than leaving a request there unseen."""
    for entry, age in leftover_dot_files(inbox):
        run_logger().warning(f"{entry.name} in {inbox}: a temporary file left unchanged for {age / 60:.0f} min, "
                             f"never processed: if its writer stopped, rename it (without the leading dot) to "
                             f"drop it, or delete it")


def reject_unreadable_entries(inbox: Path, params: Params) -> list[dict]:
    """Inbox entries that are not request files (unknown suffix, folder, symlink out): moved, with the reason;
    one result each, like a rejected request file (`unlearn run` exits 2 for them too)."""
    results = []
    for entry, why in scan_inbox(inbox)[1]:
        dest = reject(entry, params, why)
        run_logger().warning(f"{entry.name}: {why}; moved to {dest}")
        results.append({"file": entry.name, "status": "rejected", "error": why, "moved_to": str(dest),
                        "reason": "not a request file"})
    return results


def process_inbox_file(f: Path, params: Params, device: str, inbox: Path) -> dict:
    """One file; an inbox file that fails validation or the gate moves to rejected/ and later files proceed.

    An inbox file whose content changed while it was processed (a writer still appending: not an atomic drop)
    is neither moved nor rejected: it stays in the inbox with what was applied of it recorded in the ledger,
    and the next run (the watcher announces it again once it stops changing) applies the rest. A file another
    process still holds open for writing is not read at all (`still_open`)."""
    from_inbox = in_inbox(f, inbox)
    if from_inbox and (writers := open_for_writing(f)):
        return still_open(f, writers)
    before = file_sha256(f) if from_inbox and f.is_file() else None
    try:
        r = process_request_file(f, params, device)
    except (RequestValidationError, BatchRejected) as e:
        if not from_inbox:
            raise
        if changed_since(f, before):
            return still_changing(f, {"file": f.name, "status": "changed", "error": str(e)}, "checked")
        dest = reject(f, params, e)
        run_logger().info(f"{e}\n{f.name}: rejected, moved to {dest} (report {dest.name}.error.json); "
                          f"later files proceed")
        return {"file": f.name, "status": "rejected", "error": str(e), "moved_to": str(dest),
                "reason": "gate" if isinstance(e, BatchRejected) else "validation"}
    if from_inbox:
        if changed_since(f, before):
            return still_changing(f, {**r, "status": "changed", "applied_status": r["status"]}, "processed")
        try:
            r["moved_to"] = str(processed(f, params))
        except OSError as e:  # the batch is in state/ already: not "bad input, nothing changed" (exit 2)
            if r.get("status") != "applied":
                raise
            raise AfterCommitError(f"{f.name}: batch {r.get('batch_id')} WAS applied (state/ holds the new model, "
                                   f"manifest and ledger); NOT done: moving the file to requests/processed/ "
                                   f"({type(e).__name__}: {e}). Fix that folder's permissions; the next run finds the "
                                   f"file processed already, moves it and finishes the erasure") from e
    return r


def changed_since(path: Path, sha256: str | None) -> bool:
    return sha256 is not None and path.is_file() and file_sha256(path) != sha256


def still_open(path: Path, writers: list[int]) -> dict:
    """An inbox file another process still holds open for writing: its last row may be half written (a cut
    reason still parses), and the writer's later rows would follow the file into processed/ unread. Nothing of it
    is applied; it stays in the inbox for the next run."""
    run_logger().warning(f"{path.name} is still open for writing by process(es) {writers}: nothing of it was "
                         f"applied, it stays in {path.parent}; the next run takes it once it is closed (drop files "
                         f"atomically: write a dot-file and rename it)")
    return {"file": path.name, "status": "changed", "reason": f"open for writing by process(es) {writers}",
            "moved_to": None}


def still_changing(path: Path, result: dict, what: str) -> dict:
    """The result for a file that changed while it was being checked or processed: it stays in the inbox."""
    applied = result.get("applied_status") == "applied"
    run_logger().warning(
        f"{path.name} changed while it was {what} (a writer is still appending: drop files atomically, write a "
        f"dot-file and rename it): it stays in {path.parent}; "
        + (f"batch {result.get('batch_id')} applied the rows read (the ledger records them), the next run "
           f"applies the rest" if applied else "nothing of it was applied; the next run checks it again"))
    return {**result, "moved_to": None}


def commit_applied(params: Params, results: list[dict]) -> None:
    """A deployment's run records the new state in DVC; a failure says what was applied and what was not."""
    try:
        run_logger().info(f"lineage: {commit_lineage(params)}")
    except Exception as e:
        applied = [r["file"] for r in results if r["status"] == "applied"]
        raise AfterCommitError(f"batch(es) {applied} WERE applied (state/ holds them); NOT done: the DVC "
                               f"commit/push of state/ ({e}); fix it and run `dvc commit -f deletion`") from e


def run(request_path: str | None = None, params_path: str = "params.yaml", overrides: dict | None = None,
        dvc_commit: bool = False) -> list[dict]:
    """Run the flow with the task runner declared in params.yaml (preflight first: an unreachable store fails in
    seconds, before the flow starts a Prefect server or changes anything)."""
    params = load_params(params_path, overrides)
    preflight(params)
    return deletion_batch.with_options(task_runner=task_runner_for(params))(request_path, params_path, overrides,
                                                                            dvc_commit)


def report_results(results: list[dict]) -> int:
    """One `error:` line on stderr per kind of file not applied, and the exit code of the batch: 2 when a file was
    bad input (or changed while it was processed), 3 when the gate rejected it, else 0. `unlearn run` and the
    DVC stage answer alike, so `dvc repro` fails (and a scheduler sees it) when a file was not applied."""
    rejected = [r for r in results if r["status"] == "rejected"]
    changed = [r["file"] for r in results if r["status"] == "changed"]
    if changed:
        print(f"error: {changed} changed while being processed, or were still open for writing (not dropped "
              f"atomically): they stay in the inbox, with what was applied of them in the ledger; run again once "
              f"they are complete", file=sys.stderr)
    if rejected:
        print(f"error: {len(rejected)} file(s) rejected and moved to requests/rejected/ with an error report: "
              f"{[r['file'] for r in rejected]}", file=sys.stderr)
    if changed or any(r.get("reason") != "gate" for r in rejected):
        return EXIT_BAD_INPUT
    return EXIT_GATE_REJECTED if rejected else 0


def main() -> None:
    """`python -m flows.deletion_batch` (and `python -m flows.warm run flows.deletion_batch` in a DVC stage)."""
    parser = base_parser(__doc__)
    parser.add_argument("request", nargs="?", help="a request file (default: every file in the inbox)")
    a = parser.parse_args()
    params_or_exit(a.params)
    with one_line_errors():  # bad input: exit 2; the gate rejected: 3; after the commit: 1
        # the method names and args before a Prefect server starts, not in a failed task after the oracles trained
        check_method_config(load_params(a.params).deletion)
        with prefect_api():
            code = report_results(run(a.request, a.params))
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
