"""The gate's validation floors compare the validation rows a batch does not entangle (docs/design.md §4.4-4.5):
a whole-class erasure loses that class's validation rows by construction, a drop reported, never gated; and a batch
no candidate passes is held for a person, with the params an approval runs with."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from unlearning.batch.rows import BatchRows, sampled_for_certificate, validation_adjacent_mask
from unlearning.config import Gate, parse_params
from unlearning.certificate.gate import SplitMeasures, evaluate_gate
from unlearning.batch.quality import accuracy_change_lines, accuracy_changes, entangled_accuracies


def manifest() -> pd.DataFrame:
    # 6 training rows (2 of class a, 2 of b, 2 without a group), 5 validation rows
    return pd.DataFrame({"sample_id": [f"s{i}" for i in range(11)],
                         "split": ["train"] * 6 + ["val"] * 5,
                         "group": ["a", "a", "b", "b", None, None, "a", "b", "b", None, "a"]})


def test_validation_rows_sharing_a_group_with_the_forget_set_are_entangled():
    m = manifest()
    validation = np.arange(6, 11)
    assert validation_adjacent_mask(m, np.array([0, 1]), validation).tolist() == [True, False, False, False, True]
    assert validation_adjacent_mask(m, np.array([4]), validation).tolist() == [False] * 5  # no group: none
    assert validation_adjacent_mask(m, np.array([0, 2]), validation).tolist() == [True, True, True, False, True]


def test_remote_validation_marks_the_evaluated_rows_the_floors_compare():
    rows = BatchRows(before=np.arange(6), forget=np.array([0, 1]), retain=np.arange(2, 6),
                     adjacent_mask=np.array([False, False, False, False]), validation=np.arange(6, 11),
                     validation_adjacent=np.array([True, False, False, False, True]))
    eval_rows, splits = rows.eval_rows()
    remote = rows.remote_validation()
    assert remote.shape == splits.shape and remote.tolist() == [False] * 6 + [False, True, True, True, False]
    assert (splits[remote] == "validation").all()
    sampled = sampled_for_certificate(rows, 3, seed=0)  # sampled with its validation rows, mask and all
    assert len(sampled.validation) == len(sampled.validation_adjacent) == 3
    old = BatchRows(before=rows.before, forget=rows.forget, retain=rows.retain, adjacent_mask=rows.adjacent_mask,
                    validation=rows.validation)
    assert old.remote_validation() is None and sampled_for_certificate(old, 3, 0).validation_adjacent is None


def test_entangled_accuracies_against_a_float64_count():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 40)
    splits = np.array(["forget"] * 10 + ["remote"] * 10 + ["validation"] * 20)
    remote = np.zeros(40, bool)
    remote[20:32] = True
    cand, orig = rng.normal(size=(1, 40, 3)), rng.normal(size=(1, 40, 3))
    out = entangled_accuracies(cand, orig, labels, splits, remote)
    ref = lambda logits, rows: float(np.mean(np.argmax(logits[0, rows].astype(np.float64), -1) == labels[rows]))
    assert out["acc/validation_remote"] == pytest.approx(ref(cand, slice(20, 32)))
    assert out["original_acc/validation_adjacent"] == pytest.approx(ref(orig, slice(32, 40)))
    assert out["n/validation_remote"] == 12 and out["n/validation_adjacent"] == 8
    assert entangled_accuracies(cand, orig, labels, splits, None) == {}


def test_the_floors_read_the_remote_validation_rows_when_the_batch_has_any():
    gate = Gate()  # max_validation_drop 0.05 (retrain_equivalence)
    whole = SplitMeasures("validation", 0.86, n=40, original_acc=0.95)  # the erased class's rows are gone
    remote = SplitMeasures("validation_remote", 0.951, n=36, original_acc=0.95)
    verdict = evaluate_gate("retrain_equivalence", [whole, remote], gate)
    assert verdict.passed and verdict.checks["acc/validation_drop"].rows == "validation_remote"
    verdict = evaluate_gate("retrain_equivalence", [whole, replace(remote, acc=0.60)], gate)
    assert not verdict.passed and verdict.checks["acc/validation_drop"].value == 0.60
    from unlearning.batch.summary import failing_checks_in_words

    assert failing_checks_in_words(verdict.to_dict()["checks"]) == [
        "validation accuracy on the rows the batch does not entangle 0.6 fell below the original's minus the tolerance "
        "(0.9; gate.<objective>.max_validation_drop)"]
    everything_entangled = evaluate_gate("retrain_equivalence", [whole], gate)  # no remote row: all of them
    assert not everything_entangled.passed and everything_entangled.checks["acc/validation_drop"].rows is None
    absolute = Gate(retrain_equivalence={"min_validation_accuracy": 0.9})
    assert evaluate_gate("retrain_equivalence", [whole, remote], absolute).passed


def test_the_certifier_adds_the_remote_and_adjacent_validation_rows_as_split_records():
    from unlearning.certificate.acceptance import entangled_measures

    labels = np.array([0, 1, 0, 1, 0, 1])
    splits = np.array(["forget", "validation", "validation", "validation", "validation", "remote"])
    remote = np.array([False, True, True, False, False, False])
    candidate = np.eye(2)[[0, 1, 1, 1, 1, 1]][None]  # [1, 6, 2]: right on rows 0, 1, 3, 5
    original = np.eye(2)[labels][None]
    got = {m.split: m for m in entangled_measures(candidate, original, labels, splits, remote)}
    assert (got["validation_remote"].acc, got["validation_remote"].n, got["validation_remote"].original_acc) == (0.5, 2, 1.0)
    assert (got["validation_adjacent"].acc, got["validation_adjacent"].n) == (0.5, 2)
    assert entangled_measures(candidate, original, labels, splits, None) == ()


def test_the_accuracy_changes_say_which_one_is_gated():
    m = {"original_acc/forget": 1.0, "acc/forget": 0.0, "n/forget": 143.0, "original_acc/validation": 0.95,
         "acc/validation": 0.86, "original_acc/validation_remote": 0.95, "acc/validation_remote": 0.951}
    assert accuracy_changes(m) == {"drop/forget": 1.0, "drop/validation_remote": -0.001, "drop/validation": 0.09}
    assert accuracy_change_lines(m) == [
        "the forgotten rows, 143 row(s): 1.000 -> 0.000 (-1.000), reported, not gated",
        "validation rows not entangled: 0.950 -> 0.951 (+0.001), gated by the validation floors",
        "all validation rows: 0.950 -> 0.860 (-0.090), reported, not gated"]


@pytest.mark.parametrize("sharded", [False, True])
def test_an_approval_runs_an_exact_method_with_every_floor_open(sharded):
    from tasks.held import approval_overrides
    from unlearning.config import EXACT_RETRAIN, SHARDED_EXACT, deep_merge

    base = {"train": {"sharding": {"shards": 4}}} if sharded else {}
    params = parse_params(deep_merge(deep_merge(base, {"quality": {"refuse": ["class_lost"]},
                                                       "validation": {"mode": "qualified"}}),
                                     approval_overrides(sharded)))
    assert params.deletion.method == (SHARDED_EXACT if sharded else EXACT_RETRAIN)
    assert params.quality.refuse == [] and params.validation.mode == "per_batch"
    g = params.gate
    assert g.exact_retrain_overrides and g.retrain_equivalence.max_validation_drop is None
    assert g.retrain_equivalence.min_validation_accuracy is None
    assert (g.suppression.max_forget_accuracy, g.suppression.min_adjacent_retention) == (1.0, 0.0)
    verdict = evaluate_gate("suppression", [SplitMeasures("forget", 0.9), SplitMeasures("adjacent", 0.1, original_acc=0.9),
                                            SplitMeasures("validation", 0.1, original_acc=0.9)], g)
    assert verdict.passed


def test_held_batches_are_listed_oldest_first_with_their_age(tmp_path):
    from tasks.held import age_text, held_batches, hold

    from tests.helpers import make_project
    from unlearning.config import load_params

    params = load_params(make_project(tmp_path, inbox_files=False))
    inbox = params.path("inbox")
    for name in ("b.csv", "a.csv"):
        (inbox / name).write_text("request_id,sample_id,requested_at,reason\n")
    error = RuntimeError("no candidate passed the gate for b.csv")
    error.batch_id, error.run_id, error.failing_checks = "batch-1", "run-1", ["retrain: validation accuracy 0.6 ..."]
    before = time.time()
    dest = hold(inbox / "b.csv", params.project_paths, error, "3")
    after = time.time()
    assert dest == params.path("held") / "b.csv" and not (inbox / "b.csv").exists()
    (inbox / "a.csv").rename(params.path("held") / "a.csv")  # held, its report lost (a kill between the two)
    os.utime(params.path("held") / "a.csv", (1, 1))  # its age is the file's: the oldest
    listed = held_batches(params.project_paths)
    assert [h["file"] for h in listed] == ["a.csv", "b.csv"]
    b = listed[1]
    assert b["batch_id"] == "batch-1" and b["failing_checks"] == error.failing_checks
    held_at = datetime.fromisoformat(b["held_at"]).timestamp()  # the report's time: when hold() ran
    assert before - 1e-3 <= held_at <= after + 1e-3
    assert held_batches(params.project_paths, now=held_at)[1]["age_seconds"] == 0
    assert held_batches(params.project_paths, now=held_at + 86400)[1]["age_seconds"] == 86400
    assert [age_text(s) for s in (59, 7 * 60, 2 * 3600 + 300, 3 * 86400 + 4 * 3600)] == \
        ["0 min", "7 min", "2 h 5 min", "3 d 4 h"]
