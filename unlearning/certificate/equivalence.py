"""The retrain-equivalence certificate's measurements, from logits (pure core; unlearning/certificate/acceptance.py and the
sequential looks of unlearning/sequential.py call it, so the benches measure exactly what the gate sees).

Per split, one frozen record (unlearning/certificate/gate.py SplitMeasures), which the gate reads:
* the candidate's accuracy, the shadow-unlearned models' and the spread of the reference oracles' per-member
  accuracies (`OracleAccuracy`): the gate checks the candidate lies in that spread, widened by a binomial term;
* KLoM of the shadow-unlearned vs the oracle margins (docs/design.md §4.2): P95 and mean, and the permutation test
  of metrics/permutation.py: its p-value and its same-size floor (median and P95 of the null);
* under `gate.criterion: epsilon`, the split's epsilon from the per-row epsilon of the shadow-unlearned vs the
  oracle margins (unlearning/metrics/epsilon.py), aggregated as gate.epsilon.aggregate says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unlearning import metrics as M
from unlearning.certificate.gate import OracleAccuracy, SplitMeasures
from unlearning.metrics.epsilon import RowEpsilon, epsilon_metrics
from unlearning.metrics.permutation import klom_permutation_test
from unlearning.metrics.summary import splits_present


@dataclass(frozen=True)
class CertificateData:
    """What the certificate computed beside the per-split records, for the review screens: per-sample KLoM
    `klom` [n], the margins `m_unl` [N_u, n] and `m_orc` [N_o, n], the permutation null of the KLoM P95 per split
    `klom_null_p95` {split: [P]}, `klom_null_example` [n] (per-sample KLoM of one relabeling of the pooled
    models) and the per-row epsilon `epsilon_rows` (None unless measured)."""

    klom: np.ndarray
    m_unl: np.ndarray
    m_orc: np.ndarray
    klom_null_p95: dict
    klom_null_example: np.ndarray
    epsilon_rows: RowEpsilon | None = None


def certificate_measures(candidate_logits: Any, shadow_unlearned_logits: Any, oracle_logits: Any,
                         accuracy_ref_logits: Any, labels: Any, splits: np.ndarray, *, n_permutations: int = 200,
                         seed: int = 0, epsilon=None, confidence: float = 0.99
                         ) -> tuple[tuple[SplitMeasures, ...], CertificateData]:
    """-> (one SplitMeasures per split present, in SPLITS order; CertificateData).

    candidate_logits [n, C] or [1, n, C]; shadow_unlearned_logits [N_u, n, C] and oracle_logits [N_o, n, C]
    (the KLoM comparison); accuracy_ref_logits [N_a, n, C]: oracles the candidate was NOT drawn from.
    `epsilon`: gate.epsilon (unlearning/config.py EpsilonGate) to measure the split's epsilon too, its bounds at
    one-sided `confidence` (the look's 1 - alpha)."""
    acc = M.accuracy_by_split(candidate_logits, labels, splits)
    shadow_acc = M.accuracy_by_split(shadow_unlearned_logits, labels, splits)
    oracle = {s: OracleAccuracy(float(a.mean()), float(a.std()), float(a.min()), float(a.max()), len(a))
              for s, a in M.accuracy_by_split_per_member(accuracy_ref_logits, labels, splits).items()}
    m_unl = M.margins(np.asarray(shadow_unlearned_logits), labels)
    m_orc = M.margins(np.asarray(oracle_logits), labels)
    kl = M.klom(m_unl, m_orc)
    klom = M.klom_summary(kl, splits)
    test = klom_permutation_test(m_unl, m_orc, splits, n_permutations=n_permutations, seed=seed, return_null=True)
    eps, eps_rows = {}, None
    if epsilon is not None:
        eps, eps_rows = epsilon_metrics(m_unl, m_orc, splits, epsilon.estimator, epsilon.delta, epsilon.quantile,
                                        confidence, n_bootstrap=epsilon.n_bootstrap, seed=seed,
                                        how=epsilon.aggregate, row_cap=epsilon.row_cap)
    measures = tuple(
        SplitMeasures(s, acc[s], n=int(np.count_nonzero(np.asarray(splits) == s)), shadow_acc=shadow_acc.get(s),
                      oracle=oracle.get(s), klom_p95=klom[s]["p95"], klom_mean=klom[s]["mean"],
                      pvalue=test[s]["pvalue"], floor=test[s]["null_median"], floor_null_p95=test[s]["null_p95"],
                      epsilon=eps.get(s))
        for s in splits_present(np.asarray(splits)) if s in acc)
    # Per-sample KLoM under one relabeling of the pooled models: what two sets of retrains of these same sizes
    # look like sample by sample (the oracle-vs-oracle picture the reviewer compares the candidate's with).
    pooled = np.concatenate([m_unl, m_orc], axis=0)
    order = np.random.default_rng(seed).permutation(len(pooled))
    null_example = M.klom(pooled[order[:len(m_unl)]], pooled[order[len(m_unl):]])
    return measures, CertificateData(kl, m_unl, m_orc, {s: r["null"] for s, r in test.items()}, null_example,
                                     eps_rows)
