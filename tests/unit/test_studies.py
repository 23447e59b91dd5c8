"""The evidence studies S3 and S5 (unlearning.studies) on tiny settings, the generated results section, and the
report's params."""

from __future__ import annotations

import json

import numpy as np
import pytest

from unlearning.config import ConfigError, load_params, parse_params
from unlearning.studies import readme
from unlearning.studies.diagnostics_study import correlations, policy_outcome, run_s5, structures
from unlearning.studies.digits import digits_problem
from unlearning.studies.random_sets import candidates, random_forget_sets, run_s3

PARAMS = load_params("params.yaml")


@pytest.fixture(scope="module")
def s3():
    # N = 12 and the default recipe: with fewer models or a 3-epoch recipe even two sets of retrains barely
    # overlap and KLoM saturates (every candidate reads ~1x the floor)
    cfg = PARAMS.report.s3.model_copy(update={
        "n_models": 12, "sizes": [10, 40], "sets_per_size": 1, "newton_sets_per_size": 0,
        "sweep": {"gradient_ascent": [{"lr": 1e-4, "epochs": 1}, {"lr": 1e-2, "epochs": 10}]},
        "methods": ["do_nothing", "retrain"]})
    return run_s3(PARAMS, cfg, progress=False)


@pytest.fixture(scope="module")
def s5():
    # the default 30-epoch recipe: a 3-epoch original is far from stationary, and the predicted gap then
    # measures its unfinished training (the retain gradient) more than the forget set's removal
    cfg = PARAMS.report.s5.model_copy(update={"n_models": 6, "structures": ["random10", "class", "group"],
                                                   "structure_size": 20, "methods": ["do_nothing", "retrain"]})
    # the last-layer diagnostics (docs/design.md §4.6, "Diagnostics bounded"): the report's shape and its ordering
    # (a class predicted and measured farther than ten random rows) are the same; the exact solver's dense GGN
    # took 2/3 of the run
    params = PARAMS.model_copy(update={"diagnostics": PARAMS.diagnostics.model_copy(update={"solver": "last_layer"})})
    return run_s5(params, cfg, progress=False)


def test_random_sets_are_deterministic_disjoint_from_validation_and_sized():
    prob = digits_problem(PARAMS)
    a = random_forget_sets(prob.train_rows, [10, 50], 2, seed=3)
    b = random_forget_sets(prob.train_rows, [10, 50], 2, seed=3)
    c = random_forget_sets(prob.train_rows, [10, 50], 2, seed=4)
    assert [n for n, _, _ in a] == ["random10_0", "random10_1", "random50_0", "random50_1"]
    assert all(np.array_equal(x[2], y[2]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[2], y[2]) for x, y in zip(a, c))
    assert all(len(F) == size and len(np.unique(F)) == size and np.isin(F, prob.train_rows).all() for _, size, F in a)
    with pytest.raises(ValueError, match="report.s3.sizes"):
        random_forget_sets(prob.train_rows, [len(prob.train_rows)], 1, seed=0)


def test_s3_candidates_merge_sweep_points_over_defaults_and_add_newton_on_first_sets():
    params = PARAMS.model_copy(update={"deletion": PARAMS.deletion.model_copy(
        update={"method_args": {"gradient_ascent": {"batch_size": 32, "lr": 0.5}}})})
    cfg = params.report.s3.model_copy(update={"newton_sets_per_size": 1})
    first = {label: (m, args) for label, m, args in candidates(params, cfg, 0)}
    later = {label for label, _, _ in candidates(params, cfg, 1)}
    assert "newton_ggn" in first and "newton_ggn" not in later
    assert first["gradient_ascent lr=0.0001 epochs=5"] == ("gradient_ascent", {"batch_size": 32, "lr": 1e-4, "epochs": 5})
    assert len([k for k in first if k.startswith("gradient_ascent")]) == 4


def test_s3_retrain_passes_and_its_klom_sits_at_the_floor(s3):
    json.dumps(s3)  # the report is JSON
    summ = s3["summary"]
    assert set(summ) == {"do_nothing", "retrain", "gradient_ascent lr=0.0001 epochs=1",
                         "gradient_ascent lr=0.01 epochs=10"}
    assert summ["retrain"]["pass_rate"] == 1.0
    assert 0.5 < summ["retrain"]["klom_to_floor/forget"] < 2.0
    # the large ascent step moves far from every retrain: its forget KLoM is above the retrain's
    big = summ["gradient_ascent lr=0.01 epochs=10"]
    assert big["klom_p95/forget"] > summ["retrain"]["klom_p95/forget"]
    assert big["compared_with_do_nothing"] == 2 and summ["retrain"]["per_size"].keys() == {"10", "40"}
    # ... far by the independent measure (against oracle set B), and the gate rejects it there: no false accept
    for s in s3["sets"]:
        c = s["candidates"]
        assert c["gradient_ascent lr=0.01 epochs=10"]["independent_ratio"] > c["do_nothing"]["independent_ratio"]
        assert not c["gradient_ascent lr=0.01 epochs=10"]["passed"] and "independent_ratio" not in c["retrain"]
    assert big["n_far"] >= 1 and big["false_accepts"] == 0 and big["false_rejects"] is None
    ge = s3["gate_errors"]
    assert ge["retrain_runs"] == 2 and ge["false_rejects"] == summ["retrain"]["false_rejects"] == 0
    assert ge["far_runs"] >= big["n_far"] and ge["false_accepts"] <= ge["far_runs"]
    for s in s3["sets"]:
        assert 0 <= s["oracle_acc"]["forget"] <= 1 and s["n_forget"] in (10, 40)
    assert s3["lemma1"]["40"]["n_forget_rows"] == 40


def test_s5_structures_have_their_shape():
    prob = digits_problem(PARAMS)
    cfg = PARAMS.report.s5.model_copy(update={"structure_size": 30})
    lev = np.arange(len(prob.train_rows), dtype=float)  # a known ranking: the last rows are the "highest"
    got = dict(structures(prob, cfg, lev))
    y = prob.y_np
    assert len(got["random200"]) == 200 and len(np.unique(got["random200"])) == 200
    cls = np.unique(y[got["class"]])
    assert len(cls) == 1 and len(got["class"]) == int(np.sum(y[prob.train_rows] == cls[0]))
    half = np.unique(y[got["half_class"]])
    assert len(half) == 1 and half[0] != cls[0]
    assert len(got["half_class"]) == int(np.sum(y[prob.train_rows] == half[0])) // 2
    assert np.array_equal(got["high_self_leverage"], np.sort(prob.train_rows[-30:]))
    assert np.array_equal(got["low_self_leverage"], np.sort(prob.train_rows[:30]))
    # the group is a neighbourhood: its rows are closer to each other than random rows are
    X = prob.X.numpy()
    spread = lambda rows: float(np.mean(np.linalg.norm(X[rows] - X[rows].mean(0), axis=1)))  # noqa: E731
    assert len(got["group"]) == 30 and spread(got["group"]) < 0.8 * spread(got["random200"])


def test_policy_outcome_counts_regret_against_the_cheapest_accepted_method():
    res = {"do_nothing": {"method": "do_nothing", "passed": True, "seconds": 0.1},
           "finetune": {"method": "finetune", "passed": False, "seconds": 5.0},
           "retrain": {"method": "retrain", "passed": False, "seconds": 1.0}}  # an exact retrain is accepted
    out = policy_outcome(["finetune", "retrain"], res, PARAMS)
    assert out["accepted_with"] == "retrain" and out["best"] == "do_nothing" and not out["first_pick_is_best"]
    assert out["regret_seconds"] == pytest.approx(6.0 - 0.1)
    out = policy_outcome(["do_nothing", "retrain"], res, PARAMS)
    assert out["first_pick_is_best"] and out["regret_seconds"] == 0.0


def test_correlations_rank_the_predicted_gap_against_gaps_and_advantages():
    rows = [{"facts": {"predicted_gap": p, "self_leverage_trace": p}, "gaps": {"do_nothing": g, "m": 1.0 + 0.1 * k}}
            for k, (p, g) in enumerate([(0.1, 1.0), (0.2, 2.0), (0.3, 3.0), (0.4, 4.0)])]
    c = correlations(rows, ["do_nothing", "m"])
    assert c["do_nothing"]["predicted_gap_vs_gap"] == pytest.approx(1.0)
    assert c["m"]["predicted_gap_vs_gap"] == pytest.approx(1.0)
    assert c["m"]["predicted_gap_vs_advantage"] == pytest.approx(1.0)  # advantage 0, 0.9, 1.8, 2.7 grows


def test_s5_reports_diagnostics_gaps_policy_and_correlations(s5):
    json.dumps(s5)
    names = [r["structure"] for r in s5["structures"]]
    assert names == ["random10", "class", "group"] and s5["methods"][:2] == ["do_nothing", "retrain"]
    by = {r["structure"]: r for r in s5["structures"]}
    # a whole class is far from its retrains (the retrains never saw the class); the diagnostics say so first
    assert by["class"]["gaps"]["do_nothing"] > 3 * by["random10"]["gaps"]["do_nothing"]
    assert by["class"]["facts"]["predicted_gap"] > by["random10"]["facts"]["predicted_gap"]
    for r in s5["structures"]:
        assert r["policy"]["candidates"][-1] == "retrain" and r["policy"]["accepted_with"] is not None
        assert r["policy"]["regret_seconds"] >= -1e-9
    assert s5["policy"]["n"] == 3 and set(s5["spearman"]) >= {"do_nothing", "retrain"}


def test_the_results_section_is_generated_from_the_reports_and_replaces_only_its_markers(s3, s5):
    meta = {"date": "2026-12-01 00:00 UTC", "commit": "abc1234", "cores": 2, "threads": 2, "device": "cpu"}
    section = readme.results_section({"s3": s3, "s5": s5}, meta)
    assert section.startswith(readme.BEGIN) and section.rstrip().endswith(readme.END)
    assert "abc1234" in section and "2 CPU cores" in section
    assert f"| `retrain` | 2 | 1.00 |" in section   # the S3 row comes from the summary
    assert "| class | " in section and "Spearman" in section
    doc = "# T\n\nbefore\n\n" + readme.BEGIN + "\nold numbers\n" + readme.END + "\n\nafter\n"
    new = readme.replace_section(doc, section)
    assert "old numbers" not in new and new.startswith("# T\n\nbefore\n\n") and new.endswith("\n\nafter\n")
    assert readme.replace_section(new, section) == new   # idempotent
    with pytest.raises(ValueError, match="report markers are missing"):
        readme.replace_section("# no markers\n", section, "docs/evidence.md")


def test_the_results_page_has_the_markers():
    """report.readme (docs/evidence.md) holds the generated section: `make report` can swap it in."""
    text = (PARAMS.root / PARAMS.report.readme).read_text()
    assert readme.replace_section(text, readme.BEGIN + "\nx\n" + readme.END).count(readme.END) == 1


def test_report_params_name_the_bad_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"report.studies.0.*'s3', 's4' or 's5'"):
        parse_params({"report": {"studies": ["s9"]}})
    with pytest.raises(ConfigError, match=r"report.s3.bogus"):
        parse_params({"report": {"s3": {"bogus": 1}}})
    with pytest.raises(ConfigError, match=r"report.s3.sizes"):
        parse_params({"report": {"s3": {"sizes": [0, 10]}}})
