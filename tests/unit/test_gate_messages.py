"""Gate messages: a value below its bound never prints as equal to it (2/201 = 0.00995 against alpha = 0.01
read "0.0100 (needs >= 0.01)"), and a gate rejection's error.json names each failing check in words, with its
value and its bound (the MLflow artifact and the rejected file's report)."""

from __future__ import annotations

import json
import random
from pathlib import Path


from unlearning.batch.summary import CandidateLine, check_in_words
from unlearning.config import Gate
from unlearning.certificate.gate import SplitMeasures, _check, format_beside, verdict_summary, Verdict
from unlearning.sequential import Criterion

P = 2 / 201  # the smallest p-value of 200 permutations with one more extreme: just below alpha = 0.01


def test_a_pvalue_below_alpha_never_prints_as_alpha():
    checks, failures = {}, []
    _check(checks, failures, "klom_pvalue/forget", P, ">=", 0.01)
    assert failures == ["klom_pvalue/forget = 0.00995 (needs >= 0.01)"]
    summary = verdict_summary(Verdict(False, "retrain_equivalence", failures, checks), 0.01)
    assert "forget 0.00995" in summary and "0.010" not in summary.split("alpha")[0]
    assert "p = 0.009999 < alpha = 0.01" in check_in_words("klom_pvalue/forget",
                                                           {"value": 0.009999, "limit": 0.01, "op": ">="})
    c = Criterion.of(Gate(), [(16, 16), (80, 80)], [0.01, 0.01], [799, 799])
    assert c.judge([SplitMeasures("forget", 1.0, pvalue=P)], c.looks[0]).failures == [
        "rejected at interim look 1: forget: p = 0.00995 < 0.01"]


def test_ordinary_values_keep_their_short_form():
    assert format_beside(0.25, 0.01) == "0.2500" and format_beside(0.01, 0.01) == "0.0100"
    assert format_beside(float("nan"), 0.01) == "nan"
    assert check_in_words("acc/validation_min", {"value": 0.5, "limit": 0.9, "op": ">="}).startswith(
        "validation accuracy 0.5 is below")


def test_the_printed_value_is_on_the_same_side_of_the_bound_float64_reference():
    """Against exact float64 comparison: random values at, just below and just above random bounds."""
    rng = random.Random(0)
    for _ in range(2000):
        bound = rng.choice([0.01, 0.05, 1 / 3, 0.9, rng.random()])
        value = bound + rng.choice([0.0, 1e-3, -1e-3, 1e-7, -1e-7, 1e-12, -1e-12]) * rng.random()
        text = format_beside(value, bound)
        assert (float(text) > bound) - (float(text) < bound) == (value > bound) - (value < bound), (value, bound, text)


class _Tracker:
    def __init__(self):
        self.logged = {}

    def log_json(self, run, obj, name):
        self.logged[name] = obj

    def set_tags(self, *a, **k):
        pass

    def end_run(self, *a, **k):
        pass


def test_a_gate_rejection_names_each_failing_check_with_value_and_bound(tmp_path, monkeypatch):
    import tasks.stages as S
    from flows.deletion_batch import BatchRejected, reject
    from tests.helpers import make_project
    from unlearning.config import load_params

    monkeypatch.setattr(S, "publish_summary", lambda *a, **k: "")
    checks = {"klom_pvalue/forget": {"value": P, "op": ">=", "limit": 0.01, "passed": False},
              "acc/validation_min": {"value": 0.81, "op": ">=", "limit": 0.85, "passed": False},
              "klom_pvalue/remote": {"value": 0.4, "op": ">=", "limit": 0.01, "passed": True}}
    batch = S.BatchRun(_Tracker(), "run-1", Path("a.csv"), "batch-x", "cpu",
                       {"candidates": [CandidateLine("finetune", False, 1.0, checks)]})
    error = BatchRejected("no candidate passed the gate for a.csv; the previous champion stays")
    S.fail(batch, error, rejected=True)
    expected = ["finetune: forget: the KLoM of the unlearned models to the oracles is unusual for two sets of "
                "retrains (permutation p = 0.00995 < alpha = 0.01)",
                "finetune: validation accuracy 0.81 is below the floor "
                "gate.retrain_equivalence.min_validation_accuracy = 0.85"]
    assert batch.tracker.logged["error.json"]["failing_checks"] == expected

    params = load_params(make_project(tmp_path, inbox_files=False))
    request = params.path("inbox") / "a.csv"
    request.write_text("x")
    dest = reject(request, params, error)
    report = json.loads(dest.with_name(dest.name + ".error.json").read_text())
    assert report["problems"] == [str(error), *expected] and report["failing_checks"] == expected
    assert report["error"] == "BatchRejected"


def test_a_validation_rejection_keeps_its_problem_lines(tmp_path):
    from flows.deletion_batch import reject
    from tests.helpers import make_project
    from unlearning.config import load_params
    from unlearning.requests import RequestValidationError

    params = load_params(make_project(tmp_path, inbox_files=False))
    request = params.path("inbox") / "b.csv"
    request.write_text("x")
    dest = reject(request, params, RequestValidationError(request, ["row 1: bad"]))
    report = json.loads(dest.with_name(dest.name + ".error.json").read_text())
    assert report["problems"] == ["row 1: bad"] and "failing_checks" not in report


