"""A licensed batch (docs/design.md §4.9; docs/certificate.md, "What a licensed batch does"): the sampled audit
first, then the state with the model unchanged, the erasure, and the batch run that says why (tasks/licensing.py
decides; flows/deletion_batch.py puts the steps in order).

- `licensed_path`: the flow's one call: the licence (tasks/licensing.py licence_batch), then `apply_licensed`.
- `apply_licensed`: a licensed batch drawn for an audit (licensing.audit.probability, seeded by the batch) runs the
  audit first (`audit_licence`: references trained as a batch trains them, then tasks/licensing.py `audit`). A
  failed audit lowers the cut (saved with the map) and returns None: the flow goes on with the exact retrain
  (tasks/batch_settings.py `BatchSettings.exact`). Otherwise `record_licensed` commits the state with the same model (no new model
  version): the manifest marks the rows deleted, the ledger records each row's map epsilon, the cut, the budget and
  "model unchanged (licensed)", the champion's history and the retraining debt count the rows; the rows leave every
  store as in any erasure (erase_batch); `finish_licensed` logs the batch run.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np
import torch

from tasks.licensing import (
    LICENSED_VERDICT, MODEL_UNCHANGED, Licence, audit, audit_due, failing_scores, licence_batch,
)
from tasks.batch_settings import BatchSettings
from tasks.id_key import IdKey
from tasks.memorization_map import save_map
from tasks.reporting import markdown_artifact, run_logger
from unlearning.batch.rows import retained_train_rows, sampled_for_certificate, validation_rows
from unlearning.config import LICENSED_INACTION, Gate
from unlearning.licensing.decision import lowered

if TYPE_CHECKING:
    from tasks.references import ReferenceTraining


def licensed_path(batch, settings: BatchSettings, state, requests, forget_ids: list[str], objective: str, counts):
    """The batch's licensing (tasks/licensing.py licence_batch) and, when licensed, the licensed batch
    (`apply_licensed`). -> (its BatchResult, settings), or (None, the settings the batch goes on with: the exact
    retrain after a failed audit (tasks/batch_settings.py BatchSettings.exact), as they were otherwise)."""
    licence = licence_batch(batch, settings, state, forget_ids, objective)
    if licence is None or not licence.licensed:
        return None, settings
    result = apply_licensed(batch, settings, state, requests, objective, licence, counts.batch_index, counts.n_train)
    return (result, settings) if result is not None else (None, settings.exact())


def audit_licence(batch, training: ReferenceTraining, gate: Gate, state, forget_ids: list[str], batch_index: int):
    """Train the audit's references (tasks/references.py: shadows like the model, oracles without the request's
    rows; validation's sizes) and run `audit` on the certificate's rows, judged by `gate` under criterion epsilon."""
    from tasks.batch import partition_retain
    from tasks.certify import Evaluator
    from tasks.planning import workers_of
    from tasks.references import ReferencePool
    from unlearning.batch.rows import batch_rows
    from unlearning.config import Partition
    from unlearning.planning.plan import CPU_CHUNK

    table = partition_retain(Partition(mode="group"), state.prepared, state.manifest, forget_ids, state.model)
    rows = batch_rows(state.prepared, state.manifest, forget_ids, table)
    v = training.validation
    pool = ReferencePool(training, state, rows, batch.device, batch_index, v.chunk_size or CPU_CHUNK,
                         workers_of(v, batch.device))
    shadows, oracles = pool.ensure(v.n_shadows, v.n_oracles)
    ev = Evaluator(state.prepared, sampled_for_certificate(rows, v.certificate_rows, training.seed), None,
                   batch.device)
    return audit(ev(state.model), ev(shadows), ev(oracles), ev.labels, ev.splits, gate, v, training.seed)


def apply_licensed(batch, settings: BatchSettings, state, requests, objective: str, licence: Licence,
                   batch_index: int, n_train: int):
    """A licensed batch (module docstring, step 2): -> its BatchResult, or None when its audit failed (the cut is
    lowered and saved; the flow goes on to the exact retrain)."""
    from tasks.batch_path import erase_batch
    from unlearning.batch.records import BatchResult

    forget_ids = forget_of(requests)
    log = run_logger()
    gate, paths = settings.gate, settings.paths
    if audit_due(settings.licensing.audit.probability, settings.seed, batch_index):
        result = audit_licence(batch, settings.reference_training, gate, state, forget_ids, batch_index)
        log.info(f"{batch.path.name}: {result.line()}")
        batch.tracker.log_metrics(batch.parent, {"licensing/audit_passed": float(result.passed),
                                                 **{f"licensing/audit_{k}": v for k, v in result.epsilon.items()}})
        licence = replace(licence, audit=result)
        if not result.passed:
            record = licence.record
            cuts = lowered(record.cuts, failing_scores(licence.decision.scores, result.forget_upper,
                                                       gate.epsilon.max))
            audits = [*record.audits, {"batch_id": batch.batch_id, "passed": False, "at": now()}]
            save_map(paths, replace(record, cuts=cuts, audits=audits))
            batch.tracker.set_tags(batch.parent, {"licensing": "audit failed: exact retrain"})
            log.warning(f"{batch.path.name}: the licence's audit failed: the cut comes down to "
                        f"{cuts.for_rows(licence.decision.rows)} for {licence.decision.rows} row(s), and the batch "
                        f"takes the exact retrain")
            return None
        passed = {"batch_id": batch.batch_id, "passed": True, "at": now()}
        save_map(paths, replace(licence.record, audits=[*licence.record.audits, passed]))
    promoted = record_licensed(batch, settings.ids, state, requests, objective, licence, n_train)
    erasure = erase_batch(batch, settings, requests["sample_id"].tolist(), promoted["version"])
    finish_licensed(batch, settings.ids, settings.licensing.audit.probability, licence, promoted, erasure, forget_ids)
    metrics = {"licensing/max_row_epsilon": max(licence.decision.scores), "licensing/cut": licence.decision.cut,
               "licensing/budget": gate.epsilon.max}
    return BatchResult(batch.path.name, "applied", batch.batch_id, LICENSED_INACTION, promoted["version"],
                       batch.parent, metrics)


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def record_licensed(batch, ids: IdKey, state, requests, objective: str, licence: Licence, n_train: int) -> dict:
    """The state after a licensed batch, all or nothing (tasks/stages.py commit_state): the same model, the rows
    marked deleted, a ledger entry per request with its row's map epsilon, the cut, the budget and "model
    unchanged (licensed)", a history point (the debt counts it)."""
    from tasks.stages import commit_state, ledger_entries, marked_deleted
    from unlearning.policy.history import history_point
    from unlearning.privacy.ledger import appended

    version = state.champion.get("model_version")
    stamp = now()
    d = licence.decision
    entries = ledger_entries(requests, batch, ids.hashed, ids.salt(), objective=objective,
                             method=LICENSED_INACTION, before=version, after=version, now=stamp,
                             fingerprint=state.fingerprint["digest"], verdict=LICENSED_VERDICT)
    score_of = dict(zip(ids.ledger_keys(forget_of(requests)), d.scores))
    for e in entries:
        if e["verdict"] == LICENSED_VERDICT:
            e["licence"] = {"map_epsilon": score_of.get(e["sample_id"]), "score": d.score_kind, "cut": d.cut,
                            "budget": d.budget, "model": MODEL_UNCHANGED}
    previous = state.champion.get("history", [])
    point = history_point(previous, batch_id=batch.batch_id, request_file=batch.path.name, method=LICENSED_INACTION,
                          n_forgotten=d.rows, n_train=n_train, validation_accuracy=validation_accuracy(state),
                          output_gap=float("nan"), model_version=version, processed_at=stamp)
    # the champion is the same model: its version, method and batch stay; the history and the counts move on
    champion = {**state.champion, "n_retained_train": int(len(retained_train_rows(state.manifest))) - d.rows,
                "history": [*previous, {**point, "licensed": True}]}
    erased = [str(s) for s in requests["sample_id"]]
    commit_state(batch, ids.paths, state.model, marked_deleted(state.manifest, erased, batch.batch_id),
                 appended(state.ledger, entries), champion, state.fingerprint)
    batch.summary.update(chosen=LICENSED_INACTION, version_after=None)
    run_logger().info(f"{batch.path.name}: licensed: {d.rows} row(s) forgotten with the model unchanged (v{version} "
                      f"stays the champion); ledger +{len(entries)}")
    return {"version": version, "before": version, "history": champion["history"], "n_entries": len(entries)}


def forget_of(requests) -> list[str]:
    """The request's training rows (validation rows it names are erased, not licensed)."""
    if "kind" in requests.columns:
        return [str(s) for s in requests["sample_id"][requests["kind"] == "unlearned"]]
    return [str(s) for s in requests["sample_id"]]


def validation_accuracy(state) -> float:
    """The unchanged champion's accuracy on the validation rows still retained (its history point)."""
    rows = validation_rows(state.manifest)
    if not len(rows):
        return float("nan")
    with torch.no_grad():
        logits = state.model(state.prepared.tensor(rows).to(next(state.model.parameters()).device))[0].cpu()
    return float((logits.argmax(-1).numpy() == state.prepared.label[rows]).mean())


def finish_licensed(batch, ids: IdKey, audit_probability: float, licence: Licence, promoted: dict,
                    erasure: dict | None, forget_ids: list[str]) -> None:
    """The licensed batch run: each row's map epsilon (hashed ids), the cut, the budget, "model unchanged
    (licensed)", the epsilon figure (the request's rows on the map), tags and the summary.
    `audit_probability`: licensing.audit.probability (said when no audit was drawn)."""
    from adapters import plots
    from tasks.stages import publish_summary, wall_seconds
    from unlearning.policy.history import HISTORY_METRICS
    from unlearning.batch.records import Selection

    t, d = batch.tracker, licence.decision
    wall = wall_seconds(batch)
    t.log_metrics(batch.parent, {"wall_seconds": wall, "n_forgotten": d.rows, "licensing/cut": d.cut,
                                 "licensing/budget": d.budget, "licensing/max_row_epsilon": max(d.scores),
                                 "licensing/class_share": d.class_share, "licensing/adjacent_share": d.adjacent_share})
    t.log_series(batch.parent, promoted["history"], HISTORY_METRICS)
    t.log_json(batch.parent, {key: {"map_epsilon": s, "cut": d.cut, "budget": d.budget, "model": MODEL_UNCHANGED}
                              for key, s in zip(ids.ledger_keys(forget_ids), d.scores)}, "licensed_rows.json")
    record = licence.record
    fig = plots.memorization_map(record.map.upper, d.budget, d.cut,
                                 f"licensed: {d.rows} row(s) under the cut; model unchanged (v{promoted['version']})",
                                 request=np.asarray(d.scores))
    t.log_figure(batch.parent, fig, "licence_epsilon.png")
    plots.close(fig)
    t.set_tags(batch.parent, {"method": LICENSED_INACTION, "gate": MODEL_UNCHANGED,
                              "model_version": str(promoted["version"]), "licensing": "licensed"})
    audit_line = licence.audit.line() if licence.audit is not None else "audit: not drawn for this batch " \
        f"(licensing.audit.probability = {audit_probability:g})"
    batch.summary.update(selection=Selection([LICENSED_INACTION], [("licensing", d.line())],
                                             rule_methods={"licensing": LICENSED_INACTION}),
                         plan=[d.line(), licence.map_line, audit_line])
    publish_summary(batch, status=f"applied: {MODEL_UNCHANGED}", erasure=erasure)
    t.end_run(batch.parent, seconds=wall)
    markdown_artifact(f"### Licensed: `{batch.path.name}`\n\n- {d.line()}\n- {licence.map_line}\n- {audit_line}",
                      key=batch.key("licence"), description=f"licence of {batch.path.name}")
