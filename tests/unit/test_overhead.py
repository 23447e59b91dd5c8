"""unlearning/planning/overhead.py: one accounting of a batch's wall time (the same phases in its plan and its plan-vs-actual
line, summing to the total), the project's history the plan learns the fixed phases from, and the parts outside
the batch."""

from __future__ import annotations

import json

import pytest

from unlearning.planning.overhead import (
    DEFAULT_FIXED_S, DEFAULT_OUTSIDE_S, FILE, FIXED_PHASES, PARTS, PHASES, History, account, outside_costs,
    plan_vs_actual_line, predict, predicted_line, total, write_fixed_costs,
)


def test_the_phases_never_overlap_and_sum_to_the_wall_time():
    """The contradictions the phases fix: references trained in parallel chunks (their seconds summed past the
    wall time) inside a candidate, and MLflow calls inside every phase, counted twice."""
    intervals = {
        "validation": [(0.0, 2.0)],
        "tracking": [(1.5, 2.5), (5.0, 5.5), (9.0, 10.0)],  # inside validation, candidates, erase
        "candidates": [(3.0, 8.0)],
        "references": [(3.5, 7.0), (3.5, 6.0), (4.0, 7.0)],  # two chunks side by side: 3.5 s of wall, not 9
        "erase": [(8.5, 10.5)],
        "diagnostics": [(-5.0, 0.5)],  # started before the batch: clipped to it (and validation overlaps it)
    }
    got = account(0.0, 12.0, intervals)
    assert list(got) == list(PHASES)
    assert got["tracking"] == pytest.approx(2.5)
    assert got["references"] == pytest.approx(3.5 - 0.5)  # 3.5-7.0 less the MLflow call at 5.0-5.5
    assert got["candidates"] == pytest.approx(5.0 - 3.5)  # 3.0-8.0 less the references
    assert got["erase"] == pytest.approx(2.0 - 1.0)
    assert got["validation"] == pytest.approx(2.0 - 0.5)
    assert got["diagnostics"] == pytest.approx(0.0)  # 0-0.5 is validation's (PRECEDENCE)
    assert got["orchestration"] == pytest.approx(12.0 - 9.5)  # 2.5-3.0, 8.0-8.5, 10.5-12.0
    assert total(got) == pytest.approx(12.0) and all(v >= 0 for v in got.values())


def test_a_history_learns_the_fixed_phases_and_the_candidates_extra(tmp_path):
    h = History(tmp_path / "costs" / "phases.jsonl")
    fixed, ranges, source = h.fixed()
    assert {k: fixed[k] for k in FIXED_PHASES} == DEFAULT_FIXED_S and source.startswith("defaults")
    for i, (tracking, cand) in enumerate([(2.0, 3.0), (4.0, 5.0), (3.0, 4.0)]):
        actual = dict.fromkeys(PHASES, 1.0) | {"tracking": tracking, "candidates": cand}
        h.add(actual, {"diagnostics": 0.0, "references": 0.0, "candidates": 1.0}, n_forget=20)
    fixed, ranges, source = h.fixed()
    assert fixed["tracking"] == 3.0 and ranges["tracking"] == (2.0, 4.0)
    assert fixed["candidates_extra"] == 3.0 and ranges["candidates_extra"] == (2.0, 4.0)  # actual - predicted
    assert fixed["validation"] == 1.0 and ranges["validation"] == (0.75, 1.33)  # alike batches: at least MIN_RANGE
    assert "last 3 batch(es)" in source
    text = h.path.read_text()
    assert "sample" not in text and all(set(json.loads(line)) == {"at", "n_forget", "actual", "predicted_model"}
                                        for line in text.splitlines())
    h.path.write_text(text + "{not json\n" + json.dumps({"actual": {"tracking": -1}}) + "\n")
    assert len(h.records()) == 3  # a damaged line is left out, not read


def test_the_prediction_has_the_same_phases_and_its_range():
    fixed = {"validation": 1.0, "tracking": 2.0, "erase": 0.5, "orchestration": 3.0, "candidates_extra": 1.0}
    fixed_range = {"validation": (0.5, 2.0), "tracking": (1.0, 3.0), "erase": (0.5, 0.5), "orchestration": (2.0, 4.0),
                   "candidates_extra": (0.5, 1.5)}
    point, ranges = predict({"diagnostics": 0.0, "references": 10.0, "candidates": 4.0}, fixed, fixed_range,
                            model_range=(0.8, 1.5))
    assert list(point) == list(PHASES) == list(ranges)
    assert point["candidates"] == 5.0 and ranges["candidates"] == (4.0 * 0.8 + 0.5, 4.0 * 1.5 + 1.5)
    assert point["references"] == 10.0 and ranges["references"] == (8.0, 15.0)
    assert total(point) == pytest.approx(1 + 0 + 10 + 5 + 2 + 0.5 + 3)
    line = predicted_line(point, ranges, "x")
    assert line.startswith("predicted batch wall time 21.5 s (range 15.7-32.0 s): validation 1.0, diagnostics 0.0")
    # the batch's line: seconds only, the same phases on both sides
    actual = dict(point) | {"references": 12.0}
    line = plan_vs_actual_line(point, ranges, actual)
    assert "predicted 21.5 s (range 15.7-32.0 s;" in line and ", took 23.5 s (" in line
    assert "actual/predicted 1.09, inside the range" in line and "retrain" not in line
    assert plan_vs_actual_line(None, None, actual).startswith("plan vs actual: no plan")


def test_the_parts_outside_the_batch_come_from_the_bench_file_or_the_defaults(tmp_path):
    assert outside_costs(tmp_path)[0] == DEFAULT_OUTSIDE_S
    path = write_fixed_costs(tmp_path, {"stage": 7.04, "erase": 2.96, "other": 1})
    assert path == tmp_path / FILE and json.loads(path.read_text()) == {"stage": 7.0, "erase": 3.0}
    assert outside_costs(tmp_path) == ({"stage": 7.0, "erase": 3.0}, str(path)) and set(PARTS) == {"stage", "erase"}
    path.write_text(json.dumps({"stage": -1, "erase": 2}))
    assert outside_costs(tmp_path)[0] == DEFAULT_OUTSIDE_S
