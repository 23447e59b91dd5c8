"""The certifier and the acceptance rule in the core (unlearning/certificate/acceptance.py): typed records per split, and
which candidate a batch takes."""

import numpy as np
import pandas as pd
import torch

from unlearning.certificate.acceptance import CandidateOutcome, accept, reference_free_outcome, split_records
from unlearning.config import Gate
from unlearning.certificate.gate import BUSINESS, STATISTICAL, Check, Verdict
from unlearning.models import build_model

SPLITS = np.array(["forget"] * 4 + ["adjacent"] * 3 + ["remote"] * 3 + ["validation"] * 10)
LABELS = np.array([0, 1, 0, 1] + [0, 1, 0] + [1, 0, 1] + [0, 1] * 5)


def logits_right(k_wrong: int) -> torch.Tensor:
    """[1, n, 2] logits that get every label right except the first k_wrong validation rows."""
    z = torch.zeros(1, len(LABELS), 2)
    z[0, torch.arange(len(LABELS)), torch.as_tensor(LABELS)] = 3.0
    val = np.flatnonzero(SPLITS == "validation")[:k_wrong]
    z[0, val] = z[0, val].flip(-1)
    return z


def model():
    return build_model({"arch": "mlp", "in_shape": [2], "n_classes": 2, "kwargs": {"hidden": [2]}}, [0])


def outcome(method: str, cand: torch.Tensor, orig: torch.Tensor) -> CandidateOutcome:
    return reference_free_outcome(method, model(), cand, orig, LABELS, SPLITS, np.arange(len(LABELS)).astype(str),
                                  Gate(), "retrain_equivalence", {}, 0.0)


def test_an_exact_retrain_is_judged_against_the_original_by_the_relative_floor():
    ok = outcome("retrain", logits_right(1), logits_right(0))  # validation 0.9 vs the original's 1.0: drop 0.1
    assert not ok.verdict.passed and "acc/validation_drop" in ok.verdict.checks
    assert ok.verdict.checks["acc/validation_drop"]["limit"] == 0.95
    assert outcome("retrain", logits_right(0), logits_right(0)).verdict.passed
    assert accept(ok, exact_retrain_overrides=True).accepted is False  # a floor binds a retrain too


def test_split_records_are_typed_per_split():
    rec = {r.split: r for r in split_records(outcome("retrain", logits_right(1), logits_right(0)))}
    assert list(rec) == ["forget", "adjacent", "remote", "validation"]
    assert rec["validation"].accuracy == 0.9 and rec["validation"].original_accuracy == 1.0
    assert rec["validation"].passed is False and rec["forget"].passed is True
    assert rec["forget"].interval is None and rec["forget"].pvalue is None  # no references: not measured


def test_accept_takes_a_pass_and_an_audited_retrain_failing_statistical_checks_only():
    def out(method, checks):
        v = Verdict(passed=all(c.passed for c in checks.values()), objective="retrain_equivalence", checks=checks)
        return CandidateOutcome(method, model(), {}, v, {}, pd.DataFrame())

    p_fail = {"klom_pvalue/forget": Check(0.001, ">=", 0.01, False, STATISTICAL)}
    floor_fail = {"acc/validation_drop": Check(0.5, ">=", 0.9, False, BUSINESS)}
    assert accept(out("do_nothing", {}), True) == accept(out("retrain", {}), True)
    assert accept(out("do_nothing", {}), True).accepted
    assert accept(out("retrain", p_fail), True).as_false_reject
    assert not accept(out("retrain", p_fail), False).accepted  # gate.exact_retrain_overrides off
    assert not accept(out("do_nothing", p_fail), True).accepted
    assert not accept(out("retrain", floor_fail), True).accepted
