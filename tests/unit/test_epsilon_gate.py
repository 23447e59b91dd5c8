"""The gate's two criteria (unlearning/certificate/gate.py, unlearning/sequential.py): `difference` (the KLoM permutation test,
unchanged) and `epsilon` (the per-row epsilon's bounds against gate.epsilon.max): the final verdict, the interim
looks, the sequential certificate end to end, and the config keys."""

import numpy as np
import pytest

from unlearning.config import ConfigError, Gate, parse_params
from unlearning.certificate.gate import OracleAccuracy, SplitMeasures, evaluate_gate
from unlearning.metrics.epsilon import BatchEpsilon
from unlearning.sequential import Criterion, Look, References, alpha_schedule, certify_logits, permutations_for

FLOORS_OFF = {"min_validation_accuracy": None, "max_validation_drop": None}


def _gate(criterion, budget=2.0, **eps):
    return Gate(criterion=criterion, epsilon={"max": budget, **eps}, retrain_equivalence=FLOORS_OFF)


def _measures(upper, lower, pvalue, epsilon=True):
    """The forget split far from its oracles by accuracy (1.0 against 0.5 on 100 rows) and by `pvalue`; its
    epsilon bounds `lower` and `upper` (measured when `epsilon`)."""
    eps = BatchEpsilon((upper + lower) / 2, (upper + lower) / 2, lower, upper) if epsilon else None
    return [SplitMeasures("forget", 1.0, n=100, oracle=OracleAccuracy(0.5, 0.0, 0.5, 0.5, 1), pvalue=pvalue,
                          epsilon=eps)]


def _interim(measures, gate, alpha=0.0025):
    """The first of two looks at alpha (the core's criterion): (verdict, decision, failing splits in words)."""
    c = Criterion.of(gate, [(16, 16), (80, 80)], [alpha, alpha], [799, 799])
    spec = c.looks[0]
    v = c.judge(measures, spec)
    return v, c.decision(v, spec), [f.split(": ", 1)[1] for f in v.failures]


def test_final_verdict_under_each_criterion():
    m = _measures(upper=1.5, lower=0.2, pvalue=0.001)  # far by difference (p, accuracy), near by epsilon
    diff = evaluate_gate("retrain_equivalence", m, _gate("difference"), exact=True)
    assert not diff.passed and {"klom_pvalue/forget", "acc/forget"} <= set(diff.checks)
    eps = evaluate_gate("retrain_equivalence", m, _gate("epsilon"), exact=True)
    assert eps.passed and set(eps.checks) == {"epsilon_upper/forget"}
    over = evaluate_gate("retrain_equivalence", m, _gate("epsilon", budget=1.4), exact=True)
    assert not over.passed and over.failures[0].startswith("epsilon_upper/forget = 1.5000 (needs <= 1.4)")
    # an exact retrain over the budget failed a statistical check only: the gate's false reject
    assert over.failed_on_statistics_only() and over.checks["epsilon_upper/forget"].kind == "statistical"
    assert "gate defect" in over.failures[-1]


def test_interim_look_rejects_on_the_lower_bound_under_epsilon():
    gate = _gate("epsilon", budget=2.0)
    v, decision, failing = _interim(_measures(upper=9.0, lower=2.5, pvalue=0.9), gate)
    assert decision == "reject" and not v.passed and "epsilon lower bound 2.5000 > 2" in failing[0]
    _, decision, _ = _interim(_measures(upper=9.0, lower=1.9, pvalue=1e-6), gate)
    assert decision == "continue"  # the upper bound decides only at the last look; the p-value not at all
    _, decision, _ = _interim(_measures(upper=9.0, lower=1.9, pvalue=1e-6), _gate("difference"))
    assert decision == "reject"  # the difference criterion unchanged
    look = Look(16, 16, 0.0025, {"forget": 2.5}, "reject", 0.0, failing, budget=2.0)
    assert "epsilon lower bounds (budget 2)" in look.line("do_nothing", 0, 3)


def _logits(rng, n_models, n, shift=0.0):
    base = np.random.default_rng(0).normal(0, 1, (n, 3))
    z = base[None] + rng.normal(0, 0.7, (n_models, n, 3))
    z[..., 0] += shift
    return z


def _sequential(seed, shift, gate, alpha=0.05, looks=(8, 16, 32), n=30):
    """The looks on fresh draws; -> (the look that decided, passed)."""
    rng = np.random.default_rng(seed)
    alphas = alpha_schedule(alpha, len(looks) - 1, 0.5)
    labels, splits = np.zeros(n, dtype=int), np.array(["forget"] * n)
    unl, orc = _logits(rng, looks[-1], n, shift), _logits(rng, looks[-1], n)
    criterion = Criterion.of(gate, [(m, m) for m in looks], alphas, [permutations_for(a, 99) for a in alphas])
    done = certify_logits(criterion, orc[:1], lambda spec: References(unl[:spec.n_shadows], orc[:spec.n_oracles]),
                          labels, splits, seed=seed)
    assert all(m.epsilon is not None for m in done.result.measures)  # measured at every look
    return len(done.looks) - 1, done.verdict.passed


def test_sequential_epsilon_accepts_a_retrain_and_rejects_a_far_candidate_early():
    gate = _gate("epsilon", budget=3.5, estimator="gaussian", quantile=0.9)
    assert _sequential(1, 0.0, gate) == (2, True)  # a true retrain: accepted at the last look
    assert _sequential(2, 3.0, gate) == (0, False)  # rejected at the first look


def test_threshold_estimator_cannot_certify_at_small_n():
    """Its Clopper-Pearson upper bound sits above its own cap log(N (1 - delta)) at these N: a retrain is never
    accepted at a budget that rejects a far candidate (docs/certificate.md, the estimators' table)."""
    strict = _gate("epsilon", budget=0.25, estimator="threshold", quantile=0.9)
    assert _sequential(2, 3.0, strict) == (0, False)
    assert _sequential(1, 0.0, strict) == (2, False)
    loose = _gate("epsilon", budget=9.0, estimator="threshold", quantile=0.9)
    assert _sequential(2, 3.0, loose) == (2, True)


def test_config_keys_and_errors():
    p = parse_params({"gate": {"criterion": "epsilon", "epsilon": {"max": 1.5, "delta": 1e-5, "quantile": 0.9,
                                                                   "estimator": "threshold"}}})
    assert p.gate.criterion == "epsilon" and p.gate.epsilon.max == 1.5 and p.gate.epsilon.estimator == "threshold"
    assert parse_params({}).gate.criterion == "difference"  # the default stays the difference question
    with pytest.raises(ConfigError, match="gate.criterion = 'equivalence'"):
        parse_params({"gate": {"criterion": "equivalence"}})
    with pytest.raises(ConfigError, match="gate.epsilon.quantile"):
        parse_params({"gate": {"epsilon": {"quantile": 0}}})
    with pytest.raises(ConfigError, match="gate.epsilon.budget"):
        parse_params({"gate": {"epsilon": {"budget": 1.0}}})
    assert parse_params({}).gate.epsilon.aggregate == "quantile"
    assert parse_params({"gate": {"epsilon": {"aggregate": "mean", "row_cap": 5}}}).gate.epsilon.row_cap == 5
    with pytest.raises(ConfigError, match="aggregate = 'mean' needs estimator = 'gaussian'"):
        parse_params({"gate": {"epsilon": {"aggregate": "mean", "estimator": "threshold"}}})
    with pytest.raises(ConfigError, match="gate.epsilon.aggregate"):
        parse_params({"gate": {"epsilon": {"aggregate": "median"}}})


def test_compared_with_references_but_no_epsilon_never_passes_under_epsilon():
    m = _measures(upper=1.0, lower=0.1, pvalue=0.9, epsilon=False)
    v = evaluate_gate("retrain_equivalence", m, _gate("epsilon"))
    assert not v.passed and "not measured" in v.failures[0]
