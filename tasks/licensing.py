"""Licensed inaction in a deletion batch (docs/design.md §4.9; docs/certificate.md, "Licensed inaction"): whether a
request leaves the model unchanged, the audit that checks a sample of licences, and the licensed batch's record.

The path, in the flow's order (flows/deletion_batch.py):
1. `licence_batch`: the model version's memorization map (tasks/memorization_map.py: reused, or built where the
   planner finds it affordable), then the request's decision (unlearning/licensing.py decide): every row under
   the cut for its size, not a class, not a cluster, within the licensing debt. Logged on the batch run either way.
2. `apply_licensed`: a licensed batch drawn for an audit (licensing.audit.probability, seeded by the batch) runs
   `audit` first: the gate, under its epsilon criterion at gate.epsilon.max, of the unchanged model against
   fresh oracles. A failed audit lowers the cut (saved with the map) and the batch takes the exact path in the
   same run (`exact_after_failed_audit`). Otherwise the batch is recorded with the model unchanged (no new model
   version): the manifest marks its rows deleted, the ledger records each row's map epsilon, the cut, the budget
   and "model unchanged (licensed)", the champion's history and the retraining debt count the licensed rows, and
   the rows leave every store as in any erasure (erase_batch).

`audit` is the one call of the certificate on this path (and in bench/stream.py): it runs the sequential looks of
unlearning/sequential.py over the core's certificate metrics (unlearning/certificate.py) and judge (LookJudge).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np
import torch

from tasks.memorization_map import (
    MapRecord, epsilon_gate, ledger_keys, map_for_state, map_plan, save_map, stored_map,
)
from tasks.reporting import markdown_artifact, run_logger
from unlearning.batch import BatchRows, retained_train_rows, sampled_for_certificate, validation_rows
from unlearning.certificate import retrain_equivalence_metrics
from unlearning.config import LICENSED_INACTION, Params
from unlearning.history import LICENSED
from unlearning.licensing import Guards, LicenceDecision, adjacent_share, decide, lowered, nearest_rows
from unlearning.sequential import LookJudge, look_gate

LICENSED_VERDICT = LICENSED  # the ledger verdict of a licensed row: the model unchanged
MODEL_UNCHANGED = "model unchanged (licensed)"


# --- the audit: the one call of the certificate on this path -----------------------------------------------------

@dataclass(frozen=True)
class AuditResult:
    """What an audit of a licensed request found: passed, at which look, with how many references, the failing
    checks, the forget rows' epsilon upper bounds at that look (in the forget rows' order), the split
    statistics (`epsilon/`, `epsilon_upper/` ...)."""

    passed: bool
    look: int
    looks: int
    references: int
    failures: tuple[str, ...]
    forget_upper: tuple[float, ...]
    epsilon: dict
    seconds: float

    def line(self) -> str:
        what = "passed" if self.passed else "FAILED (" + "; ".join(self.failures[:3]) + ")"
        return (f"audit of the licence: {what} at look {self.look}/{self.looks} with {self.references} references "
                f"[{self.seconds:.1f} s]")


def audit(candidate_logits, shadow_logits, oracle_logits, labels, splits, gate, validation, seed: int
          ) -> AuditResult:
    """The certificate of the unchanged model (doing nothing) against fresh oracles: the sequential step's looks
    (validation's references per role, alpha per look) over the given members' logits, each look's metrics from
    unlearning/certificate.py judged by unlearning/sequential.py LookJudge, under gate.criterion epsilon at
    gate.epsilon.max (a licence promises the budget). candidate_logits [1, n, C]: the production model;
    shadow_logits [N_s, n, C]: models trained like it (doing nothing leaves them as they are);
    oracle_logits [N_o, n, C]: retrains without the request's rows; splits [n]: forget/adjacent/remote/validation."""
    t0 = time.perf_counter()
    g = epsilon_gate(gate)
    from unlearning.plan import sequential_step

    step = sequential_step(LICENSED_INACTION, validation, g, 1.0)
    splits = np.asarray(splits)
    for k, ((n_s, n_o), alpha, perms) in enumerate(zip(step.looks, step.alphas, step.permutations)):
        metrics, extra = retrain_equivalence_metrics(candidate_logits, shadow_logits[:n_s], oracle_logits[:n_o],
                                                     oracle_logits[:n_o], labels, splits, n_permutations=perms,
                                                     seed=seed, epsilon=g.epsilon, confidence=1 - alpha)
        metrics["candidate_is_retrain"] = 0.0  # the unchanged model is not an exact retrain
        final = k == len(step.looks) - 1
        judge = LookJudge(look_gate(g, alpha, perms), "retrain_equivalence", alpha, final, k)
        verdict = judge(metrics)
        if judge.decision != "continue":
            break
    rows = extra["epsilon_rows"]
    forget_upper = tuple(float(x) for x in rows.upper[splits == "forget"]) if rows is not None else ()
    return AuditResult(bool(verdict.passed), k + 1, len(step.looks), int(n_s + n_o), tuple(verdict.failures),
                       forget_upper, {key: float(v) for key, v in metrics.items() if key.startswith("epsilon")},
                       time.perf_counter() - t0)


def audit_due(probability: float, seed: int, batch_index: int) -> bool:
    """Whether this licensed batch is audited: a draw with `probability` from the batch's own seeded stream."""
    if probability <= 0:
        return False
    return bool(np.random.default_rng([int(seed), 51, int(batch_index)]).random() < probability)


def failing_scores(scores, forget_upper, budget: float) -> list[float]:
    """The map scores of the rows a failed audit blames: those whose audit upper bound exceeds the budget, or
    every row of the request when no row alone does (a split other than forget failed)."""
    s = np.asarray(scores, dtype=float)
    up = np.asarray(forget_upper, dtype=float)
    blamed = s[up > budget] if up.size == s.size else s[:0]
    return (blamed if blamed.size else s).tolist()


# --- the decision for a request ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Licence:
    """A batch's licensing: the decision, the map it read (None: none), and, once `apply_licensed` ran it, the
    audit."""

    decision: LicenceDecision
    record: MapRecord | None
    map_line: str
    audit: AuditResult | None = None

    @property
    def licensed(self) -> bool:
        return self.decision.licensed


def applies(params: Params, state, objective: str) -> str | None:
    """Why licensing does not apply to this batch (None: it does): licensing off, suppression (a licence answers
    retrain equivalence only), a sharded original (sisa is exact for a share of a retrain already)."""
    if not params.licensing.enabled:
        return "licensing.enabled is false"
    if objective != "retrain_equivalence":
        return f"objective {objective}: a licence answers retrain_equivalence only"
    if getattr(state.model, "shard_state", None) is not None:
        return "a sharded original: its exact deletions cost a share of a retrain already"
    return None


def licensing_debt_rows(ledger: list[dict]) -> int:
    """Rows licensed since the last exact retrain (unlearning/history.py retraining_debt)."""
    from unlearning.history import retraining_debt

    return int(retraining_debt(ledger, 1)["licensed_since_retrain"])


def guards_of(params: Params) -> Guards:
    lic = params.licensing
    return Guards(lic.max_class_share, lic.max_adjacent_share, lic.max_debt_rows)


def cluster_share(params: Params, state, forget_positions: np.ndarray, train_positions: np.ndarray,
                  device: str = "cpu") -> float:
    """The request's adjacent share: how many of its rows have another of its rows among their
    licensing.k_neighbors nearest retained training rows, in the production model's penultimate features."""
    if len(forget_positions) < 2:
        return 0.0
    X = state.prepared.tensor(train_positions)
    model = state.model.to(device)
    with torch.no_grad():
        feats = torch.cat([model.features(X[i:i + 8192].to(device))[0].cpu() for i in range(0, len(X), 8192)])
    where = {int(p): i for i, p in enumerate(train_positions)}
    q = np.array([where[int(p)] for p in forget_positions])
    return adjacent_share(q, nearest_rows(feats[q].numpy(), feats.numpy(), q, params.licensing.k_neighbors))


def registry_reasons(params: Params, state, forget_ids: list[str]) -> list[str]:
    """What only a new model version could drop: a class name or a table category that only these rows (and
    erased ones) hold stays in the registered champion while the model is unchanged."""
    from tasks.stages import names_after_erasure, preparation_after_erasure

    out = []
    prepared = state.prepared
    if names_after_erasure(params, prepared, forget_ids) != names_after_erasure(params, prepared, []):
        out.append("its rows hold the last rows of a class the registered model names: a new version drops the name")
    if preparation_after_erasure(params, prepared, forget_ids) != preparation_after_erasure(params, prepared, []):
        out.append("its rows hold the only values of a table category the registered model's preparation names")
    return out


def request_decision(params: Params, state, record: MapRecord | None, forget_ids: list[str], device: str = "cpu"
                     ) -> LicenceDecision:
    """The licence of `forget_ids` on this state (unlearning/licensing.py decide), with the registry's reasons."""
    prepared, lic = state.prepared, params.licensing
    train = retained_train_rows(state.manifest)
    pos = prepared.rows(forget_ids)
    keys = ledger_keys(params, forget_ids)
    scores = record.scores(keys, lic.score) if record is not None else np.full(len(keys), np.nan)
    # without a map nothing is licensed: the neighbours' forward pass is not worth running
    adjacent = cluster_share(params, state, pos, train, device) if record is not None else 0.0
    d = decide(scores, record.cuts if record is not None else None, params.gate.epsilon.max, prepared.label[pos],
               prepared.label[train], adjacent, guards_of(params), licensing_debt_rows(state.ledger), lic.score)
    extra = registry_reasons(params, state, forget_ids) if d.licensed else []
    extra += debt_due(params, state, len(forget_ids)) if d.licensed else []
    return replace(d, licensed=False, reasons=(*d.reasons, *extra)) if extra else d


def debt_due(params: Params, state, n_rows: int) -> list[str]:
    """deletion.debt's reasons (unlearning/history.py): past either bound a batch is exact retrain alone, a
    licensed one too."""
    from unlearning.history import debt_reasons, n_original_train, retraining_debt

    d = params.deletion.debt
    debt = retraining_debt(state.ledger, n_original_train(state.manifest, state.ledger))
    return debt_reasons(debt, n_rows, d.max_forgotten_fraction, d.max_batches_since_retrain)


def licence_batch(batch, params: Params, state, forget_ids: list[str], objective: str) -> Licence | None:
    """The batch's licensing (module docstring, step 1), logged on its run; None when licensing does not apply."""
    why_not = applies(params, state, objective)
    log = run_logger()
    if why_not is not None:
        return None

    record, map_line = map_for_state(params, state, batch.device, lambda: map_timing(params, state, batch.device),
                                     batch.tracker, batch.parent)
    decision = request_decision(params, state, record, forget_ids, batch.device)
    log.info(f"{batch.path.name}: {map_line}")
    log.info(f"{batch.path.name}: licensing: {decision.line()}")
    batch.tracker.set_tags(batch.parent, {"licensing": decision.path})
    batch.tracker.log_json(batch.parent, licence_json(params, forget_ids, decision, map_line), "licence.json")
    return Licence(decision, record, map_line)


def map_timing(params: Params, state, device: str):
    """The planner's probe (tasks/planning.py, cached per model version) over every training row, with its cost
    curve past one member: the map's members train as vectorized chunks, which one member's time overprices."""
    from tasks.planning import probe

    probing = params.model_copy(update={"validation": params.validation.model_copy(update={"audit_retrain": True})})
    return probe(probing, state, full_rows(state), device)[0]


def full_rows(state) -> BatchRows:
    """Every retained training row as the retain rows (the probe's and the map's rows), no forget row."""
    train = retained_train_rows(state.manifest)
    return BatchRows(before=train, forget=train[:0], retain=train, adjacent_mask=np.zeros(len(train), bool),
                     validation=validation_rows(state.manifest))


def licence_json(params: Params, forget_ids: list[str], decision: LicenceDecision, map_line: str) -> dict:
    """The licence as the batch run keeps it: each row's map score under its ledger key, the cut, the budget."""
    return {**decision.to_dict(), "map": map_line,
            "rows_by_id": dict(zip(ledger_keys(params, forget_ids), decision.scores)),
            "model": MODEL_UNCHANGED if decision.licensed else "exact path"}


# --- the licensed batch --------------------------------------------------------------------------------------------

def exact_after_failed_audit(params: Params) -> Params:
    """The params the batch continues with after a failed audit: exact retrain, named (no diagnostics, no
    certificate of an approximate candidate)."""
    from unlearning.config import EXACT_RETRAIN

    return params.model_copy(update={"deletion": params.deletion.model_copy(update={"method": EXACT_RETRAIN})})


def audit_licence(batch, params: Params, state, forget_ids: list[str], licence: Licence,
                  batch_index: int) -> AuditResult:
    """Train the audit's references (tasks/references.py: shadows like the model, oracles without the request's
    rows; validation's sizes) and run `audit` on the certificate's rows."""
    from tasks.batch import partition_retain
    from tasks.certify import Evaluator
    from tasks.planning import workers_of
    from tasks.references import ReferencePool
    from unlearning.batch import batch_rows
    from unlearning.config import Partition
    from unlearning.plan import CPU_CHUNK

    table = partition_retain(Partition(mode="group"), state.prepared, state.manifest, forget_ids, state.model)
    rows = batch_rows(state.prepared, state.manifest, forget_ids, table)
    v = params.validation
    pool = ReferencePool(params, state, rows, batch.device, batch_index, v.chunk_size or CPU_CHUNK,
                         workers_of(params, batch.device))
    shadows, oracles = pool.ensure(v.n_shadows, v.n_oracles)
    ev = Evaluator(state.prepared, sampled_for_certificate(rows, v.certificate_rows, params.base.seed), None,
                   batch.device)
    return audit(ev(state.model), ev(shadows), ev(oracles), ev.labels, ev.splits, params.gate, v, params.base.seed)


def apply_licensed(batch, params: Params, state, requests, objective: str, licence: Licence, batch_index: int,
                   n_train: int):
    """A licensed batch (module docstring, step 2): -> its BatchResult, or None when its audit failed (the cut is
    lowered and saved; the flow goes on to the exact retrain)."""
    from tasks.batch_path import erase_batch
    from unlearning.records import BatchResult

    forget_ids = [str(s) for s in requests["sample_id"][requests["kind"] == "unlearned"]] \
        if "kind" in requests.columns else [str(s) for s in requests["sample_id"]]
    log = run_logger()
    if audit_due(params.licensing.audit.probability, params.base.seed, batch_index):
        result = audit_licence(batch, params, state, forget_ids, licence, batch_index)
        log.info(f"{batch.path.name}: {result.line()}")
        batch.tracker.log_metrics(batch.parent, {"licensing/audit_passed": float(result.passed),
                                                 **{f"licensing/audit_{k}": v for k, v in result.epsilon.items()}})
        licence = replace(licence, audit=result)
        if not result.passed:
            record = licence.record
            cuts = lowered(record.cuts, failing_scores(licence.decision.scores, result.forget_upper,
                                                       params.gate.epsilon.max))
            audits = [*record.audits, {"batch_id": batch.batch_id, "passed": False, "at": now()}]
            save_map(params, replace(record, cuts=cuts, audits=audits))
            batch.tracker.set_tags(batch.parent, {"licensing": "audit failed: exact retrain"})
            log.warning(f"{batch.path.name}: the licence's audit failed: the cut comes down to "
                        f"{cuts.for_rows(licence.decision.rows)} for {licence.decision.rows} row(s), and the batch "
                        f"takes the exact retrain")
            return None
        save_map(params, replace(licence.record, audits=[*licence.record.audits, {"batch_id": batch.batch_id,
                                                                                   "passed": True, "at": now()}]))
    promoted = record_licensed(batch, params, state, requests, objective, licence, n_train)
    erasure = erase_batch(batch, params, requests["sample_id"].tolist(), promoted["version"])
    finish_licensed(batch, params, licence, promoted, erasure, forget_ids)
    metrics = {"licensing/max_row_epsilon": max(licence.decision.scores), "licensing/cut": licence.decision.cut,
               "licensing/budget": params.gate.epsilon.max}
    return BatchResult(batch.path.name, "applied", batch.batch_id, LICENSED_INACTION, promoted["version"],
                       batch.parent, metrics)


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def record_licensed(batch, params: Params, state, requests, objective: str, licence: Licence, n_train: int) -> dict:
    """The state after a licensed batch, all or nothing (tasks/stages.py commit_state): the same model, the rows
    marked deleted, a ledger entry per request with its row's map epsilon, the cut, the budget and "model
    unchanged (licensed)", a history point (the debt counts it)."""
    from tasks.stages import commit_state, ledger_entries, marked_deleted
    from unlearning.history import history_point
    from unlearning.ledger import appended
    from unlearning.salt import id_salt

    version = state.champion.get("model_version")
    stamp = now()
    d = licence.decision
    entries = ledger_entries(requests, batch, params.deletion.hash_sample_ids, id_salt(params), objective=objective,
                             method=LICENSED_INACTION, before=version, after=version, now=stamp,
                             fingerprint=state.fingerprint["digest"], verdict=LICENSED_VERDICT)
    score_of = dict(zip(ledger_keys(params, forget_of(requests)), d.scores))
    for e in entries:
        if e["verdict"] == LICENSED_VERDICT:
            e["licence"] = {"map_epsilon": score_of.get(e["sample_id"]), "score": d.score_kind, "cut": d.cut,
                            "budget": d.budget, "model": MODEL_UNCHANGED}
    previous = state.champion.get("history", [])
    point = history_point(previous, batch_id=batch.batch_id, request_file=batch.path.name, method=LICENSED_INACTION,
                          n_forgotten=d.rows, n_train=n_train, validation_accuracy=validation_accuracy(state),
                          output_gap=float("nan"), model_version=version, processed_at=stamp)
    champion = {**state.champion, "batch_id": batch.batch_id, "promoted_at": stamp,
                "n_retained_train": int(len(retained_train_rows(state.manifest))) - d.rows,
                "history": [*previous, {**point, "licensed": True}]}
    ids = [str(s) for s in requests["sample_id"]]
    commit_state(batch, params, state.model, marked_deleted(state.manifest, ids, batch.batch_id),
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


def finish_licensed(batch, params: Params, licence: Licence, promoted: dict, erasure: dict | None,
                    forget_ids: list[str]) -> None:
    """The licensed batch run: each row's map epsilon (hashed ids), the cut, the budget, "model unchanged
    (licensed)", the epsilon figure (the request's rows on the map), tags and the summary."""
    from adapters import plots
    from tasks.stages import publish_summary, wall_seconds
    from unlearning.history import HISTORY_METRICS
    from unlearning.records import Selection

    t, d = batch.tracker, licence.decision
    wall = wall_seconds(batch)
    t.log_metrics(batch.parent, {"wall_seconds": wall, "n_forgotten": d.rows, "licensing/cut": d.cut,
                                 "licensing/budget": d.budget, "licensing/max_row_epsilon": max(d.scores),
                                 "licensing/class_share": d.class_share, "licensing/adjacent_share": d.adjacent_share})
    t.log_series(batch.parent, promoted["history"], HISTORY_METRICS)
    t.log_json(batch.parent, {key: {"map_epsilon": s, "cut": d.cut, "budget": d.budget, "model": MODEL_UNCHANGED}
                              for key, s in zip(ledger_keys(params, forget_ids), d.scores)}, "licensed_rows.json")
    record = licence.record
    fig = plots.memorization_map(record.map.upper, d.budget, d.cut,
                                 f"licensed: {d.rows} row(s) under the cut; model unchanged (v{promoted['version']})",
                                 request=np.asarray(d.scores))
    t.log_figure(batch.parent, fig, "licence_epsilon.png")
    plots.close(fig)
    t.set_tags(batch.parent, {"method": LICENSED_INACTION, "gate": MODEL_UNCHANGED,
                              "model_version": str(promoted["version"]), "licensing": "licensed"})
    audit_line = licence.audit.line() if licence.audit is not None else "audit: not drawn for this batch " \
        f"(licensing.audit.probability = {params.licensing.audit.probability:g})"
    batch.summary.update(selection=Selection([LICENSED_INACTION], [("licensing", d.line())],
                                             rule_methods={"licensing": LICENSED_INACTION}),
                         plan=[d.line(), licence.map_line, audit_line])
    publish_summary(batch, status=f"applied: {MODEL_UNCHANGED}", erasure=erasure)
    t.end_run(batch.parent, seconds=wall)
    markdown_artifact(f"### Licensed: `{batch.path.name}`\n\n- {d.line()}\n- {licence.map_line}\n- {audit_line}",
                      key=batch.key("licence"), description=f"licence of {batch.path.name}")


def plan_note(params: Params, state, forget_ids: list[str], device: str, objective: str) -> str:
    """`unlearn plan`'s line on licensing: which path this request takes and why (nothing is built or changed:
    without a map it says what building one would cost)."""
    why_not = applies(params, state, objective)
    if why_not is not None:
        return f"licensing: does not apply ({why_not}): exact path"
    record, map_line, worth_building = stored_map(params, state, save=False)
    if record is None:
        if not worth_building:
            return f"licensing: {map_line}"
        plan = map_plan(params, map_timing(params, state, device), len(retained_train_rows(state.manifest)))
        if not plan.affordable:
            return f"licensing: {plan.line(params.licensing.map.stream_length)}: exact path"
        return (f"licensing: no map yet; the batch builds one: {plan.line(params.licensing.map.stream_length)}, "
                f"then decides")
    return f"licensing: {request_decision(params, state, record, forget_ids, device).line()}"
