"""Selection policy (docs/design.md §4.5): ordered rules, skipping with reasons, retrain last, clear errors."""

import pytest
from pydantic import ValidationError

from unlearning.policy.selection_policy import (
    DEFAULT_RULES, FACTS, Rule, SelectionPolicy, allowed_keys, parse_key, select_methods,
)

RULES = [
    {"name": "gap", "when": {"predicted_gap_lt_noise_floor": True}, "method": "do_nothing"},
    {"name": "leak", "when": {"leakage_ratio_gt": 1.0}, "method": "newton_ggn"},
    {"name": "supp", "when": {"objective": "suppression", "adjacent_fraction_gt": 0.0}, "method": "al_wpgd"},
    {"name": "any_supp", "when": {"objective_in": ["suppression"]}, "method": "descent_ascent"},
    {"name": "always", "when": {}, "method": "finetune"},
]


def test_fired_rules_give_candidates_in_rule_order_and_retrain_last():
    facts = {"objective": "suppression", "adjacent_fraction": 0.2, "leakage_ratio": 3.0,
             "predicted_gap_lt_noise_floor": False}
    sel = select_methods(RULES, facts)
    assert sel.candidates == ["newton_ggn", "al_wpgd", "descent_ascent", "finetune", "retrain"]
    assert [name for name, _ in sel.fired] == ["leak", "supp", "any_supp", "always"]
    assert sel.skipped == [("gap", "predicted_gap_lt_noise_floor=False is not == True")]
    assert sel.chosen == "newton_ggn"
    assert "leakage_ratio=3 > 1" in dict(sel.fired)["leak"]


def test_order_of_rules_decides_order_of_candidates():
    facts = {"objective": "suppression", "adjacent_fraction": 0.2, "leakage_ratio": 3.0,
             "predicted_gap_lt_noise_floor": False}
    sel = select_methods(list(reversed(RULES)), facts)
    assert sel.candidates == ["finetune", "descent_ascent", "al_wpgd", "newton_ggn", "retrain"]


def test_rule_needing_a_missing_fact_is_skipped_with_reason_not_an_error():
    facts = {"objective": "suppression", "adjacent_fraction": 0.0, "predicted_gap_lt_noise_floor": None}
    sel = select_methods(RULES, facts)
    skipped = dict(sel.skipped)
    assert "missing fact(s) ['leakage_ratio']" in skipped["leak"]
    assert "missing fact(s) ['predicted_gap_lt_noise_floor']" in skipped["gap"]  # None counts as missing
    assert skipped["supp"] == "adjacent_fraction=0 is not > 0"
    assert sel.candidates == ["descent_ascent", "finetune", "retrain"]


def test_retrain_is_the_fallback_when_nothing_fires_and_never_duplicated():
    rules = [{"name": "leak", "when": {"leakage_ratio_gt": 1.0}, "method": "newton_ggn"}]
    assert select_methods(rules, {}).candidates == ["retrain"]
    rules = [{"name": "r", "when": {}, "method": "retrain"}, {"name": "f", "when": {}, "method": "finetune"},
             {"name": "f2", "when": {}, "method": "finetune"}]
    sel = select_methods(rules, {})
    # retrain fired first: it is exact, so nothing after it is a candidate, and it stays last
    assert sel.candidates == ["retrain"]
    assert "not a candidate" in dict(sel.fired)["f"]
    sel = select_methods([rules[1], rules[2], rules[0]], {})
    assert sel.candidates == ["finetune", "retrain"]


def test_unknown_condition_key_is_a_clear_error_naming_key_and_allowed_keys():
    with pytest.raises(ValidationError) as e:
        Rule(name="x", when={"leakage_ration_gt": 1.0}, method="finetune")
    msg = str(e.value)
    assert "'leakage_ration_gt'" in msg and "allowed keys" in msg and "leakage_ratio_gt" in msg
    with pytest.raises(ValidationError, match="unknown condition key 'objective_gt'"):
        Rule(name="x", when={"objective_gt": "a"}, method="finetune")  # no ordering on strings
    with pytest.raises(ValueError, match="unknown condition key 'nope'"):
        select_methods([{"name": "x", "when": {"nope": 1}, "method": "finetune"}], {})


def test_bad_values_and_facts_and_rules_are_clear_errors():
    with pytest.raises(ValidationError, match="leakage_ratio.*num"):
        Rule(name="x", when={"leakage_ratio_gt": "high"}, method="finetune")
    with pytest.raises(ValidationError, match="needs a list"):
        Rule(name="x", when={"objective_in": "suppression"}, method="finetune")
    with pytest.raises(ValidationError, match="extra"):
        Rule(name="x", when={}, method="finetune", unless={})
    with pytest.raises(ValidationError, match="repeated: \\['a'\\]"):
        SelectionPolicy(rules=[Rule(name="a", method="finetune"), Rule(name="a", method="retrain")])
    with pytest.raises(ValueError, match="unknown fact 'leakage'"):
        select_methods(RULES, {"leakage": 1.0})
    with pytest.raises(ValueError, match="fact 'leakage_ratio' must be num"):
        select_methods(RULES, {"leakage_ratio": "1.0"})
    with pytest.raises(ValueError, match="method 'magic' is not registered"):
        select_methods([{"name": "m", "method": "magic"}], {}, known_methods=["retrain"])


def test_key_parsing_prefers_exact_fact_names():
    assert parse_key("predicted_gap_lt_noise_floor") == ("predicted_gap_lt_noise_floor", "eq")
    assert parse_key("predicted_gap_lt") == ("predicted_gap", "lt")
    assert parse_key("n_forget_le") == ("n_forget", "le")
    assert "retrain_cost_lt_budget" in allowed_keys() and "has_gpu_gt" not in allowed_keys()


def test_default_rules_are_valid_and_follow_design_examples():
    from unlearning.methods import REGISTRY

    policy = SelectionPolicy(rules=DEFAULT_RULES)
    known = set(REGISTRY) | {"newton_ggn"}  # newton_ggn registers itself from the leverage helper's module
    base = {"n_forget": 10, "n_retain": 100, "retrain_cost_lt_budget": False}
    sel = select_methods(policy, {**base, "objective": "retrain_equivalence", "predicted_gap_to_noise": 0.3,
                                  "leakage_ratio": 66.0}, known_methods=known)
    assert sel.candidates == ["do_nothing", "retrain"]  # a huge raw leakage ratio no longer picks newton_ggn
    sel = select_methods(policy, {**base, "objective": "retrain_equivalence", "predicted_gap_to_noise": 5.0})
    assert sel.candidates == ["retrain"] and sel.fired[0][0] == "oracles_are_retrains"
    sel = select_methods(policy, {**base, "objective": "suppression", "adjacent_fraction": 0.3}, known_methods=known)
    assert sel.candidates[:2] == ["al_wpgd", "descent_ascent"] and sel.candidates[-1] == "retrain"
    # a cheap retrain is no shortcut for suppression: it keeps predicting what the retain set teaches
    sel = select_methods(policy, {**base, "objective": "suppression", "retrain_cost_lt_budget": True,
                                  "adjacent_fraction": 0.0})
    assert sel.candidates == ["descent_ascent", "retrain"]
    sel = select_methods(policy, {**base, "objective": "retrain_equivalence", "retrain_cost_lt_budget": True,
                                  "predicted_gap_to_noise": 5.0})
    assert sel.candidates == ["retrain"] and sel.fired[0][0] == "retrain_within_budget"
    assert all(parse_key(k)[0] in FACTS for r in policy.rules for k in r.when)
