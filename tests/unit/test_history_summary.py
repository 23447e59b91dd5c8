"""The retraining-debt rule, the champion's history and the batch summary: pure functions."""

from __future__ import annotations

import pytest

from unlearning.batch.summary import CandidateLine, check_in_words, chosen_rule, summary_markdown
from unlearning.policy.history import batches_from_ledger, debt_reasons, force_retrain, history_point, retraining_debt


def ledger(*batches: tuple[str, str, int]) -> list[dict]:
    return [{"batch_id": b, "method": m, "request_id": f"{b}-{i}"} for b, m, n in batches for i in range(n)]


def test_batches_are_grouped_in_ledger_order():
    got = batches_from_ledger(ledger(("b1", "do_nothing", 3), ("b2", "retrain", 1), ("b3", "finetune", 2)))
    assert [(b["batch_id"], b["method"], b["n_forgotten"]) for b in got] == [
        ("b1", "do_nothing", 3), ("b2", "retrain", 1), ("b3", "finetune", 2)]


def test_debt_counts_only_since_the_last_exact_retrain():
    d = retraining_debt(ledger(("b1", "do_nothing", 3), ("b2", "retrain", 1), ("b3", "finetune", 2),
                               ("b4", "do_nothing", 5)), n_train=100)
    assert d["batches_since_retrain"] == 2 and d["forgotten_since_retrain"] == 7
    assert d["forgotten_fraction_since_retrain"] == pytest.approx(0.07)
    assert d["n_batches"] == 4 and d["forgotten_total"] == 11
    assert retraining_debt([], 100)["batches_since_retrain"] == 0


@pytest.mark.parametrize("n_new, max_frac, max_batches, expect", [
    (3, 0.10, None, []),            # 7 + 3 = 10 of 100: not above 0.10
    (4, 0.10, None, ["fraction"]),  # 11 of 100 > 0.10
    (1, None, 3, []),               # batch 3 since the retrain: not above 3
    (1, None, 2, ["batches"]),      # batch 3 > 2
    (4, 0.10, 2, ["fraction", "batches"]),
    (100, None, None, []),          # both bounds off
])
def test_debt_fires_exactly_above_each_bound(n_new, max_frac, max_batches, expect):
    d = retraining_debt(ledger(("b1", "retrain", 1), ("b2", "finetune", 2), ("b3", "do_nothing", 5)), n_train=100)
    reasons = debt_reasons(d, n_new, max_frac, max_batches)
    assert len(reasons) == len(expect)
    for reason, kind in zip(reasons, expect):
        assert ("max_forgotten_fraction" if kind == "fraction" else "max_batches_since_retrain") in reason


def test_forced_retrain_keeps_what_the_rules_wanted():
    sel = {"candidates": ["do_nothing", "retrain"], "fired": [("gap_below_noise_floor", "x")], "skipped": []}
    forced = force_retrain(sel, ["too much debt"])
    assert forced["candidates"] == ["retrain"]
    assert forced["rules_would_have_tried"] == ["do_nothing", "retrain"]
    assert chosen_rule(forced, "retrain").startswith("retraining_debt: too much debt")


def test_history_steps_and_debt_reset_at_a_retrain():
    h: list[dict] = []
    for method, n in (("do_nothing", 10), ("finetune", 10), ("retrain", 5), ("do_nothing", 5)):
        h.append(history_point(h, batch_id="b", request_file="f.csv", method=method, n_forgotten=n, n_train=100,
                               validation_accuracy=0.9, output_gap=0.01, model_version="2", processed_at="t"))
    assert [p["step"] for p in h] == [1, 2, 3, 4]
    assert [p["cumulative_forgotten"] for p in h] == [10, 20, 25, 30]
    assert [p["forgotten_fraction"] for p in h] == pytest.approx([0.1, 0.2, 0.25, 0.3])
    assert [p["batches_since_retrain"] for p in h] == [1, 2, 0, 1]


def test_checks_read_as_sentences():
    assert "p = 0.003 < alpha = 0.01" in check_in_words(
        "klom_pvalue/forget", {"value": 0.003, "op": ">=", "limit": 0.01, "passed": False})
    assert "outside the range of exact retrains [0.900, 1.000]" in check_in_words(
        "acc/remote", {"value": 0.85, "op": "in", "limit": [0.9, 1.0], "passed": False})
    assert "below the floor" in check_in_words("acc/validation_min",
                                               {"value": 0.7, "op": ">=", "limit": 0.8, "passed": False})


def test_summary_holds_what_a_reviewer_needs():
    sel = {"candidates": ["do_nothing", "retrain"], "fired": [("gap_below_noise_floor", "predicted_gap_to_noise=0.1 < 0.5")],
           "rule_methods": {"gap_below_noise_floor": "do_nothing"}}
    cands = [CandidateLine("do_nothing", False, 1.25, {"klom_pvalue/forget": {"value": 0.004, "op": ">=",
                                                                              "limit": 0.01, "passed": False}}),
             CandidateLine("retrain", True, 0.5, {})]
    md = summary_markdown(request_file="r.csv", batch_id="batch-abc", n_forgotten=3, objective="retrain_equivalence",
                          candidates=cands, selection=sel, chosen="retrain", version_before="2", version_after="3",
                          wall_seconds=12.3, erasure={"stores": [{"store": "prepared", "purged_rows": 3},
                                                            {"store": "state manifest", "purged_rows": 3}, {}],
                                                 "pending": []},
                          debt={"batches_since_retrain": 1, "forgotten_since_retrain": 4,
                                "forgotten_fraction_since_retrain": 0.004})
    for text in ("`r.csv`: applied", "3 sample(s)", "retrain_equivalence", "| `do_nothing` | failed | 1.2",
                 "forget: the KLoM", "| `retrain` | passed | 0.5", "exact retrain is always the last candidate",
                 "v2 -> v3", "rows purged: prepared 3, state manifest 3 (3 store(s) checked)", "12.3 s", "1 approximate batch(es)"):
        assert text in md, text
    assert "rule `gap_below_noise_floor`" in chosen_rule(sel, "do_nothing")
    rejected = summary_markdown(request_file="r.csv", batch_id="b", n_forgotten=3, objective="retrain_equivalence",
                                candidates=cands[:1], selection=sel, chosen=None, version_before="2",
                                version_after=None, wall_seconds=1.0, status="rejected")
    assert "REJECTED" in rejected and "v2 -> v2 (unchanged)" in rejected


def test_original_training_size_counts_erased_rows_from_the_ledger():
    import pandas as pd

    from unlearning.policy.history import n_original_train

    manifest = pd.DataFrame({"split": ["train", "train", "train", "val"],
                             "status": ["retained", "retained", "deleted", "retained"]})
    # 2 retained training rows + 3 ledger entries (1 still in the manifest as deleted, 2 erased from it)
    assert n_original_train(manifest, [{}, {}, {}]) == 5


def test_the_erasure_line_says_pending_then_done_with_the_stores():
    from types import SimpleNamespace

    from tasks.stores.tracking import batch_page_after_erasure
    from unlearning.batch.summary import erasure_line

    locked = {"stores": [{"store": "ensemble cache", "purged_files": []}, {"store": "prepared", "purged_rows": 0,
                                                                          "pending": True}],
              "pending": ["prepared store: inside `dvc repro`; run `unlearn erase`"], "erased_at": "2026-12-01T09:00:00",
              "run_id": "r1"}
    assert erasure_line(locked) == ("**Erasure:** rows purged so far: none (2 store(s) checked); PENDING: prepared "
                                    "store: inside `dvc repro`; run `unlearn erase`")
    done = {"stores": [{"store": "prepared", "purged_rows": 3}, {"store": "state manifest", "purged_rows": 3}],
            "pending": [], "earlier_passes": [locked], "erased_at": "2026-12-01T09:05:00", "run_id": "r1"}
    assert erasure_line(done) == ("**Erasure:** done 2026-12-01T09:05:00Z: rows purged: prepared 3, state manifest 3 "
                                  "(2 store(s) checked); nothing pending. Stores: prepared, state manifest")

    class Tracker:  # what the batch page's update asks of adapters/tracking.py
        def __init__(self, text):
            self.text, self.tags = text, {}

        def description(self, run_id):
            return self.text

        def set_description(self, run_id, text):
            self.text = text

        def set_tags(self, run_id, tags):
            self.tags.update(tags)

    page = Tracker("### Deletion batch `r.csv`: applied\n\n" + erasure_line(locked) + "\n\n**Approved** x\n")
    batch_page_after_erasure(page, SimpleNamespace(), done)
    assert page.text == "### Deletion batch `r.csv`: applied\n\n" + erasure_line(done) + "\n\n**Approved** x\n"
    assert page.tags == {"erasure": "done"}
    bare = Tracker("")  # a run without a description (the batch writes its summary after its erase)
    batch_page_after_erasure(bare, SimpleNamespace(), locked)
    assert bare.text == "" and bare.tags == {"erasure": "pending"}
