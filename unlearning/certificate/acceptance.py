"""The certifier and the acceptance rule of one candidate, as pure functions over typed records
(docs/design.md §4.2, §4.5): the shell (tasks/certify.py) computes logits and calls them.

- `measure_logits`: what the certificate measures on the evaluated rows (per split: accuracy, the oracles' spread,
  KLoM and its permutation test, epsilon; beside them the output gap and membership inference), from the logits
  of the candidate, the original and the reference models, before any verdict: a sequential look's work
  (unlearning/sequential.py run_looks);
- `outcome_of`: the candidate's Outcome from a certificate's end (the deciding look's measurement, its verdict,
  the looks); `outcome_from_logits`: the one-look certificate at full N (the audit of an exact retrain);
- `reference_free_outcome`: a candidate judged without reference models (an exact retrain, a suppression
  method): accuracies against the original's;
- `split_records`: one `SplitRecord` per split (accuracy, the oracles' interval, KLoM P95, its same-size floor,
  the p-value, pass), the table a reviewer reads, built once with the outcome (`Outcome.splits`);
- `accept`: whether the batch takes the candidate: it passed, or it is an audited exact retrain that failed
  statistical checks alone (a false reject of the gate, `gate.exact_retrain_overrides`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from unlearning.certificate import metric_keys as K
from unlearning import metrics as M
from unlearning.batch.rows import SPLITS, BatchRows, membership_metrics
from unlearning.certificate.equivalence import certificate_measures
from unlearning.config import Gate, method_traits
from unlearning.data.store import Prepared
from unlearning.certificate.gate import SplitMeasures, Verdict, by_split, evaluate_gate
from unlearning.models import Ensemble
from unlearning.batch.quality import entangled_accuracies
from unlearning.sequential import Certified, Criterion, run_looks


@dataclass(frozen=True)
class SplitRecord:
    """One split of a candidate's certificate: what was measured, against what, and whether it passed."""

    split: str
    accuracy: float
    original_accuracy: float | None
    interval: tuple[float, float] | None  # where one more exact retrain's accuracy falls (None: no references)
    klom_p95: float | None
    floor: float | None  # the same-size noise floor of KLoM P95 (median of the permutation null)
    pvalue: float | None
    passed: bool  # every gate check of this split passed


@dataclass(frozen=True)
class Measurement:
    """What the certificate measured on the evaluated rows, before a verdict: the per-split records the gate
    reads (`measures`), the other metrics (output gap, membership inference, coverage, reference counts: `extra`),
    per evaluated sample (split, KLoM, margins summary, epsilon), the margins of the worst forget samples, and the
    permutation null of the KLoM P95 per split (for plots)."""

    measures: tuple[SplitMeasures, ...]
    extra: dict[str, float]
    per_sample: pd.DataFrame
    worst: dict = field(default_factory=dict)
    klom_null_p95: dict = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The flat metrics (unlearning/certificate/metric_keys.py names) of the measures and the extra metrics."""
        return {**K.of_measures(self.measures), **self.extra}


@dataclass(frozen=True)
class Outcome:
    """One candidate, run and certified: the record every later step reads (acceptance, promotion, the review
    screens). `measures`: what the gate read, per split; `metrics`: their flat form with the other metrics, for
    MLflow and the figures; `alpha`: the alpha the deciding look applied (None: judged without references);
    `looks`: the sequential certificate's looks (unlearning/sequential.py Look); `splits`: the per-split table;
    `info`: what the method reports for the ledger (sisa: the shards and slices it retrained)."""

    method: str
    model: Ensemble  # the unlearned production model (one member)
    metrics: dict[str, float]
    verdict: Verdict
    cost: dict
    per_sample: pd.DataFrame  # per evaluated sample: split, KLoM, margins summary
    worst: dict = field(default_factory=dict)  # margins of the worst forget samples, for plots
    klom_null_p95: dict = field(default_factory=dict)  # {split: [P]} permutation null of the KLoM P95, for plots
    info: dict = field(default_factory=dict)
    alpha: float | None = None
    looks: tuple = ()
    splits: tuple[SplitRecord, ...] = ()
    measures: tuple[SplitMeasures, ...] = ()

    def tracked_metrics(self) -> dict[str, float]:
        """Its metrics as MLflow logs them (unlearning/certificate/metric_keys.py for_tracking: with alpha and looks)."""
        return K.for_tracking(self.metrics, self.alpha, len(self.looks))


CandidateOutcome = Outcome  # the name the shell and the tests have used


def split_records_of(measures, verdict: Verdict) -> tuple[SplitRecord, ...]:
    """One record per split measured (SPLITS order), from the gate's input and the verdict's checks."""
    out = []
    for s, m in by_split(measures).items():
        if s not in SPLITS or m.acc is None:
            continue
        acc_check = verdict.checks.get(K.key("acc", s))
        interval = tuple(acc_check.limit) if acc_check is not None and acc_check.op == "in" else None
        out.append(SplitRecord(s, m.acc, m.original_acc, interval, m.klom_p95, m.floor, m.pvalue,
                               verdict.passed_for(s)))
    return tuple(out)


def entangled_measures(candidate_logits, original_logits, labels: np.ndarray, splits: np.ndarray,
                       remote_validation: np.ndarray | None) -> tuple[SplitMeasures, ...]:
    """The validation rows the batch does not entangle (`validation_remote`: what the gate's validation floors
    compare) and those it does (`validation_adjacent`: reported, not gated), as two more split records of the
    candidate's and the original's accuracy (unlearning/batch/quality.py entangled_accuracies; none when
    `remote_validation` is None or a subset has no row)."""
    acc = entangled_accuracies(candidate_logits, original_logits, labels, splits, remote_validation)
    return tuple(SplitMeasures(s, acc[f"acc/{s}"], n=int(acc[f"n/{s}"]), original_acc=acc.get(f"original_acc/{s}"))
                 for s in ("validation_remote", "validation_adjacent") if f"acc/{s}" in acc)


def measure_logits(logits: dict[str, torch.Tensor], prepared: Prepared, rows: BatchRows, seed: int,
                   n_shadows: int, *, n_permutations: int, epsilon=None, confidence: float = 0.99) -> Measurement:
    """The certificate's measurements from the logits on the evaluated rows [N, n, C]: `candidate`, `original`,
    `oracles` (every oracle), `shadow_unlearned` and `oracle_ref` (the KLoM comparison), `accuracy_ref` (oracles
    the candidate was not drawn from). `n_permutations`, `epsilon` and `confidence`: how the look measures
    (unlearning/sequential.py Criterion.measure_args)."""
    eval_rows, splits = rows.eval_rows()
    labels = prepared.label[eval_rows]
    original = M.accuracy_by_split(logits["original"], labels, splits)
    measures, data = certificate_measures(
        logits["candidate"], logits["shadow_unlearned"], logits["oracle_ref"], logits["accuracy_ref"], labels, splits,
        n_permutations=n_permutations, seed=seed, epsilon=epsilon, confidence=confidence)
    measures = (*(m.with_original(original.get(m.split)) for m in measures),
                *entangled_measures(logits["candidate"], logits["original"], labels, splits, rows.remote_validation()))
    extra: dict[str, float] = {}
    gap = M.output_gap(logits["candidate"].numpy(), logits["oracles"].numpy())
    for s in SPLITS:
        if (splits == s).any():
            extra[K.key("output_gap", s)] = float(gap[splits == s].mean())
    extra.update(membership_metrics(logits["candidate"].numpy(), logits["shadow_unlearned"].numpy(),
                                    logits["oracle_ref"].numpy(), labels, splits))
    extra["coverage/forget"] = M.oracle_coverage(M.margins(logits["candidate"].numpy(), labels)[0][splits == "forget"],
                                                 M.margins(logits["oracles"].numpy(), labels)[:, splits == "forget"])
    extra["n_oracles"] = float(logits["oracles"].shape[0])
    extra["n_shadows"] = float(n_shadows)
    per_sample = pd.DataFrame({"sample_id": prepared.manifest["sample_id"].to_numpy()[eval_rows], "split": splits,
                               "klom": data.klom, "klom_null_example": data.klom_null_example, "output_gap": gap,
                               "margin_unlearned_mean": data.m_unl.mean(0), "margin_oracle_mean": data.m_orc.mean(0)})
    if data.epsilon_rows is not None:
        per_sample["epsilon"], per_sample["epsilon_upper"] = data.epsilon_rows.point, data.epsilon_rows.upper
    forget_idx = np.flatnonzero(splits == "forget")
    worst = forget_idx[np.argsort(-np.nan_to_num(data.klom[forget_idx], nan=np.inf))[:4]]
    return Measurement(measures, extra, per_sample,
                       worst={"unlearned": data.m_unl[:, worst], "oracle": data.m_orc[:, worst],
                              "names": list(per_sample["sample_id"].to_numpy()[worst])},
                       klom_null_p95=data.klom_null_p95)


def outcome_of(method: str, model: Ensemble, certified: Certified[Measurement], cost: dict, t0: float) -> Outcome:
    """The candidate's Outcome at the end of its certificate (unlearning/sequential.py run_looks over
    `measure_logits`): the deciding look's measurement and verdict, its alpha and every look."""
    m, verdict = certified.result, certified.verdict
    cost["wall_seconds"] = time.perf_counter() - t0
    return Outcome(method=method, model=model.cpu(), metrics=m.metrics(), verdict=verdict, cost=cost,
                   per_sample=m.per_sample, worst=m.worst, klom_null_p95=m.klom_null_p95, alpha=certified.alpha,
                   looks=certified.looks, splits=split_records_of(m.measures, verdict), measures=m.measures)


def outcome_from_logits(method: str, candidate: Ensemble, logits: dict[str, torch.Tensor], prepared: Prepared,
                        rows: BatchRows, gate: Gate, objective: str, seed: int, cost: dict, t0: float,
                        n_shadows: int) -> Outcome:
    """The certificate in one look at full N (the audit of an exact retrain: `oracle_ref` and `shadow_unlearned`
    are two halves of the oracles the candidate was not drawn from) at gate.retrain_equivalence's alpha, through
    the same loop as the sequential certificate (`measure_logits`)."""
    n_s, n_o = int(logits["shadow_unlearned"].shape[0]), int(logits["oracle_ref"].shape[0])
    criterion = Criterion.of(gate, [(n_s, n_o)], objective=objective, exact=method_traits(method).exact)
    certified = run_looks(criterion, lambda spec: measure_logits(logits, prepared, rows, seed, n_shadows,
                                                                 **criterion.measure_args(spec)))
    return outcome_of(method, candidate, certified, cost, t0)


def reference_free_outcome(method: str, model: Ensemble, candidate_logits: torch.Tensor,
                           original_logits: torch.Tensor, labels: np.ndarray, splits: np.ndarray,
                           sample_ids: np.ndarray, gate: Gate, objective: str, cost: dict,
                           t0: float, remote_validation: np.ndarray | None = None) -> Outcome:
    """Accuracy per split of the candidate and of the original ([1, n, C] logits on the evaluated rows), and the
    gate over them (no reference models: KLoM and the output gap to oracles are not measured, NaN per sample).
    `remote_validation`: [n] bool, the validation rows the batch does not entangle (BatchRows.remote_validation):
    the validation floors compare those."""
    original = M.accuracy_by_split(original_logits, labels, splits)
    measures = (*(SplitMeasures(s, acc, n=int(np.count_nonzero(splits == s)), original_acc=original.get(s))
                  for s, acc in M.accuracy_by_split(candidate_logits, labels, splits).items()),
                *entangled_measures(candidate_logits, original_logits, labels, splits, remote_validation))
    verdict = evaluate_gate(objective, measures, gate, exact=method_traits(method).exact)
    cost["wall_seconds"] = time.perf_counter() - t0
    nan = np.full(len(splits), np.nan)
    per_sample = pd.DataFrame({"sample_id": sample_ids, "split": splits, "klom": nan, "klom_null_example": nan,
                               "output_gap": nan, "margin_unlearned_mean": nan, "margin_oracle_mean": nan})
    metrics = {**K.of_measures(measures), "n_oracles": 0.0, "n_shadows": 0.0}
    return Outcome(method=method, model=model.cpu(), metrics=metrics, verdict=verdict, cost=cost,
                   per_sample=per_sample, splits=split_records_of(measures, verdict), measures=measures)


def split_records(outcome: Outcome) -> list[SplitRecord]:
    """The candidate's certificate, one record per split present (built with the outcome; an outcome made by
    hand without them gets them from its measures and its verdict's checks)."""
    return list(outcome.splits or split_records_of(outcome.measures, outcome.verdict))


@dataclass(frozen=True)
class Acceptance:
    accepted: bool
    as_false_reject: bool  # an exact retrain promoted although the gate rejected it on statistical checks alone


def accept(outcome: Outcome, exact_retrain_overrides: bool) -> Acceptance:
    """The batch takes a candidate that passed the gate, or an (audited) exact retrain that failed the
    statistical comparisons with the oracles only: exact retrain is exact unlearning by construction, so that
    failure measures the gate, not the model, and blocking it would leave the batch no way forward. A floor it
    misses (max_validation_drop, min_validation_accuracy) still rejects it."""
    if outcome.verdict.passed:
        return Acceptance(True, False)
    if method_traits(outcome.method).exact and exact_retrain_overrides and outcome.verdict.failed_on_statistics_only():
        return Acceptance(True, True)
    return Acceptance(False, False)
