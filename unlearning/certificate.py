"""The retrain-equivalence certificate's metrics, from logits (pure core; used by tasks/batch.py and
bench/calibration.py so the bench measures exactly what the gate sees).

* accuracy per split of the candidate, and the spread of the reference oracles' per-member accuracies
  (`oracle_acc`, `oracle_acc_min`, `oracle_acc_max`, `oracle_acc_std`, split size `n`): unlearning/gate.py
  checks the candidate lies in that spread, widened by a binomial term;
* KLoM of the shadow-unlearned vs the oracle margins (docs/design.md §4.2) per split: `klom_p95`, `klom_mean`, and
  the permutation test of metrics/permutation.py: `klom_pvalue`, `noise_floor_p95` (median of the null, the
  same-size N_u-vs-N_o floor) and `noise_floor_null_p95`;
* under `gate.criterion: epsilon`, the per-row epsilon of the shadow-unlearned vs the oracle margins
  (unlearning/metrics/epsilon.py) per split: `epsilon`, `epsilon_mean`, `epsilon_lower`, `epsilon_upper`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unlearning import metric_keys as K
from unlearning import metrics as M
from unlearning.metrics.epsilon import epsilon_metrics
from unlearning.metrics.permutation import klom_permutation_test


def retrain_equivalence_metrics(candidate_logits: Any, shadow_unlearned_logits: Any, oracle_logits: Any,
                                accuracy_ref_logits: Any, labels: Any, splits: np.ndarray, *,
                                n_permutations: int = 200, seed: int = 0, epsilon=None,
                                confidence: float = 0.99) -> tuple[dict[str, float], dict]:
    """-> (metrics, extra) where extra holds per-sample `klom` [n], the margins `m_unl`, `m_orc`, the permutation
    null of the KLoM P95 per split `klom_null_p95` {split: [P]} and `klom_null_example` [n] (per-sample KLoM
    of one relabeling of the pooled models).

    candidate_logits [n, C] or [1, n, C]; shadow_unlearned_logits [N_u, n, C] and oracle_logits [N_o, n, C]
    (the KLoM comparison); accuracy_ref_logits [N_a, n, C]: oracles the candidate was NOT drawn from.
    `epsilon`: gate.epsilon (unlearning/config.py EpsilonGate) to measure the per-row epsilon too, its bounds at
    one-sided `confidence` (the look's 1 - alpha); extra then holds `epsilon_rows` (point, lower, upper [n])."""
    out: dict[str, float] = {}
    for s, v in M.accuracy_by_split(candidate_logits, labels, splits).items():
        out[K.key("acc", s)] = v
    for s, v in M.accuracy_by_split(shadow_unlearned_logits, labels, splits).items():
        out[K.key("shadow_acc", s)] = v
    for s, a in M.accuracy_by_split_per_member(accuracy_ref_logits, labels, splits).items():
        out[K.key("oracle_acc", s)], out[K.key("oracle_acc_std", s)] = float(a.mean()), float(a.std())
        out[K.key("oracle_acc_min", s)], out[K.key("oracle_acc_max", s)] = float(a.min()), float(a.max())
        out[K.key("oracle_n", s)] = float(len(a))
        out[K.key("n", s)] = float(np.count_nonzero(splits == s))
    m_unl = M.margins(np.asarray(shadow_unlearned_logits), labels)
    m_orc = M.margins(np.asarray(oracle_logits), labels)
    kl = M.klom(m_unl, m_orc)
    for s, summ in M.klom_summary(kl, splits).items():
        out[K.key("klom_p95", s)], out[K.key("klom_mean", s)] = summ["p95"], summ["mean"]
    null_p95 = {}
    for s, r in klom_permutation_test(m_unl, m_orc, splits, n_permutations=n_permutations, seed=seed,
                                      return_null=True).items():
        out[K.key("klom_pvalue", s)] = r["pvalue"]
        out[K.key("noise_floor_p95", s)], out[K.key("noise_floor_null_p95", s)] = r["null_median"], r["null_p95"]
        null_p95[s] = r["null"]
    # Per-sample KLoM under one relabeling of the pooled models: what two sets of retrains of these same sizes
    # look like sample by sample (the oracle-vs-oracle picture the reviewer compares the candidate's with).
    pooled = np.concatenate([m_unl, m_orc], axis=0)
    order = np.random.default_rng(seed).permutation(len(pooled))
    null_example = M.klom(pooled[order[:len(m_unl)]], pooled[order[len(m_unl):]])
    eps_rows = None
    if epsilon is not None:
        eps, eps_rows = epsilon_metrics(m_unl, m_orc, splits, epsilon.estimator, epsilon.delta, epsilon.quantile,
                                        confidence, n_bootstrap=epsilon.n_bootstrap, seed=seed)
        out.update(eps)
    return out, {"epsilon_rows": eps_rows, "klom": kl, "m_unl": m_unl, "m_orc": m_orc, "klom_null_p95": null_p95,
                 "klom_null_example": null_example}
