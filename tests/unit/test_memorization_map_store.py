"""The map of a model version as the shell keeps it (tasks/memorization_map.py): the planner's size and cost, the
record's round trip and erasure, when it is stale, when its cuts are refitted, and the audit's draw
(tasks/licensing.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest

from tasks.batch_settings import BatchSettings
from tasks.licensing import audit_due, failing_scores
from tasks.memorization_map import (
    MapRecord, MapSettings, cut_key, fit_map_cuts, load_map, map_key, map_plan, save_map, stale_reason,
)
from unlearning.config import parse_params
from unlearning.planning.costs import CostCurve
from unlearning.licensing.decision import Cuts
from unlearning.licensing.memorization import MemorizationMap
from unlearning.planning.plan import Timing


def settings_at(tmp_path, **over) -> MapSettings:
    return BatchSettings.of(parse_params({"deletion": {"hash_sample_ids": False}, **over}, root=tmp_path)).map_settings


def timing(step_seconds: float, slope: float) -> Timing:
    """One member's step `step_seconds`, each more member `slope` more; a retrain of 100 steps."""
    curve = CostCurve((1, 8), (step_seconds, step_seconds + 7 * slope))
    return Timing(retrain_seconds=100 * step_seconds, member_seconds=100 * step_seconds, eval_seconds_per_member=0.0,
                  curve=curve, steps=100)


def test_the_planner_sizes_the_map_within_its_budget_in_retrains(tmp_path):
    cfg = settings_at(tmp_path, train={"epochs": 1, "batch_size": 10})
    # 2000 rows: a retrain is 200 steps of a batch; a half-data member 100 steps. Timing: 100 steps per retrain.
    t = timing(0.01, 0.001)  # a vectorized member costs a tenth of one alone
    cheap = map_plan(cfg, t, n_rows=2000)
    # half the rows: 100 steps, as the retrain's 100 (2000 rows in batches of 10 is 200: the timing counts 100)
    cost = lambda n: t.references_seconds(n, 32) / t.retrain_seconds  # noqa: E731
    assert cheap.affordable and cheap.members % 2 == 0 and cheap.retrains == pytest.approx(cost(cheap.members))
    assert cheap.retrains <= 8.0 < cost(cheap.members + 2)  # the most members within the budget
    fixed_cost = map_plan(cfg, timing(0.01, 0.001), n_rows=4000)  # twice the rows: each step counts twice
    assert fixed_cost.retrains == pytest.approx(2 * cost(fixed_cost.members))
    none = map_plan(cfg, timing(0.01, 0.02), n_rows=2000)  # 16 members cost 16 x (1 + ...) retrains
    assert not none.affordable and none.members is None and "max_retrains" in none.reason
    assert "nothing is licensed" in none.line(100)
    fixed = map_plan(settings_at(tmp_path, licensing={"map": {"members": 8}}), timing(0.01, 0.02), n_rows=2000)
    assert fixed.affordable and fixed.members == 8


def record_of(ids, upper, members=8) -> MapRecord:
    n = len(ids)
    m = MemorizationMap(point=np.asarray(upper) / 2, lower=np.zeros(n), upper=np.asarray(upper, float),
                        mu=np.linspace(0, 1, n), loss=np.ones(n), n_members=members, delta=1e-3, confidence=0.9)
    return MapRecord(list(ids), m, {"members": members}, {"rows": n})


def test_a_record_round_trips_and_an_erasure_drops_and_counts_its_rows(tmp_path):
    cfg = settings_at(tmp_path)
    r = dataclasses.replace(record_of(["a", "b", "c"], [0.5, 1.5, 9.0]), cuts=Cuts((2.0, None), 0.05, 3))
    save_map(cfg.paths, r)
    back = load_map(cfg.paths)
    assert back.ids == ["a", "b", "c"] and back.cuts == r.cuts and back.map.upper.tolist() == [0.5, 1.5, 9.0]
    assert back.scores(["c", "zz", "a"], "upper")[[0, 2]].tolist() == [9.0, 0.5] and np.isnan(back.scores(["zz"],
                                                                                                          "upper")[0])
    less = back.without({"b"})
    assert less.ids == ["a", "c"] and less.removed == 1 and less.scores(["c"], "upper").tolist() == [9.0]
    assert back.without({"zz"}) is back
    (cfg.paths.path("cache_dir") / "memorization" / "map.json").write_text("{not json")
    assert load_map(cfg.paths) is None  # a cache, rebuilt when unreadable


def state_of(ids, status=None):
    manifest = pd.DataFrame({"sample_id": ids, "split": "train", "status": status or ["retained"] * len(ids)})
    return NS(manifest=manifest, prepared=NS(info={"name": "digits", "in_shape": [4]}, in_shape=[4], n_classes=3),
              champion={})


def test_a_map_is_stale_when_a_row_lacks_an_entry_or_the_erased_rows_pass_the_debt_share(tmp_path):
    cfg = settings_at(tmp_path)
    ids = [f"r{i}" for i in range(20)]
    state = state_of(ids)
    members = 8
    r = dataclasses.replace(record_of(cfg.ids.ledger_keys(ids), np.ones(20), members),
                            key=map_key(cfg, state.prepared, members))
    assert stale_reason(cfg, state, None, None) == "no map yet"
    assert stale_reason(cfg, state, r, members) is None
    assert "no entry" in stale_reason(cfg, state_of(ids + ["new"]), r, members)
    five_gone = r.without({f"r{i}" for i in range(5)})  # 5 of 20 = 0.25: not above licensing.map.max_erased_fraction
    assert stale_reason(cfg, state_of(ids, ["deleted"] * 5 + ["retained"] * 15), five_gone, members) is None
    six_gone = r.without({f"r{i}" for i in range(6)})
    assert "erased since it was built" in stale_reason(
        cfg, state_of(ids, ["deleted"] * 6 + ["retained"] * 14), six_gone, members)
    other = settings_at(tmp_path, train={"lr": 0.5})
    assert "another architecture, recipe" in stale_reason(other, state, r, members)


def test_cuts_are_fitted_once_for_the_settings_and_again_when_they_move(tmp_path, monkeypatch):
    import tasks.memorization_map as mm

    cfg = settings_at(tmp_path, licensing={"min_calibration_rows": 1})
    fits = []

    def fake_fail(p, m):
        fits.append(p.licensing.target)
        return np.where(m.upper > 1.0, 1.0, 0.0), 0.0

    monkeypatch.setattr(mm, "calibration_fail_probability", fake_fail)
    r = record_of(["a", "b", "c", "d"], [0.2, 0.8, 1.5, 3.0])
    fitted, _ = fit_map_cuts(cfg, r)
    assert fitted.cuts.for_rows(1) == 0.8 and fitted.cut_key == cut_key(cfg)
    again, seconds = fit_map_cuts(cfg, fitted)
    assert again is fitted and seconds == 0.0 and len(fits) == 1
    moved = settings_at(tmp_path, licensing={"min_calibration_rows": 1, "target": 0.5})
    refit, _ = fit_map_cuts(moved, fitted)
    assert len(fits) == 2 and refit.cut_key == cut_key(moved) and refit.cuts.for_rows(1) == 3.0  # half may fail


def test_the_audit_draw_is_seeded_by_the_batch_and_follows_the_probability():
    draws = [audit_due(0.3, 0, i) for i in range(400)]
    assert draws == [audit_due(0.3, 0, i) for i in range(400)]
    assert 0.2 < np.mean(draws) < 0.4
    assert not any(audit_due(0.0, 0, i) for i in range(50)) and all(audit_due(1.0, 0, i) for i in range(50))


def test_a_failed_audit_blames_the_rows_above_the_budget_or_else_all_of_them():
    assert failing_scores([0.5, 1.2, 2.0], [1.0, 3.5, 2.0], 3.0) == [1.2]
    assert failing_scores([0.5, 1.2], [1.0, 2.0], 3.0) == [0.5, 1.2]  # another split failed: every row
    assert failing_scores([0.5, 1.2], [], 3.0) == [0.5, 1.2]


@pytest.mark.parametrize("key", ["budget", "references", "confidence", "target", "score"])
def test_the_cut_key_names_what_the_cuts_depend_on(tmp_path, key):
    assert key in cut_key(settings_at(tmp_path))


def test_a_stale_map_that_did_not_pay_is_not_built_again(tmp_path):
    from tasks.memorization_map import stored_map

    cfg = settings_at(tmp_path)
    ids = [f"r{i}" for i in range(20)]
    members = 8
    r = dataclasses.replace(record_of(cfg.ids.ledger_keys(ids), np.ones(20), members), key={"other": 1},
                            built={"rows": 20, "predicted_retrains": 5.0}, decided=30, licensed=2)
    save_map(cfg.paths, r)
    record, line, worth = stored_map(cfg, state_of(ids))
    assert record is None and not worth and "does not pay" in line
    save_map(cfg.paths, dataclasses.replace(r, licensed=6))  # it paid: a new one is worth building
    record, line, worth = stored_map(cfg, state_of(ids))
    assert record is None and worth and "another architecture" in line
