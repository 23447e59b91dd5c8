"""The qualification core (unlearning/certificate/qualification.py): binomial intervals against brute force, the table,
the licensing rule, the audit schedule, the suite draw."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from unlearning.certificate.qualification import (EXACT, Qualification, Trial, audit_due, clopper_pearson, draw_suite,
                                      license_method, licenses_any, pass_rate_table, wilson)


def brute_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) by enumerating every one of the 2^n outcome sequences (no binomial coefficient)."""
    total = 0.0
    for seq in itertools.product((0, 1), repeat=n):
        if sum(seq) >= k:
            total += math.prod(p if s else 1 - p for s in seq)
    return total


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_clopper_pearson_solves_its_tail_equations_by_brute_force(n):
    conf = 0.9
    tail = (1 - conf) / 2
    for k in range(n + 1):
        lo, hi = clopper_pearson(k, n, conf)
        if k == 0:
            assert lo == 0.0
        else:
            assert brute_tail(k, n, lo) == pytest.approx(tail, abs=1e-9)
        if k == n:
            assert hi == 1.0
        else:  # P(X <= k | hi) = tail
            assert 1 - brute_tail(k + 1, n, hi) == pytest.approx(tail, abs=1e-9)


@pytest.mark.parametrize("n", [3, 6])
def test_clopper_pearson_covers_at_least_its_confidence_for_every_p(n):
    conf = 0.8
    intervals = [clopper_pearson(k, n, conf) for k in range(n + 1)]
    for p in np.linspace(0.01, 0.99, 41):
        cover = sum(brute_tail(k, n, p) - brute_tail(k + 1, n, p)
                    for k, (lo, hi) in enumerate(intervals) if lo <= p <= hi)
        assert cover >= conf - 1e-9


def test_clopper_pearson_known_values():
    # all passed: lower = (tail)^(1/n); none passed: upper = 1 - tail^(1/n)
    assert clopper_pearson(10, 10, 0.95)[0] == pytest.approx(0.025 ** 0.1, abs=1e-9)
    assert clopper_pearson(0, 10, 0.95)[1] == pytest.approx(1 - 0.025 ** 0.1, abs=1e-9)
    assert clopper_pearson(0, 0, 0.95) == (0.0, 1.0)


def test_wilson_closed_form_float64():
    # 0/10 at 95 %: upper z^2 / (n + z^2); 10/10: lower n / (n + z^2)
    z = 1.959963984540054
    assert wilson(0, 10, 0.95)[1] == pytest.approx(z * z / (10 + z * z), rel=1e-12)
    assert wilson(10, 10, 0.95)[0] == pytest.approx(10 / (10 + z * z), rel=1e-12)
    lo, hi = wilson(7, 20, 0.95)
    p, n = 0.35, 20
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (lo, hi) == (pytest.approx(c - h, rel=1e-12), pytest.approx(c + h, rel=1e-12))


def trials(method, gaps_passed):
    return [Trial(f"s{i}", "random", 10, method, g, p) for i, (g, p) in enumerate(gaps_passed)]


def test_table_bins_count_each_trial_once():
    ts = trials("do_nothing", [(0.1, True), (0.2, True), (0.3, False), (5.0, False), (float("nan"), True)])
    table = pass_rate_table(ts, ["do_nothing", "finetune"], [0.25, 1.0], 0.9)
    assert [r.row_id for r in table[:3]] == ["do_nothing gap [0, 0.25)", "do_nothing gap [0.25, 1)",
                                             "do_nothing gap [1, inf)"]
    assert [(r.n, r.passes) for r in table] == [(2, 2), (1, 0), (1, 0), (0, 0), (0, 0), (0, 0)]
    assert math.isnan(table[3].rate) and table[3].lower == 0.0
    assert table[0].lower == pytest.approx(clopper_pearson(2, 2, 0.9)[0])


def test_license_takes_the_cheapest_qualified_method_else_retrain():
    ts = (trials("do_nothing", [(0.1, True)] * 30 + [(2.0, False)] * 5)
          + trials("finetune", [(0.1, True)] * 30 + [(2.0, True)] * 30))
    table = pass_rate_table(ts, ["do_nothing", "finetune"], [1.0], 0.9)
    low = license_method(table, 0.3, ["do_nothing", "finetune", EXACT], 0.9)
    assert low.method == "do_nothing" and low.row.row_id == "do_nothing gap [0, 1)"
    high = license_method(table, 3.0, ["do_nothing", "finetune", EXACT], 0.9)
    assert high.method == "finetune" and high.row.passes == 30
    # the point estimate licenses where the lower bound does not (30/30 at 0.95: lower 0.905)
    assert license_method(table, 0.3, ["do_nothing"], 0.95).method == EXACT
    assert license_method(table, 0.3, ["do_nothing"], 0.95, bound="point").method == "do_nothing"
    refused = license_method(table, 3.0, ["do_nothing"], 0.9)
    assert refused.method == EXACT and refused.row is None and "do_nothing gap [1, inf): 0/5" in refused.reason
    assert license_method(table, float("nan"), ["do_nothing"], 0.5).method == EXACT
    # methods after retrain are never licensed: retrain is the last resort
    assert license_method(table, 3.0, [EXACT, "finetune"], 0.9).method == EXACT
    # whether any gap could license a method: then, and only then, a qualified batch's diagnostics matter
    assert licenses_any(table, ["do_nothing", "finetune", EXACT], 0.9)
    assert not licenses_any(table, ["do_nothing"], 0.95) and licenses_any(table, ["do_nothing"], 0.95, "point")
    assert not licenses_any(table, [EXACT, "finetune"], 0.9) and not licenses_any([], ["do_nothing"], 0.0)


def test_audit_schedule_every_and_probability_deterministic():
    assert [audit_due(3, None, 0, b) for b in range(7)] == [True, False, False, True, False, False, True]
    draws = [audit_due(None, 0.3, 5, b) for b in range(2000)]
    assert draws == [audit_due(None, 0.3, 5, b) for b in range(2000)]
    assert 0.25 < np.mean(draws) < 0.35
    assert draws != [audit_due(None, 0.3, 6, b) for b in range(2000)]
    assert not any(audit_due(None, None, 0, b) for b in range(5))
    assert all(audit_due(None, 1.0, 0, b) for b in range(5))


def test_suite_draw_kinds_and_determinism():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 200)
    groups = labels % 2
    train = np.arange(20, 200)
    score = np.arange(len(train), dtype=float)  # row train[i] has score i
    entries = [NS(kind="random", size=10, count=3), NS(kind="class", size=None, count=2),
               NS(kind="group", size=15, count=1), NS(kind="high_self_leverage", size=5, count=2),
               NS(kind="low_self_leverage", size=5, count=1)]
    suite = draw_suite(entries, 0, train, labels, groups, score)
    again = draw_suite(entries, 0, train, labels, groups, score)
    assert [s.name for s in suite] == [s.name for s in again]
    assert all(np.array_equal(a.rows, b.rows) for a, b in zip(suite, again))
    kinds = [s.kind for s in suite]
    assert kinds == ["random"] * 3 + ["class"] * 2 + ["group"] + ["high_self_leverage"] * 2 + ["low_self_leverage"]
    for s in suite:
        assert np.isin(s.rows, train).all() and len(np.unique(s.rows)) == len(s.rows)
    cls = suite[3]
    assert np.array_equal(cls.rows, train[labels[train] == labels[cls.rows[0]]])
    assert len(suite[5].rows) == 15 and len(np.unique(groups[suite[5].rows])) == 1
    assert np.array_equal(suite[6].rows, train[-5:]) and np.array_equal(suite[7].rows, train[-10:-5])
    assert np.array_equal(suite[8].rows, train[:5])
    assert len(draw_suite(entries, 0, train, labels, groups, None)) == 6  # no score: no leverage sets
    with pytest.raises(ValueError, match="kind 'bogus'"):
        draw_suite([NS(kind="bogus", size=1, count=1)], 0, train, labels, groups, score)


def test_qualification_round_trip_and_audit_update():
    q = Qualification(["do_nothing"], [1.0], 0.9, "clopper_pearson", 0.01,
                      trials("do_nothing", [(0.1, True)] * 3))
    back = Qualification.from_dict(q.to_dict())
    assert back.to_dict() == q.to_dict()
    failed = q.with_trial(Trial("batch-3", "audit", 20, "do_nothing", 0.2, False, source="audit"))
    assert (failed.table[0].n, failed.table[0].passes) == (4, 3) and (q.table[0].n, q.table[0].passes) == (3, 3)
    assert q.tag() == "do_nothing 3/3"


def test_params_of_the_qualified_mode_answer_bad_values_in_one_line():
    from unlearning.config import ConfigError, parse_params

    p = parse_params({})
    assert p.validation.mode == "per_batch" and p.validation.audit.every == 5 and p.qualify.methods[0] == "do_nothing"
    assert parse_params({"validation": {"audit": {"probability": 0.2}}}).validation.audit.probability == 0.2
    with pytest.raises(ConfigError, match=r"validation.mode.*'sometimes'"):
        parse_params({"validation": {"mode": "sometimes"}})
    with pytest.raises(ConfigError, match=r"exactly one of them"):
        parse_params({"validation": {"audit": {"every": 2, "probability": 0.5}}})
    with pytest.raises(ConfigError, match=r"kind 'random' needs a size"):
        parse_params({"qualify": {"suite": [{"kind": "random", "count": 2}]}})
    with pytest.raises(ConfigError, match=r"qualify.bins = \[1.0, 0.5\]"):
        parse_params({"qualify": {"bins": [1.0, 0.5]}})
    with pytest.raises(ConfigError, match=r"must not list retrain"):
        parse_params({"qualify": {"methods": ["do_nothing", "retrain"]}})
    with pytest.raises(ConfigError, match=r"qualify.*colour"):
        parse_params({"qualify": {"colour": 1}})


def test_gap_in_noise_units_matches_the_selection_facts_float64():
    from unlearning.certificate.qualification import gap_in_noise_units

    g = np.array([0.1, 0.3, 0.2])
    assert gap_in_noise_units(g, 0.01) == pytest.approx(np.mean(0.5 * g ** 2) / 0.01, rel=1e-15)
    assert math.isnan(gap_in_noise_units(np.zeros(0), 1.0))


def test_membership_test_auc_matches_the_mia_metric_and_exact_permutation_float64():
    from unlearning.metrics import loss_threshold_auc
    from unlearning.certificate.qualification import membership_test

    rng = np.random.default_rng(1)
    fl, vl = rng.random(4), rng.random(5)
    fy, vy = np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1, 2])  # class 2 only on one side: left out
    auc, p = membership_test(fl, fy, vl, vy, 20000, 0)
    assert auc == pytest.approx(loss_threshold_auc(fl, vl[:4]), abs=1e-15)
    # exact p: every within-class assignment of the forget labels (C(4,2) x C(4,2) = 36, equally likely)
    losses, labels = np.concatenate([fl, vl[:4]]), np.concatenate([fy, vy[:4]])
    null = []
    for a in itertools.combinations(np.flatnonzero(labels == 0), 2):
        for b in itertools.combinations(np.flatnonzero(labels == 1), 2):
            f = np.zeros(8, bool)
            f[list(a + b)] = True
            null.append(loss_threshold_auc(losses[f], losses[~f]))
    exact = np.mean(np.array(null) >= auc - 1e-12)
    assert p == pytest.approx(exact, abs=0.01)


def test_membership_test_rejects_members_and_keeps_held_out_rows():
    from unlearning.certificate.qualification import membership_test

    rng = np.random.default_rng(2)
    y = rng.integers(0, 3, 200)
    val = rng.exponential(1.0, 200)
    _, p_member = membership_test(rng.exponential(0.3, 60), y[:60], val, y, 999, 0)
    _, p_held = membership_test(rng.exponential(1.0, 60), y[:60], val, y, 999, 0)
    assert p_member < 0.01 < p_held
    assert membership_test(np.ones(3), np.array([7, 7, 7]), val, y, 99, 0) == (pytest.approx(float("nan"), nan_ok=True), 1.0)


def test_cheap_checks_name_each_failing_check():
    from unlearning.certificate.qualification import cheap_checks

    m = {"acc/remote": 0.90, "original_acc/remote": 0.99, "acc/validation": 0.96, "original_acc/validation": 0.97}
    checks, failures = cheap_checks(m, 0.05, 0.5, 0.01)
    assert not checks["acc_vs_original/remote"]["passed"] and checks["acc_vs_original/validation"]["passed"]
    assert len(failures) == 1 and "acc/remote = 0.9000" in failures[0]
    checks, failures = cheap_checks(m, None, 0.001, 0.01)
    assert list(checks) == ["membership_pvalue/forget_vs_validation"] and "p = 0.001 < 0.01" in failures[0]


def test_mode_advice_follows_the_certificate_seconds():
    """per_batch while certifying one approximate candidate takes at most 10 minutes (docs/certificate.md,
    "qualified past it"): pinned at 600 s from both sides, so the test fails when the threshold moves."""
    from unlearning.certificate.qualification import advise_mode

    mode, line = advise_mode(40.0, 0.2, "per_batch")
    assert mode == "per_batch" and "as configured" in line and "(8 s at 0.2 s a retrain)" in line
    mode, line = advise_mode(100.0, 6.0, "qualified")  # 600 s: at the limit, still per_batch
    assert mode == "per_batch" and "validation.mode is qualified" in line and "(600 s at 6 s a retrain)" in line
    mode, line = advise_mode(100.0, 6.01, "per_batch")  # 601 s: past it
    assert mode == "qualified" and "validation.mode is per_batch" in line and "dvc repro qualify" in line
    assert "more than 600 s a batch" in line
    assert advise_mode(59.9, 10.0, "per_batch")[0] == "per_batch"  # 599 s
    assert advise_mode(60.1, 10.0, "per_batch")[0] == "qualified"  # 601 s


def test_audit_status_lists_unaudited_versions_and_the_history():
    from unlearning.certificate.qualification import audit_lines, audit_status

    records = [{"kind": "promoted", "batch_id": "b1", "version": "2", "method": "do_nothing"},
               {"kind": "audit", "batch_id": "b1", "version": "2", "method": "do_nothing", "passed": True,
                "references": 64, "audited_at": "t1"},
               {"kind": "promoted", "batch_id": "b2", "version": "3", "method": "do_nothing"},
               {"kind": "promoted", "batch_id": "b3", "version": "4", "method": "do_nothing"},
               {"kind": "audit", "batch_id": "b3", "version": "4", "method": "do_nothing", "passed": False,
                "references": 32, "audited_at": "t2", "then": {"exact_retrain_version": "5"}}]
    st = audit_status(records)
    assert st["unaudited_versions"] == ["3"] and st["failed"] == 1 and len(st["audits"]) == 2
    lines = audit_lines(st)
    assert lines[0] == "qualified versions not audited: v3; audits: 2, 1 failed"
    assert lines[2].endswith("FAILED -> exact retrain v5") and lines[1].endswith("passed")
    assert audit_lines(audit_status([])) == []


# --- qualify.min_sets_per_bin: drawing sets until each bin of predicted gap holds enough -------------------------

def test_bin_deficits_count_what_each_bin_lacks():
    from unlearning.certificate.qualification import bin_deficits

    assert bin_deficits([0.1, 0.2, 3.0, math.nan], [0.5, 1.0], 2) == [(0.5, 1.0, 2), (1.0, math.inf, 1)]
    assert bin_deficits([0.1, 0.7, 2.0], [0.5, 1.0], 1) == []


def test_window_sets_land_where_the_ranking_says():
    from unlearning.certificate.qualification import draw_window_set, rank_position, window_for

    D = np.arange(100, 300)
    score = np.arange(200.0)  # row D[i] has rank i
    s = draw_window_set("w", np.random.default_rng(0), D, score, 0.8, 10, width=0.1)
    assert len(s.rows) == 10 and s.kind == "gap_fill" and 0.7 <= rank_position(s.rows, D, score) <= 0.9
    # gap grows with the position: aim between the gaps seen (log scale), below them, above them
    seen = [(0.2, 0.3), (0.5, 3.0), (0.9, 30.0)]
    assert 0.2 < window_for(seen, 0.5, 1.0) < 0.5
    assert window_for(seen, 0.0, 0.25) < 0.2 and window_for(seen, 40.0, math.inf) > 0.9


def _fill(gap_of_position, min_sets=2, budget=20):
    from types import SimpleNamespace

    from tasks.qualification import fill_bins
    from unlearning.certificate.qualification import rank_position

    D, score = np.arange(1000), np.random.default_rng(1).random(1000)
    q = SimpleNamespace(bins=[0.5, 1.0, 2.0, 4.0], min_sets_per_bin=min_sets, max_extra_sets=budget, extra_set_size=20)
    drawn = []

    def certify(s, label):
        drawn.append(s.name)
        return gap_of_position(rank_position(s.rows, D, score))

    observed = [(p, gap_of_position(p)) for p in (0.1, 0.5, 0.9)]
    return fill_bins(q, observed, D, score, 0, certify), observed, drawn


def test_fill_bins_draws_until_every_bin_holds_enough():
    short, observed, drawn = _fill(lambda p: 8.0 * p ** 2)  # gaps 0.08, 2, 6.5 from the suite
    assert short == [] and 0 < len(drawn) <= 20
    from unlearning.certificate.qualification import bin_deficits

    assert bin_deficits([g for _, g in observed], [0.5, 1.0, 2.0, 4.0], 2) == []


def test_fill_bins_names_a_bin_it_cannot_reach_within_the_budget():
    short, _, drawn = _fill(lambda p: 1.5 + p)  # every gap in [1.5, 2.5): the bins below 1 are out of reach
    assert len(drawn) <= 20
    assert any(line.startswith("gap [0, 0.5): 2 set(s) short") for line in short)
    assert any(line.startswith("gap [0.5, 1): 2 set(s) short") for line in short)


def test_bins_left_short_survive_the_stored_round_trip():
    q = Qualification(["do_nothing"], [0.5], 0.8, "wilson", 0.01, unfilled=["gap [0, 0.5): 2 set(s) short"])
    assert Qualification.from_dict(q.to_dict()).unfilled == q.unfilled
    assert Qualification.from_dict({**q.to_dict(), "unfilled": None}).unfilled == []  # a file from before the key


def test_a_class_level_request_fails_the_cheap_checks():
    """do_nothing on a whole class passes the accuracy checks (it is the original) and the membership test (the
    class's validation rows are as well fitted as its training rows): only the class share catches it."""
    from unlearning.certificate.qualification import cheap_checks, largest_class_share

    before = np.array([0] * 10 + [1] * 20)
    assert largest_class_share(before[:10], before) == 1.0
    assert largest_class_share(np.array([0, 0, 1]), before) == pytest.approx(0.2)
    assert largest_class_share(np.array([], dtype=int), before) == 0.0
    m = {"acc/validation": 0.9, "original_acc/validation": 0.9}
    checks, failures = cheap_checks(m, 0.05, 0.6, 0.01, class_share=1.0, max_class_share=0.5)
    assert not checks["class_share/forget"]["passed"] and "class-level request" in failures[0]
    assert cheap_checks(m, 0.05, 0.6, 0.01, class_share=0.2, max_class_share=0.5)[1] == []
    assert cheap_checks(m, 0.05, 0.6, 0.01, class_share=1.0, max_class_share=None)[1] == []  # off


def test_the_license_orders_methods_by_their_timed_cost_on_this_model():
    """Both qualified at a low gap; declared cheapest first is newton_ggn, but timed on this model it costs 3.4
    retrains and finetune 0.2: the license takes finetune. A method not timed keeps its declared place after."""
    ts = trials("newton_ggn", [(0.1, True)] * 30) + trials("finetune", [(0.1, True)] * 30)
    q = Qualification(["newton_ggn", "finetune", "salun"], [1.0], 0.9, "clopper_pearson", 0.01, ts,
                      method_retrains={"newton_ggn": 3.4, "finetune": 0.2})
    assert q.by_cost() == ["finetune", "newton_ggn", "salun"]
    assert license_method(q.table, 0.3, q.by_cost(), 0.9).method == "finetune"
    back = Qualification.from_dict(q.to_dict())
    assert back.method_retrains == {"newton_ggn": 3.4, "finetune": 0.2} and back.by_cost() == q.by_cost()
    assert q.with_trial(ts[0]).method_retrains == q.method_retrains
    untimed = Qualification(["newton_ggn", "finetune"], [1.0], 0.9, "clopper_pearson", 0.01, ts)
    assert untimed.by_cost() == ["newton_ggn", "finetune"]


def test_mode_advice_with_exact_candidates_only_keeps_the_configured_mode():
    """sisa alone (a sharded original) certifies nothing: qualified would be advice for nothing."""
    from unlearning.certificate.qualification import PER_BATCH_SECONDS, advise_mode

    mode, line = advise_mode(160.0, PER_BATCH_SECONDS, "per_batch", exact_only=("sisa",))
    assert mode == "per_batch" and "qualify" not in line and "sisa" in line and "exact" in line
