"""Quality changes said out loud: a class that lost all its training rows, a validation drop beyond the declared
tolerance and an unstable recipe (oracles' spread) each warn; `quality.refuse` turns a warning into a refusal."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from unlearning.config import ConfigError, parse_params
from unlearning.batch.quality import QualityFacts, class_counts, quality_warnings, refused

ACC = {"validation": 0.80, "forget": 0.9}


def facts(**kw):
    base = dict(original_accuracy=ACC, champion_accuracy=ACC, class_counts_before={"<=50K": 30, ">50K": 10},
                class_counts_after={"<=50K": 30, ">50K": 10}, oracle_validation_accuracies=[0.79, 0.81])
    return QualityFacts(**{**base, **kw})


def kinds(ws):
    return [w.kind for w in ws]


def test_no_change_no_warning():
    assert quality_warnings(facts(), 0.05, 0.15) == []


def test_a_class_that_lost_every_training_row_warns_by_name():
    (w,) = quality_warnings(facts(class_counts_after={"<=50K": 30, ">50K": 0}), 0.05, 0.15)
    assert w.kind == "class_lost" and "the champion can no longer predict '>50K'" in w.message
    assert "last 10 training row(s)" in w.message
    # a class that had no training row before the batch lost nothing
    assert quality_warnings(facts(class_counts_before={"a": 0}, class_counts_after={"a": 0}), 0.05, 0.15) == []


def test_validation_drop_beyond_the_tolerance_warns():
    drop = facts(original_accuracy={"validation": 0.687}, champion_accuracy={"validation": 0.565})
    (w,) = quality_warnings(drop, 0.05, 0.15)
    assert w.kind == "validation_drop" and "0.687" in w.message and "0.565" in w.message and "-0.122" in w.message
    assert quality_warnings(drop, 0.2, 0.15) == []  # within the declared tolerance
    assert quality_warnings(drop, None, 0.15) == []  # off
    gain = facts(original_accuracy={"validation": 0.5}, champion_accuracy={"validation": 0.9})
    assert quality_warnings(gain, 0.0, 0.15) == []


def test_an_unstable_recipe_warns_and_no_oracles_skip_it():
    (w,) = quality_warnings(facts(oracle_validation_accuracies=[0.275, 0.6, 0.758]), 0.05, 0.15)
    assert w.kind == "unstable_recipe" and "seeds give 0.28-0.76" in w.message and "spread 0.48" in w.message
    assert quality_warnings(facts(oracle_validation_accuracies=None), 0.05, 0.15) == []
    assert quality_warnings(facts(oracle_validation_accuracies=[0.2]), 0.05, 0.15) == []  # one oracle: no spread


def test_refuse_picks_the_named_kinds():
    ws = quality_warnings(facts(class_counts_after={">50K": 0, "<=50K": 30}, oracle_validation_accuracies=[0.1, 0.9]),
                          0.05, 0.15)
    assert kinds(ws) == ["class_lost", "unstable_recipe"]
    assert kinds(refused(ws, ["unstable_recipe"])) == ["unstable_recipe"] and refused(ws, []) == []


def test_class_counts_cover_every_class():
    assert class_counts(np.array([0, 0, 2]), ["a", "b", "c"]) == {"a": 2, "b": 0, "c": 1}


def test_quality_params_are_validated():
    assert parse_params({}).quality.refuse == []
    with pytest.raises(ConfigError, match="quality.refuse"):
        parse_params({"quality": {"refuse": ["class_gone"]}})
    with pytest.raises(ConfigError, match="unknown key 'quality.max_drop'"):
        parse_params({"quality": {"max_drop": 0.1}})


class FakeTracker:
    def __init__(self):
        self.tags, self.json, self.metrics = {}, {}, {}

    def log_metrics(self, run, metrics):
        self.metrics.update(metrics)

    def set_tags(self, run, tags):
        self.tags.update(tags)

    def log_json(self, run, obj, name):
        self.json[name] = obj


def batch_and_state(tmp_path):
    """A batch whose forget set holds every training row of class 1 ('>50K')."""
    label = np.array([0, 0, 0, 1, 1, 0, 1])
    state = SimpleNamespace(prepared=SimpleNamespace(info={"class_names": ["<=50K", ">50K"]}, label=label))
    rows = SimpleNamespace(before=np.arange(5), retain=np.arange(3))  # rows 3, 4 (class 1) forgotten
    batch = SimpleNamespace(path=Path("r.csv"), parent="run-1", tracker=FakeTracker(), summary={},
                            key=lambda what: f"b-{what}")
    metrics = {"original_acc/validation": 0.70, "acc/validation": 0.55, "oracle_acc_min/validation": 0.3,
               "oracle_acc_max/validation": 0.75}
    return batch, SimpleNamespace(metrics=metrics), state, rows


def test_announce_quality_logs_tags_summarises_and_returns_the_lines(tmp_path, monkeypatch):
    import tasks.quality as Q
    from tasks.quality import announce_quality
    from unlearning.batch.summary import summary_markdown

    console, info = [], []
    monkeypatch.setattr(Q, "run_logger", lambda: SimpleNamespace(warning=console.append, info=info.append))
    batch, outcome, state, rows = batch_and_state(tmp_path)
    params = parse_params({})
    lines = announce_quality(batch, outcome, state, rows, params)
    # the accuracy changes are reported (metrics, summary, console) whatever the warnings
    assert batch.tracker.metrics == {"drop/validation": 0.15}
    assert batch.summary["accuracy_changes"] == ["all validation rows: 0.700 -> 0.550 (-0.150), gated by the "
                                                 "validation floors"]
    assert info == ["r.csv: accuracy against the original: " + batch.summary["accuracy_changes"][0]]
    assert [ln.split(":")[0] for ln in lines] == ["the champion can no longer predict '>50K'",
                                                  "validation accuracy fell from 0.700 (the original) to 0.550 (-0.150), "
                                                  "more than quality.max_validation_drop = 0.05",
                                                  "the recipe is unstable"]
    assert console == [f"r.csv: quality: {ln}" for ln in lines]  # the console (Prefect's run logger in a flow)
    assert batch.tracker.tags == {"quality_warnings": "class_lost,validation_drop,unstable_recipe"}
    assert [w["kind"] for w in batch.tracker.json["quality_warnings.json"]["warnings"]] == [
        "class_lost", "validation_drop", "unstable_recipe"]
    assert batch.summary["warnings"] == lines
    md = summary_markdown(request_file="r.csv", batch_id="b", n_forgotten=2, objective="retrain_equivalence",
                          candidates=[], selection={}, chosen="retrain", version_before="1", version_after="2",
                          wall_seconds=1.0, warnings=lines)
    assert "- **Quality warning:** the champion can no longer predict '>50K'" in md
    # every oracle's accuracy, when the caller has them, replaces the metrics' range
    batch2, outcome2, *_ = batch_and_state(tmp_path)
    stable = announce_quality(batch2, outcome2, state, rows, params, oracle_val_accs=[0.7, 0.72])
    assert not any("unstable" in ln for ln in stable)


def test_a_warning_in_refuse_raises_a_rejection_with_exit_3(tmp_path):
    from flows.errors import EXIT_GATE_REJECTED, exit_code
    from tasks.quality import BatchRejected, QualityRefused, announce_quality

    batch, outcome, state, rows = batch_and_state(tmp_path)
    params = parse_params({"quality": {"refuse": ["class_lost"]}})
    with pytest.raises(QualityRefused, match=r"refused by quality.refuse = \['class_lost'\]: the champion can no "
                                             r"longer predict '>50K'") as e:
        announce_quality(batch, outcome, state, rows, params)
    assert isinstance(e.value, BatchRejected) and exit_code(e.value) == EXIT_GATE_REJECTED
    assert len(batch.summary["warnings"]) == 3  # announced before refusing
    assert json.dumps(batch.tracker.json["quality_warnings.json"]["refuse"]) == '["class_lost"]'
