"""The certifier and the acceptance rule of one candidate, as pure functions over typed records
(docs/design.md §4.2, §4.5): the shell (tasks/certify.py) computes logits and calls them.

- `outcome_from_logits`: the certificate's metrics (accuracy per split, KLoM and its permutation test, output gap,
  membership inference) and the gate's verdict, from the logits of the candidate, the original and the reference
  models on the evaluated rows;
- `reference_free_outcome`: the same for a candidate judged without reference models (an exact retrain, a
  suppression method): accuracies against the original's;
- `split_records`: one `SplitRecord` per split (accuracy, the oracles' interval, KLoM P95, its same-size floor,
  the p-value, pass), the table a reviewer reads, built once with the outcome (`Outcome.splits`);
- `accept`: whether the batch takes the candidate: it passed, or it is an audited exact retrain that failed
  statistical checks alone (a false reject of the gate, `gate.exact_retrain_overrides`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import torch

from unlearning import metric_keys as K
from unlearning import metrics as M
from unlearning.batch import SPLITS, BatchRows, membership_metrics
from unlearning.certificate import retrain_equivalence_metrics
from unlearning.config import Gate
from unlearning.data.store import Prepared
from unlearning.gate import Verdict, evaluate_gate, only_statistical_failures
from unlearning.history import is_exact
from unlearning.models import Ensemble
from unlearning.quality import entangled_accuracies


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
class Outcome:
    """One candidate, run and certified: the record every later step reads (acceptance, promotion, the review
    screens). `alpha`: the alpha the deciding look applied (None: judged without references); `looks`: the
    sequential certificate's looks (unlearning/sequential.py Look); `splits`: the per-split table; `info`: what
    the method reports for the ledger (sisa: the shards and slices it retrained)."""

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

    def tracked_metrics(self) -> dict[str, float]:
        """Its metrics as MLflow logs them (unlearning/metric_keys.py for_tracking: with alpha and looks)."""
        return K.for_tracking(self.metrics, self.alpha, len(self.looks))


CandidateOutcome = Outcome  # the name the shell and the tests have used


def split_records_of(metrics: dict[str, float], verdict: Verdict) -> tuple[SplitRecord, ...]:
    """One record per split present, from the certificate's measurements and the verdict's checks."""
    out = []
    for s in SPLITS:
        acc = K.of_split(metrics, "acc", s)
        if acc is None:
            continue
        acc_check = verdict.checks.get(K.key("acc", s), {})
        interval = tuple(acc_check["limit"]) if acc_check.get("op") == "in" else None
        out.append(SplitRecord(s, acc, K.of_split(metrics, "original_acc", s), interval,
                               K.of_split(metrics, "klom_p95", s), K.of_split(metrics, "noise_floor_p95", s),
                               K.of_split(metrics, "klom_pvalue", s), verdict.passed_for(s)))
    return tuple(out)


def outcome_from_logits(method: str, candidate: Ensemble, logits: dict[str, torch.Tensor], prepared: Prepared,
                        rows: BatchRows, gate: Gate, objective: str, seed: int, cost: dict, t0: float,
                        n_shadows: int, judge: Callable[[dict[str, float]], Verdict] | None = None,
                        alpha: float | None = None) -> Outcome:
    """The certificate's metrics and the gate's verdict from the logits on the evaluated rows [N, n, C]:
    `candidate`, `original`, `oracles` (every oracle), `shadow_unlearned` and `oracle_ref` (the KLoM
    comparison), `accuracy_ref` (oracles the candidate was not drawn from). `gate.retrain_equivalence`'s alpha
    and n_permutations are the look's (unlearning/sequential.py). `judge`: the verdict over the metrics, once
    (a sequential look's, unlearning/sequential.py look_verdict; default: the whole gate); `alpha`: the alpha
    it applied, for the record."""
    eval_rows, splits = rows.eval_rows()
    labels = prepared.label[eval_rows]
    metrics: dict[str, float] = {}
    for s, v in M.accuracy_by_split(logits["original"], labels, splits).items():
        metrics[K.key("original_acc", s)] = v
    # Accuracy spread of the reference oracles, KLoM and its permutation test (p-value, same-size floor).
    cert, extra = retrain_equivalence_metrics(
        logits["candidate"], logits["shadow_unlearned"], logits["oracle_ref"], logits["accuracy_ref"], labels, splits,
        n_permutations=gate.retrain_equivalence.n_permutations, seed=seed,
        epsilon=gate.epsilon if gate.criterion == "epsilon" else None,
        confidence=1 - gate.retrain_equivalence.alpha)  # the look's alpha: one-sided bounds at 1 - alpha
    metrics.update(cert)
    metrics.update(entangled_accuracies(logits["candidate"], logits["original"], labels, splits, rows.remote_validation()))
    metrics["candidate_is_retrain"] = float(is_exact(method))
    m_unl, m_orc, klom_values = extra["m_unl"], extra["m_orc"], extra["klom"]
    gap = M.output_gap(logits["candidate"].numpy(), logits["oracles"].numpy())
    for s in SPLITS:
        if (splits == s).any():
            metrics[K.key("output_gap", s)] = float(gap[splits == s].mean())
    metrics.update(membership_metrics(logits["candidate"].numpy(), logits["shadow_unlearned"].numpy(),
                                        logits["oracle_ref"].numpy(), labels, splits))
    metrics["coverage/forget"] = M.oracle_coverage(M.margins(logits["candidate"].numpy(), labels)[0][splits == "forget"],
                                                   M.margins(logits["oracles"].numpy(), labels)[:, splits == "forget"])
    metrics["n_oracles"] = float(logits["oracles"].shape[0])
    metrics["n_shadows"] = float(n_shadows)
    verdict = judge(metrics) if judge is not None else evaluate_gate(objective, metrics, gate)
    cost["wall_seconds"] = time.perf_counter() - t0
    per_sample = pd.DataFrame({"sample_id": prepared.manifest["sample_id"].to_numpy()[eval_rows], "split": splits,
                               "klom": klom_values, "klom_null_example": extra["klom_null_example"],
                               "output_gap": gap,
                               "margin_unlearned_mean": m_unl.mean(0), "margin_oracle_mean": m_orc.mean(0)})
    if extra["epsilon_rows"] is not None:
        per_sample["epsilon"], per_sample["epsilon_upper"] = extra["epsilon_rows"].point, extra["epsilon_rows"].upper
    forget_idx = np.flatnonzero(splits == "forget")
    worst = forget_idx[np.argsort(-np.nan_to_num(klom_values[forget_idx], nan=np.inf))[:4]]
    return Outcome(method=method, model=candidate.cpu(), metrics=metrics, verdict=verdict, cost=cost,
                   per_sample=per_sample, klom_null_p95=extra["klom_null_p95"],
                   worst={"unlearned": m_unl[:, worst], "oracle": m_orc[:, worst],
                          "names": list(per_sample["sample_id"].to_numpy()[worst])},
                   alpha=gate.retrain_equivalence.alpha if alpha is None else alpha,
                   splits=split_records_of(metrics, verdict))


def reference_free_outcome(method: str, model: Ensemble, candidate_logits: torch.Tensor,
                           original_logits: torch.Tensor, labels: np.ndarray, splits: np.ndarray,
                           sample_ids: np.ndarray, gate: Gate, objective: str, cost: dict,
                           t0: float, remote_validation: np.ndarray | None = None) -> Outcome:
    """Accuracy per split of the candidate and of the original ([1, n, C] logits on the evaluated rows), and the
    gate over them (no reference models: KLoM and the output gap to oracles are not measured, NaN per sample).
    `remote_validation`: [n] bool, the validation rows the batch does not entangle (BatchRows.remote_validation):
    the validation floors compare those."""
    metrics: dict[str, float] = {}
    for s, v in M.accuracy_by_split(candidate_logits, labels, splits).items():
        metrics[K.key("acc", s)] = v
    for s, v in M.accuracy_by_split(original_logits, labels, splits).items():
        metrics[K.key("original_acc", s)] = v
    metrics.update(entangled_accuracies(candidate_logits, original_logits, labels, splits, remote_validation))
    for s in SPLITS:
        if (splits == s).any():
            metrics[K.key("n", s)] = float(np.count_nonzero(splits == s))
    metrics.update({"candidate_is_retrain": float(is_exact(method)), "n_oracles": 0.0, "n_shadows": 0.0})
    verdict = evaluate_gate(objective, metrics, gate)
    cost["wall_seconds"] = time.perf_counter() - t0
    nan = np.full(len(splits), np.nan)
    per_sample = pd.DataFrame({"sample_id": sample_ids, "split": splits, "klom": nan, "klom_null_example": nan,
                               "output_gap": nan, "margin_unlearned_mean": nan, "margin_oracle_mean": nan})
    return Outcome(method=method, model=model.cpu(), metrics=metrics, verdict=verdict, cost=cost,
                   per_sample=per_sample, splits=split_records_of(metrics, verdict))


def split_records(outcome: Outcome) -> list[SplitRecord]:
    """The candidate's certificate, one record per split present (built with the outcome; an outcome made by
    hand without them gets them from its metrics and its verdict's checks)."""
    return list(outcome.splits or split_records_of(outcome.metrics, outcome.verdict))


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
    if is_exact(outcome.method) and exact_retrain_overrides and only_statistical_failures(outcome.verdict):
        return Acceptance(True, True)
    return Acceptance(False, False)
