"""The sequential certificate (unlearning/sequential.py): alpha spending keeps a true retrain's false-reject rate
at most alpha over every look; a far candidate is rejected at the first look."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from unlearning.config import Gate
from unlearning.certificate.gate import SplitMeasures
from unlearning.sequential import (Criterion, alpha_schedule, certify_logits, permutations_for,
                                   reference_prefixes, run_looks)
from unlearning.metrics.permutation import klom_permutation_test  # noqa: F401  (the test the looks run)


def test_alpha_schedule_sums_to_alpha():
    assert alpha_schedule(0.01, 0, 0.5) == (0.01,)
    a = alpha_schedule(0.01, 2, 0.5)
    assert a == pytest.approx((0.0025, 0.0025, 0.005)) and sum(a) == pytest.approx(0.01)


@pytest.mark.parametrize("alpha", [0.0025, 0.005, 0.01, 0.05])
def test_each_look_can_reject(alpha):
    p = permutations_for(alpha, 200)
    assert p >= 200 and 1 / (1 + p) <= alpha / 2


def _interim(pvalues: dict[str, float], alpha_k: float) -> str:
    """The decision of the first of two looks at alpha_k on these p-values (the core's criterion)."""
    c = Criterion.of(Gate(), [(8, 8), (16, 16)], [alpha_k, alpha_k], [799, 799])
    spec = c.looks[0]
    return c.decision(c.judge([SplitMeasures(s, 1.0, pvalue=p) for s, p in pvalues.items()], spec), spec)


def test_interim_rejects_below_alpha_and_nan():
    assert _interim({"forget": 0.002, "validation": 0.5}, 0.0025) == "reject"
    assert _interim({"forget": 0.0025}, 0.0025) == "continue"
    assert _interim({"forget": float("nan")}, 0.0025) == "reject"


def _logits(rng, n_models, n, shift=0.0):
    """[N, n, 3] logits: a per-row mean shared by every model plus model noise; `shift` moves the true class."""
    base = np.random.default_rng(0).normal(0, 1, (n, 3))
    z = base[None] + rng.normal(0, 0.7, (n_models, n, 3))
    z[..., 0] += shift
    return z


def _sequential(rng, shift, alpha, looks=(8, 16, 24), n=30):
    """Run the looks on fresh draws; -> the look index that rejected, or None."""
    gate = Gate(retrain_equivalence={"alpha": alpha, "n_permutations": 99, "min_validation_accuracy": None,
                                     "max_validation_drop": None, "accuracy_z": 50.0})
    alphas = alpha_schedule(alpha, len(looks) - 1, 0.5)
    labels, splits = np.zeros(n, dtype=int), np.array(["forget"] * n)
    unl, orc = _logits(rng, looks[-1], n, shift), _logits(rng, looks[-1], n)
    criterion = Criterion.of(gate, [(m, m) for m in looks], alphas, [permutations_for(a, 99) for a in alphas])
    done = certify_logits(criterion, orc[:1], reference_prefixes(unl, orc), labels, splits, seed=0)
    return None if done.verdict.passed else len(done.looks) - 1


def test_a_true_retrain_is_rejected_at_most_alpha_over_all_looks():
    rng = np.random.default_rng(1)
    trials, alpha = 150, 0.2
    rejected = sum(_sequential(rng, 0.0, alpha) is not None for _ in range(trials))
    # binomial: mean <= 0.2 * 150 = 30, sd 4.9; 3 sd above the bound
    assert rejected <= 30 + 3 * 4.9


def test_a_far_candidate_is_rejected_at_the_first_look():
    rng = np.random.default_rng(2)
    assert [_sequential(rng, 3.0, 0.01) for _ in range(5)] == [0] * 5


# --- the loop itself (run_looks): what it asks of the shell, when it stops ------------------------------------------

def _measures(pvalue: float):
    return [SplitMeasures("forget", 1.0, pvalue=pvalue), SplitMeasures("validation", 1.0, pvalue=0.9)]


def test_the_loop_asks_each_look_once_in_order_and_stops_at_the_first_reject():
    criterion = Criterion.of(Gate(), [(16, 16), (32, 32), (80, 80)], [0.0025, 0.0025, 0.005], [799, 799, 399])
    asked, told = [], []
    pvalues = {16: 0.5, 32: 0.001, 80: 0.5}  # decisive at the second look

    def measure(spec):
        asked.append((spec.index, spec.n_shadows, spec.n_oracles, spec.alpha, spec.n_permutations))
        return SimpleNamespace(measures=_measures(pvalues[spec.n_oracles]))

    done = run_looks(criterion, measure, on_look=lambda look, spec: told.append((look.decision, spec.index)))
    assert asked == [(0, 16, 16, 0.0025, 799), (1, 32, 32, 0.0025, 799)]  # the 80 + 80 never trained
    assert told == [("continue", 0), ("reject", 1)] and done.decision == "reject" and not done.accepted
    assert done.alpha == 0.0025 and done.looks[1].failing == ("forget: p = 0.0010 < 0.0025",)
    assert done.verdict.failures == ["rejected at interim look 2: forget: p = 0.0010 < 0.0025"]
    assert done.looks[0].tested == {"forget": 0.5, "validation": 0.9}
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.looks[0].decision = "reject"


def test_only_the_last_look_accepts_with_the_whole_gate():
    gate = Gate(retrain_equivalence={"min_validation_accuracy": None, "max_validation_drop": None})
    criterion = Criterion.of(gate, [(16, 16), (80, 80)], [0.0025, 0.0075], [799, 266], exact=True)
    done = run_looks(criterion, lambda spec: SimpleNamespace(measures=_measures(0.5)))
    assert [lk.decision for lk in done.looks] == ["continue", "final"] and done.accepted and done.alpha == 0.0075
    failed = run_looks(criterion, lambda spec: SimpleNamespace(measures=_measures(0.5 if spec.index == 0 else 0.006)))
    assert failed.decision == "final" and not failed.accepted
    assert failed.verdict.failed_on_statistics_only() and "gate defect" in failed.verdict.failures[-1]  # exact


def test_a_criterion_needs_its_looks():
    with pytest.raises(ValueError, match="at least one look"):
        Criterion.of(Gate(), [])
    with pytest.raises(ValueError, match="one alpha and one relabeling count each"):
        Criterion.of(Gate(), [(16, 16), (80, 80)], [0.01])
    one = Criterion.of(Gate(), [(79, 79)])  # an audit: one look at the gate's alpha and relabelings
    assert one.looks[0].final and one.looks[0].alpha == 0.01 and one.looks[0].n_permutations == 200
