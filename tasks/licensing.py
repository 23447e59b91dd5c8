"""Licensed inaction in a deletion batch (docs/design.md §4.9; docs/certificate.md, "Licensed inaction"): whether a
request leaves the model unchanged, and the audit that checks a sample of licences.

- `licence_batch` (the flow's first step after the request is split, flows/deletion_batch.py): the model
  version's memorization map (tasks/memorization_map.py: reused, or built where the planner finds it affordable),
  then the request's decision (`request_decision`: unlearning/licensing/decision.py decide, with the retraining debt and
  the registry's reasons): every row under the cut for its size, not a class, not a cluster, within the debt.
  Logged on the batch run either way (`licence.json`, tag `licensing`). tasks/licensed_batch.py applies a licence.
- `audit` is the one call of the certificate on this path (and in bench/stream.py): the core's sequential loop
  (unlearning/sequential.py certify_logits) under gate.criterion epsilon at gate.epsilon.max.
- `plan_note`: `unlearn plan`'s line, which path a request takes and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from tasks.batch_settings import BatchSettings
from tasks.id_key import IdKey
from tasks.memorization_map import (
    MapRecord, epsilon_gate, map_for_state, map_plan, save_map, stored_map,
)
from tasks.reporting import run_logger
from unlearning.certificate import metric_keys as K
from unlearning.batch.rows import BatchRows, retained_train_rows, validation_rows
from unlearning.config import LICENSED_INACTION, Debt, Deletion, Licensing
from unlearning.policy.history import LICENSED
from unlearning.licensing.decision import Guards, LicenceDecision, adjacent_share, decide, nearest_rows
from unlearning.sequential import Criterion, certify_logits, reference_prefixes

if TYPE_CHECKING:
    from tasks.planning import ProbeInputs

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
    """The certificate of the unchanged model (doing nothing) against fresh oracles: the core's sequential loop
    (unlearning/sequential.py certify_logits, the deletion flow's loop and rules) over the sequential step's
    looks (validation's references per role, alpha per look), under gate.criterion epsilon at gate.epsilon.max
    (a licence promises the budget). candidate_logits [1, n, C]: the production model; shadow_logits
    [N_s, n, C]: models trained like it (doing nothing leaves them as they are); oracle_logits [N_o, n, C]:
    retrains without the request's rows; splits [n]: forget/adjacent/remote/validation."""
    t0 = time.perf_counter()
    g = epsilon_gate(gate)
    from unlearning.planning.plan import sequential_step

    step = sequential_step(LICENSED_INACTION, validation, g, 1.0)
    splits = np.asarray(splits)
    done = certify_logits(Criterion.of_step(g, step), candidate_logits,
                          reference_prefixes(shadow_logits, oracle_logits), labels, splits, seed=seed)
    rows = done.result.data.epsilon_rows
    forget_upper = tuple(float(x) for x in rows.upper[splits == "forget"]) if rows is not None else ()
    last = done.looks[-1]
    epsilon = {key: v for key, v in K.of_measures(done.result.measures).items() if key.startswith("epsilon")}
    return AuditResult(done.accepted, len(done.looks), len(step.looks), int(last.n_shadows + last.n_oracles),
                       tuple(done.verdict.failures), forget_upper, epsilon, time.perf_counter() - t0)


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


def applies(lic: Licensing, state, objective: str) -> str | None:
    """Why licensing does not apply to this batch (None: it does): licensing off, suppression (a licence answers
    retrain equivalence only), a sharded original (sisa is exact for a share of a retrain already)."""
    if not lic.enabled:
        return "licensing.enabled is false"
    if objective != "retrain_equivalence":
        return f"objective {objective}: a licence answers retrain_equivalence only"
    if getattr(state.model, "shard_state", None) is not None:
        return "a sharded original: its exact deletions cost a share of a retrain already"
    return None


def licensing_debt_rows(ledger: list[dict]) -> int:
    """Rows licensed since the last exact retrain (unlearning/policy/history.py retraining_debt)."""
    from unlearning.policy.history import retraining_debt

    return int(retraining_debt(ledger, 1)["licensed_since_retrain"])


def guards_of(lic: Licensing) -> Guards:
    return Guards(lic.max_class_share, lic.max_adjacent_share, lic.max_debt_rows)


def cluster_share(lic: Licensing, state, forget_positions: np.ndarray, train_positions: np.ndarray,
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
    return adjacent_share(q, nearest_rows(feats[q].numpy(), feats.numpy(), q, lic.k_neighbors))


def registry_reasons(ids: IdKey, deletion: Deletion, state, forget_ids: list[str]) -> list[str]:
    """What only a new model version could drop: a class name or a table category that only these rows (and
    erased ones) hold stays in the registered champion while the model is unchanged (read as the promotion reads
    them: tasks/stages.py names_after_erasure, preparation_after_erasure)."""
    from tasks.stages import names_after_erasure, preparation_after_erasure

    out = []
    prepared = state.prepared
    if names_after_erasure(ids, deletion, prepared, forget_ids) != names_after_erasure(ids, deletion, prepared, []):
        out.append("its rows hold the last rows of a class the registered model names: a new version drops the name")
    if (preparation_after_erasure(ids, deletion, prepared, forget_ids)
            != preparation_after_erasure(ids, deletion, prepared, [])):
        out.append("its rows hold the only values of a table category the registered model's preparation names")
    return out


def request_decision(settings: BatchSettings, state, record: MapRecord | None, forget_ids: list[str],
                     device: str = "cpu") -> LicenceDecision:
    """The licence of `forget_ids` on this state (unlearning/licensing/decision.py decide), with the registry's
    reasons. `settings`: licensing, gate.epsilon.max, deletion.debt and the id key (tasks/batch_settings.py)."""
    prepared, lic = state.prepared, settings.licensing
    train = retained_train_rows(state.manifest)
    pos = prepared.rows(forget_ids)
    keys = settings.ids.ledger_keys(forget_ids)
    scores = record.scores(keys, lic.score) if record is not None else np.full(len(keys), np.nan)
    # without a map nothing is licensed: the neighbours' forward pass is not worth running
    adjacent = cluster_share(lic, state, pos, train, device) if record is not None else 0.0
    d = decide(scores, record.cuts if record is not None else None, settings.gate.epsilon.max, prepared.label[pos],
               prepared.label[train], adjacent, guards_of(lic), licensing_debt_rows(state.ledger), lic.score)
    extra = registry_reasons(settings.ids, settings.deletion, state, forget_ids) if d.licensed else []
    extra += debt_due(settings.deletion.debt, state, len(forget_ids)) if d.licensed else []
    return replace(d, licensed=False, reasons=(*d.reasons, *extra)) if extra else d


def debt_due(d: Debt, state, n_rows: int) -> list[str]:
    """deletion.debt's reasons (unlearning/policy/history.py): past either bound a batch is exact retrain alone, a
    licensed one too."""
    from unlearning.policy.history import debt_reasons, n_original_train, retraining_debt

    debt = retraining_debt(state.ledger, n_original_train(state.manifest, state.ledger))
    return debt_reasons(debt, n_rows, d.max_forgotten_fraction, d.max_batches_since_retrain)


def licence_batch(batch, settings: BatchSettings, state, forget_ids: list[str], objective: str) -> Licence | None:
    """The batch's licensing (module docstring, step 1), logged on its run; None when licensing does not apply."""
    why_not = applies(settings.licensing, state, objective)
    log = run_logger()
    if why_not is not None:
        return None
    cfg = settings.map_settings
    record, map_line = map_for_state(cfg, state, batch.device,
                                     lambda: map_timing(settings.probe_inputs, state, batch.device),
                                     batch.tracker, batch.parent)
    decision = request_decision(settings, state, record, forget_ids, batch.device)
    log.info(f"{batch.path.name}: {map_line}")
    log.info(f"{batch.path.name}: licensing: {decision.line()}")
    batch.tracker.set_tags(batch.parent, {"licensing": decision.path})
    batch.tracker.log_json(batch.parent, licence_json(cfg.ids, forget_ids, decision, map_line), "licence.json")
    if record is not None:  # what the map decided: whether it pays for itself (tasks/memorization_map.py map_paid)
        record = replace(record, decided=record.decided + 1, licensed=record.licensed + int(decision.licensed))
        save_map(cfg.paths, record)
    return Licence(decision, record, map_line)


def map_timing(inputs: ProbeInputs, state, device: str):
    """The planner's probe (tasks/planning.py, cached per model version) over every training row, with its cost
    curve past one member: the map's members train as vectorized chunks, which one member's time overprices."""
    from tasks.planning import probe

    probing = replace(inputs, validation=inputs.validation.model_copy(update={"audit_retrain": True}))
    return probe(probing, state, full_rows(state), device)[0]


def full_rows(state) -> BatchRows:
    """Every retained training row as the retain rows (the probe's and the map's rows), no forget row."""
    train = retained_train_rows(state.manifest)
    return BatchRows(before=train, forget=train[:0], retain=train, adjacent_mask=np.zeros(len(train), bool),
                     validation=validation_rows(state.manifest))


def licence_json(ids: IdKey, forget_ids: list[str], decision: LicenceDecision, map_line: str) -> dict:
    """The licence as the batch run keeps it: each row's map score under its ledger key, the cut, the budget."""
    return {**decision.to_dict(), "map": map_line,
            "rows_by_id": dict(zip(ids.ledger_keys(forget_ids), decision.scores)),
            "model": MODEL_UNCHANGED if decision.licensed else "exact path"}


def plan_note(settings: BatchSettings, state, forget_ids: list[str], device: str, objective: str) -> str:
    """`unlearn plan`'s line on licensing: which path this request takes and why (nothing is built or changed:
    without a map it says what building one would cost)."""
    why_not = applies(settings.licensing, state, objective)
    if why_not is not None:
        return f"licensing: does not apply ({why_not}): exact path"
    cfg = settings.map_settings
    record, map_line, worth_building = stored_map(cfg, state, save=False)
    if record is None:
        if not worth_building:
            return f"licensing: {map_line}"
        plan = map_plan(cfg, map_timing(settings.probe_inputs, state, device), len(retained_train_rows(state.manifest)))
        stream = settings.licensing.map.stream_length
        if not plan.affordable:
            return f"licensing: {plan.line(stream)}: exact path"
        return f"licensing: no map yet; the batch builds one: {plan.line(stream)}, then decides"
    return f"licensing: {request_decision(settings, state, record, forget_ids, device).line()}"
