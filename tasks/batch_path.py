"""The deletion batch's path from an open batch to its accepted outcome (docs/design.md §1, §4.5-§4.6): the
batch's MLflow run (`open_batch`), the requests split by kind, the diagnostics and the partition, then the
candidates: the plan's steps in order (`plan_and_run`) or, in qualified mode, the method the model's
qualification licenses (`qualified_run`, docs/certificate.md "Two modes"). flows/deletion_batch.py puts these
steps in order around the stages of tasks/stages.py."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from adapters import clock
from adapters.clock import computes
from tasks import stages as S
from tasks.quality import BatchRejected
from tasks.reporting import run_logger
from tasks.batch_settings import BatchSettings, DiagnosticsSettings
from unlearning.config import Deletion, Params, ProjectPaths, Tracking, Validation
from unlearning.policy.history import n_original_train
from unlearning.privacy.ledger import hash_sample_id
from unlearning.batch.records import BatchResult

if TYPE_CHECKING:
    from adapters.request_check import FileCheck


@dataclass(frozen=True)
class BatchCounts:
    """What a batch reads of the state it computes on, counted once: `n_train`, the original training set's size
    (unlearning/policy/history.py n_original_train: the retraining debt's denominator, in the selection, the licence
    and the promotion), and `batch_index`, this batch's place in the champion's history (the references' and the
    audit's seed stream, unlearning/seeds.py)."""
    n_train: int
    batch_index: int

    @classmethod
    def of(cls, state) -> "BatchCounts":
        return cls(n_original_train(state.manifest, state.ledger), len(state.champion.get("history", [])))


def qualified_mode(validation: Validation, objective: str) -> bool:
    """validation.mode qualified applies to retrain equivalence only (docs/certificate.md, "Two modes")."""
    return validation.mode == "qualified" and objective == "retrain_equivalence"


@computes  # validating the batch is the pipeline's first step (adapters/clock.py: Great Expectations' validation)
@clock.phase("validation")
def check_file(path: Path, params: Params, state) -> "FileCheck":
    """The one validation path (`unlearn validate` calls the same check_file_for): ledger, structure,
    manifest (the persisted GX suite, with Data Docs), objective, time. Not a task of its own: its verdict
    decides whether a batch (and its MLflow run) opens at all; `stages.validate` logs it to the batch's run."""
    from adapters.request_check import LiveState, check_file_for

    return check_file_for(path, params, LiveState(state.manifest, state.ledger, state.prepared.info))


def open_batch(path: Path, settings: BatchSettings, tracker, state, pending, device: str,
               started: float) -> S.BatchRun:
    """The batch's MLflow run on `tracker` (adapters/tracker.py tracker_for: named after the request file and
    date; the hash is a tag) and its summary."""
    batch_id = _batch_id([str(r) for r in pending.get("request_id", [])])
    if settings.ids.hashed:  # MLflow artifacts, params and tags carry hashed ids only
        salt = settings.ids.salt()
        tracker.redaction = {s: hash_sample_id(s, salt) for s in state.manifest["sample_id"].astype(str)}
    parent = tracker.start_run(run_name(path), tags={"stage": "deletion_batch", "request_file": path.name,
                                                     "batch_id": batch_id, "dataset": state.prepared.info["name"]})
    summary = {"request_file": path.name, "batch_id": batch_id, "n_forgotten": len(pending),
               "objective": settings.deletion.objective, "candidates": [], "selection": {}, "chosen": None,
               "version_before": state.champion.get("model_version"), "version_after": None, "debt": None}
    return S.BatchRun(tracker, parent, path, batch_id, device, summary, started=started)


def _batch_id(request_ids: list[str]) -> str:
    return "batch-" + hashlib.sha256("\n".join(sorted(request_ids)).encode()).hexdigest()[:12]


def run_name(path: Path, when: datetime | None = None) -> str:
    """A name a person can read in the MLflow runs table: the request file and the date (the hash is a tag)."""
    when = when or datetime.now(timezone.utc)
    return f"{path.stem} @ {when.strftime('%Y-%m-%d %H:%M')} UTC"


def split_requests(batch: S.BatchRun, settings: BatchSettings, state, requests, objective: str):
    """(the state the batch computes on, the requests with their kind, the ids to unlearn); logs the batch's
    params. The validation rows a file names are erased, not unlearned (no model trained on them): the state's
    manifest marks them deleted, so the batch's metrics and gate use the other validation rows (tasks/stages.py
    split_by_kind)."""
    state, requests = S.split_by_kind(state, requests, batch.batch_id)
    forget_ids = requests["sample_id"][S.unlearned_mask(requests)].tolist()
    batch.summary.update(n_forgotten=len(forget_ids))
    log_batch_params(batch, settings, objective, forget_ids)
    return state, requests, forget_ids


def log_batch_params(batch: S.BatchRun, settings: BatchSettings, objective: str, forget_ids: list[str]) -> None:
    batch.tracker.log_params(batch.parent, {
        "objective": objective, "n_forget": len(forget_ids), "batch_id": batch.batch_id,
        "deletion": settings.deletion.model_dump(), "validation": settings.validation.model_dump(),
        "train": settings.train.model_dump(), "seed": settings.seed, "device": batch.device})


def apply_not_trained_on(batch: S.BatchRun, settings: BatchSettings, state, requests, objective: str) -> BatchResult:
    """A file of validation rows only: recorded in the ledger and erased; nothing to unlearn, the champion stays."""
    erased_ids = requests["sample_id"].tolist()
    promoted = S.record_not_trained_on(batch, settings.ids, state, requests, objective)
    erasure = erase_batch(batch, settings, erased_ids, promoted.version)
    S.finish_not_trained_on(batch, promoted, erasure, len(erased_ids))
    return BatchResult(batch.path.name, "applied", batch.batch_id, None, promoted.version, batch.parent, {},
                       erased_not_trained_on=len(erased_ids))


def erase_batch(batch: S.BatchRun, settings: BatchSettings, erased_ids: list[str], version) -> dict | None:
    """The erasure of the batch's ids from every store (tasks/erasure.py), when erasure.enabled."""
    if not settings.erasure.enabled:
        return None
    return S.erase(batch, settings.erasing, erased_ids, settings.ids.salt(), version)


@dataclass(frozen=True)
class Diagnosed:
    """The batch's rows (partitioned), its leverage diagnostics (None: skipped) and, when they were skipped, the
    selection already made without them (`made`: (selection, debt, the debt's reasons), tasks/stages.py
    selection_of): the batch's one walk of the rules, which `plan_and_run` logs rather than walks again."""

    rows: object
    report: object = None
    made: tuple | None = None


def diagnose_and_partition(batch: S.BatchRun, settings: BatchSettings, state, forget_ids: list[str], objective: str,
                           counts: BatchCounts) -> Diagnosed:
    """The leverage partition ranks retain rows by the diagnostics, so they come first there; otherwise the
    partition comes first, and the diagnostics run only when a candidate the batch's selection could try needs
    them (`diagnostics_unused`), saying on the console when they are skipped."""
    s, train = settings, settings.train

    def diagnose(skipped: str | None = None):
        return S.diagnose(batch, s.diagnostics, train.weight_decay, s.seed, s.progress, state, forget_ids,
                          train.label_smoothing, train.epochs, s.deletion.partition.mode == "leverage", skipped=skipped)

    def partition(report):
        return S.partition(batch, s.deletion.partition, state, forget_ids,
                           report.cross_leverage if report is not None else None, str(s.paths.path("prepared_dir")))

    if s.deletion.partition.mode == "leverage":
        report = diagnose()
        return Diagnosed(partition(report), report)
    rows = partition(None)
    if not wants_diagnostics(s.diagnostics_settings, state, objective):
        return Diagnosed(rows)
    if diagnostics_read(s.diagnostics_settings, state, objective):
        return Diagnosed(rows, diagnose())
    made = S.selection_of(batch.device, s.deletion, train.epochs, state, rows, objective, None, None, counts.n_train)
    why = diagnostics_unused(batch, s, state, rows, objective, made[0])
    return Diagnosed(rows, diagnose(why), made if why else None)


def wants_diagnostics(settings: DiagnosticsSettings, state, objective: str) -> bool:
    """The leverage partition needs them; otherwise diagnostics.enabled, except in qualified mode when the
    qualification licenses nothing at any gap: the batch is an exact retrain whatever they predict."""
    if settings.partition_mode == "leverage":
        return True
    if settings.diagnostics.enabled and qualified_mode(settings.validation, objective):
        from tasks.qualification import diagnostics_decide

        return diagnostics_decide(settings.validation, settings.paths, state)
    return settings.diagnostics.enabled


def diagnostics_read(settings: DiagnosticsSettings, state, objective: str) -> bool:
    """Whether the diagnostics are kept whatever the candidates: diagnostics.record keeps them for every batch's
    record, the qualified mode reads them for its licence (wants_diagnostics decides there); a sharded original
    skips them in S.diagnose, which says why."""
    return (settings.diagnostics.record or qualified_mode(settings.validation, objective)
            or getattr(state.model, "shard_state", None) is not None)


def diagnostics_unused(batch: S.BatchRun, settings: BatchSettings, state, rows, objective: str,
                       selection) -> str | None:
    """Why no candidate this batch could try would use the leverage diagnostics (None: one could). The candidates
    are the batch's `selection` (unlearning/batch/records.py Selection: the rules walked over the facts the batch has
    without the diagnostics, the fallbacks, the debt's override), plus, while it walks the rules, the method of
    each rule that waits for a fact it lacks (it might fire once they are computed); planned as the batch plans
    (deletion.weigh_cost drops an approximate candidate whose certificate costs more than the retrain, with the
    batch's own timing probe, kept for its plan). Only exact steps left: the diagnostics decide nothing."""
    if diagnostics_read(settings.diagnostics_settings, state, objective):
        return None
    from tasks.sharding import sisa_share
    from unlearning.config import CertificateKind
    from unlearning.planning.plan import PlanRefused, plan_steps
    from unlearning.policy.selection_policy import FALLBACK, parse_key

    d = settings.deletion
    waiting = [] if selection.debt_reasons or not d.walks_rules else [
        r.method for r in d.rules if any(selection.facts.get(parse_key(k)[0]) is None for k in r.when)]
    possible = list(dict.fromkeys([m for m in [*selection.candidates, *waiting] if m != FALLBACK] + [FALLBACK]))
    if batch.probe is None:
        from tasks.planning import probe

        batch.probe = probe(settings.probe_inputs, state, rows, batch.device)  # S.plan reuses it
    try:
        steps, _ = plan_steps(possible, objective, settings.validation, settings.gate, weigh_cost=d.weigh_cost,
                              explicit=selection.explicit, member_in_retrains=batch.probe[0].member_in_retrains,
                              sisa_cost=sisa_share(state, rows))
    except PlanRefused:
        return None  # the batch's own plan refuses it, with its one line
    if any(s.certificate not in (CertificateKind.EXACT, CertificateKind.AUDIT) for s in steps):
        return None
    return (f"the only candidate(s) the plan could try ({', '.join(s.method for s in steps)}) are exact, so no "
            f"selection rule or certificate would read them (candidates considered: {', '.join(possible)})")


def plan_and_run(batch: S.BatchRun, settings: BatchSettings, state, diagnosed: Diagnosed, objective: str,
                 counts: BatchCounts):
    """Select (the walk `diagnose_and_partition` made, when it skipped the diagnostics), plan, then train only what
    the plan needs: each step in order until one is accepted (unlearning/planning/plan.py). Raises BatchRejected when none
    is."""
    from tasks.references import ReferencePool
    from unlearning.config import CertificateKind

    rows, report, gate, v = diagnosed.rows, diagnosed.report, settings.gate, settings.validation
    n_train, batch_index, epochs = counts.n_train, counts.batch_index, settings.train.epochs
    selection = S.select(batch, settings.deletion, epochs, state, rows, objective, report, None, n_train,
                         made=diagnosed.made)
    the_plan = S.plan(batch, settings, state, rows, selection, objective)
    pool = ReferencePool(settings.reference_training, state, rows, batch.device, batch_index, the_plan.chunk_size,
                         the_plan.workers)
    if S.needs_noise_floor(selection, settings.deletion.weigh_cost):
        # a rule waits for the oracles' noise floor: train the first look's references, then select again
        first = (v.looks or [v.n_oracles])[0]
        _, oracles = pool.ensure(min(first, v.n_shadows), min(first, v.n_oracles))
        selection = S.select(batch, settings.deletion, epochs, state, rows, objective, report, oracles, n_train)
        the_plan = S.plan(batch, settings, state, rows, selection, objective)
    outcome = None
    try:
        for step in the_plan.steps:
            if step.certificate == CertificateKind.AUDIT:  # oracle 0 is the retrain; the test splits the others
                others = step.references[1] - 1
                S.warn_if_the_test_cannot_fail(gate, others // 2, others - others // 2)
            elif step.looks:
                S.warn_if_the_test_cannot_fail(gate, *step.references)
            out = S.unlearn_and_certify(batch, step, settings.step_inputs, state, rows, pool, the_plan, objective,
                                        batch_index)
            if S.accepted(batch, out, gate.exact_retrain_overrides):
                outcome = out
                break
    finally:
        S.references_report(batch, settings.seed, settings.train, state, rows, pool)
    if outcome is None:
        raise BatchRejected(f"no candidate passed the gate for {batch.path.name}; the previous champion stays")
    return outcome


def qualified_run(batch: S.BatchRun, settings: BatchSettings, state, rows, objective: str, report,
                  counts: BatchCounts):
    """validation.mode qualified (docs/certificate.md, "Two modes"): the method the model's qualification
    licenses at this batch's predicted gap, judged by the cheap checks alone (no reference model); exact retrain
    when nothing is licensed, the debt is due, or the licensed candidate fails a cheap check. Returns the accepted
    outcome and the licensing (the row, the gap, whether the batch is due an audit); raises BatchRejected when
    even the retrain misses a floor."""
    from tasks.qualification import license_for_batch
    from unlearning.config import CertificateKind
    from unlearning.planning.plan import Step
    from unlearning.certificate.qualification import EXACT, audit_due
    from unlearning.batch.records import Licensing, Selection

    warn_method_ignored(batch, settings.deletion)
    batch_index = counts.batch_index
    lic, gap, q, debt = license_for_batch(settings.validation, settings.deletion.debt, settings.paths, state, rows,
                                          report, counts.n_train)
    a = settings.validation.audit
    due = audit_due(a.every, a.probability, settings.seed, batch_index)
    steps = ([Step(lic.method, CertificateKind.QUALIFIED)] if lic.method != EXACT else []) + [
        Step(EXACT, CertificateKind.EXACT)]
    licensing = Licensing(lic, gap, q.noise, due, batch_index, q.tag())
    batch.summary.update(
        debt=debt, selection=Selection([st.method for st in steps], [("qualification", lic.reason)],
                                       facts={"predicted_gap_to_noise": gap},
                                       rule_methods={"qualification": lic.method}),
        plan=[f"validation.mode qualified: predicted gap {gap:.3g} noise units; licensed `{lic.method}` by "
              f"{lic.row.row_id if lic.row else 'no row'}",
              "cheap checks, no reference model: accuracy per split against the original's, membership test of "
              "the forget rows against validation; exact retrain when they fail",
              f"audit: {'due' if due else 'not drawn'} for batch {batch_index} (validation.audit)"])
    batch.tracker.log_json(batch.parent, licensing.to_dict(), "qualification_license.json")
    batch.tracker.set_tags(batch.parent, {"validation_mode": "qualified", "licensed": lic.method,
                                          "qualification_row": lic.row.row_id if lic.row else "none"})
    run_logger().info(f"{batch.path.name}: qualified mode: predicted gap {gap:.3g} noise units; {lic.reason}")
    for step in steps:
        out = S.unlearn_and_certify(batch, step, settings.step_inputs, state, rows, None, None, objective, batch_index)
        if S.accepted(batch, out, settings.gate.exact_retrain_overrides):
            return out, licensing
    raise BatchRejected(f"no candidate passed the cheap checks for {batch.path.name}; the previous champion stays")


def warn_method_ignored(batch: S.BatchRun, deletion: Deletion) -> None:
    """Qualified mode runs the method the qualification licenses (else the exact retrain): a deletion.method
    other than `auto` is not run, and the batch says so rather than leaving it unread in silence."""
    method = deletion.method
    if not deletion.walks_rules:
        run_logger().warning(f"{batch.path.name}: deletion.method = {method!r} is ignored in qualified mode "
                             f"(validation.mode qualified): the qualification's license decides the method (the "
                             f"exact retrain when it licenses none); set deletion.method: auto to silence this")


def mark_qualified(batch: S.BatchRun, tracking: Tracking, paths: ProjectPaths, version: str, method: str,
                   licensing) -> None:
    """Tag the promoted version with what promised it (`licensing`: unlearning/batch/records.py Licensing): "qualified,
    not audited" (the licensed method passed the cheap checks), or exact retrain (exact by construction, nothing
    to audit)."""
    row = licensing.license.row.row_id if licensing.license.row else None
    qualified = licensing.qualifies(method)
    tags = {"validation_mode": "qualified",
            "qualified": "qualified, not audited" if qualified else "exact retrain",
            "qualification_row": row if qualified and row else "none",
            "audit": ("due" if licensing.audit_due else "not drawn") if qualified else "not needed"}
    batch.tracker.set_version_tags(tracking.registered_model, version, tags)
    if qualified:  # `unlearn status` lists the qualified versions not audited yet
        from tasks.qualification import append_audit

        append_audit(paths, {"kind": "promoted", "batch_id": batch.batch_id, "version": str(version),
                                            "method": method, "row": row, "gap_to_noise": licensing.gap_to_noise,
                                            "audit": tags["audit"]})
