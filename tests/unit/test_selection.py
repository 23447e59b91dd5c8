import numpy as np
import pytest
import torch

from unlearning.batch.rows import BatchRows
from unlearning.config import ConfigError, parse_params
from unlearning.policy.selection import _mean_kl_to_mean, batch_facts, candidate_methods


def rows(n_forget=3, n_retain=10, n_adjacent=4):
    mask = np.zeros(n_retain, bool)
    mask[:n_adjacent] = True
    return BatchRows(before=np.arange(n_forget + n_retain), forget=np.arange(n_forget),
                     retain=np.arange(n_forget, n_forget + n_retain), adjacent_mask=mask, validation=np.arange(2))


def test_facts_without_diagnostics_skip_leverage_rules():
    params = parse_params({"deletion": {"budget_gradient_evals": 10, "method": "auto", "rules": [
        {"name": "leaky", "method": "newton_ggn", "when": {"leakage_ratio_gt": 1.0}},
        {"name": "default", "method": "finetune", "when": {"objective": "retrain_equivalence"}}]}})
    facts = batch_facts(params.deletion, params.train.epochs, "retrain_equivalence", rows())
    assert facts["adjacent_fraction"] == 0.4 and facts["retrain_cost"] == 10 * params.train.epochs
    assert facts["retrain_cost_lt_budget"] is False and "leakage_ratio" not in facts
    sel = candidate_methods(params.deletion, facts)
    assert sel["candidates"] == ["finetune", "retrain"]
    assert dict(sel["skipped"])["leaky"].startswith("missing fact(s) ['leakage_ratio']")


def test_default_rules_from_params_yaml():
    from unlearning.config import load_params
    from tests.helpers import ROOT

    params = load_params(ROOT / "params.yaml")
    facts = batch_facts(params.deletion, params.train.epochs, "suppression", rows(n_retain=1000, n_adjacent=300))
    assert facts["retrain_cost_lt_budget"] is False  # digits-sized retain set: retrain is over budget
    sel = candidate_methods(params.deletion, facts)
    assert sel["candidates"] == ["al_wpgd", "descent_ascent", "retrain"]
    small = candidate_methods(params.deletion, batch_facts(params.deletion, params.train.epochs,
                                                           "retrain_equivalence", rows()))
    assert small["candidates"] == ["retrain"]  # cheap retrain wins and cuts the list
    # ...but never for suppression: a retrain cannot push forget accuracy below what the retain set teaches
    small = candidate_methods(params.deletion, batch_facts(params.deletion, params.train.epochs, "suppression", rows()))
    assert small["candidates"] == ["al_wpgd", "descent_ascent", "retrain"]
    skipped = dict(sel["skipped"])
    assert "missing fact" in skipped["gap_below_noise_floor"] or "objective" in skipped["gap_below_noise_floor"]


def test_unknown_method_is_a_config_error():
    with pytest.raises(ConfigError, match="allowed"):
        candidate_methods(parse_params({"deletion": {"method": "magic"}}).deletion, {"objective": "suppression"})


def test_noise_floor_kl_reference():
    logits = torch.randn(4, 5, 3, dtype=torch.float64)
    p = torch.softmax(logits, -1).numpy()
    mean = p.mean(0)
    ref = np.mean(np.sum(p * (np.log(p) - np.log(mean)), -1))
    assert _mean_kl_to_mean(logits) == pytest.approx(ref, rel=1e-10)
    assert _mean_kl_to_mean(logits[:1].repeat(3, 1, 1)) == pytest.approx(0.0, abs=1e-12)


def test_files_to_process_orders_by_name(tmp_path):
    from flows.deletion_batch import files_to_process

    for name in ("b.csv", "a.csv", "c.parquet", ".hidden.csv", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in files_to_process(None, tmp_path)] == ["a.csv", "b.csv", "c.parquet"]
    # A run triggered for b takes the earlier pending a first; c waits for its own run.
    assert [p.name for p in files_to_process(str(tmp_path / "b.csv"), tmp_path)] == ["a.csv", "b.csv"]
    outside = tmp_path.parent / "elsewhere.csv"
    assert files_to_process(str(outside), tmp_path) == [outside]


def test_gap_facts_relative_to_noise():
    """The rules read each predicted gap in units of the oracle noise floor (never a raw ratio of
    two vanishing norms)."""
    from types import SimpleNamespace

    params = parse_params({})
    report = SimpleNamespace(predicted_gap_forget=np.array([0.2, 0.4]), predicted_gap_retain=np.array([1e-9, 0.0]),
                             leakage_ratio=66.0, self_leverage_trace=0.1, self_leverage_spectral_norm=0.05)
    logits = torch.randn(4, 3, 5, dtype=torch.float64)
    facts = batch_facts(params.deletion, params.train.epochs, "retrain_equivalence", rows(), report, oracle_forget_logits=logits)
    floor = _mean_kl_to_mean(logits)
    assert facts["predicted_gap_to_noise"] == pytest.approx(0.5 * (0.04 + 0.16) / 2 / floor)
    assert facts["retain_gap_to_noise"] < 1e-6  # vanishing retain gap stays vanishing
    sel = candidate_methods(params.deletion, facts)
    assert "newton_ggn" not in sel["candidates"] and sel["candidates"][-1] == "retrain"


@pytest.mark.parametrize("deletion,match", [
    ({"method": "magic"}, r"deletion.method = 'magic' is not a registered method; allowed: \[.*'finetune'.*\] or 'auto'"),
    ({"fallback": ["finetune", "nosuch"]}, r"deletion.fallback\[1\] = 'nosuch'"),
    ({"rules": [{"name": "r", "method": "nosuch", "when": {}}]}, r"deletion.rules\[0\].method \(rule 'r'\) = 'nosuch'"),
    ({"method_args": {"nosuch": {}}}, r"deletion.method_args has arguments for 'nosuch'"),
    ({"method_args": {"finetune": {"bogus": 1}}}, r"deletion.method_args.finetune: .*bogus.*allowed keys: \[.*'lr'"),
])
def test_method_config_is_checked_before_any_training(deletion, match):
    """Every method name and argument set in params.deletion fails with the key and the allowed values."""
    from unlearning.policy.selection import check_method_config

    with pytest.raises(ConfigError, match=match):
        check_method_config(parse_params({"deletion": deletion}).deletion)


def test_default_method_config_passes():
    from unlearning.config import load_params
    from unlearning.policy.selection import check_method_config
    from tests.helpers import ROOT

    check_method_config(load_params(ROOT / "params.yaml").deletion)  # no error


def test_deletion_stage_exits_2_on_an_unknown_method(tmp_path, capsys, monkeypatch):
    """`python -m flows.deletion_batch` (the DVC stage) answers an unknown method before a server starts."""
    import yaml

    import flows.deletion_batch as stage
    from tests.helpers import ROOT

    monkeypatch.delenv("UNLEARN_DEBUG", raising=False)
    monkeypatch.setattr(stage, "prefect_api", lambda: (_ for _ in ()).throw(AssertionError("a server started")))

    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["deletion"]["fallback"] = ["nosuch_method"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    monkeypatch.setattr("sys.argv", ["flows.deletion_batch", "--params", str(path)])
    with pytest.raises(SystemExit) as e:
        stage.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: deletion.fallback[0] = 'nosuch_method'")


def test_the_noise_of_well_learned_forget_rows_is_floored_by_as_many_validation_rows():
    """Every oracle agrees on well-learned rows: their spread vanishes, and a tiny predicted gap read in its
    units looked large (6e-6 read as 5.4 times its noise). The validation rows' spread is the floor."""
    import torch

    from unlearning.policy.selection import noise_floor

    g = torch.Generator().manual_seed(0)
    agreeing = torch.zeros(8, 5, 3) + torch.tensor([9.0, 0.0, 0.0])  # [N, n, C]: every oracle the same
    spread = torch.randn(8, 5, 3, generator=g)
    assert noise_floor(agreeing) == pytest.approx(0.0, abs=1e-12)
    assert noise_floor(agreeing, spread) == pytest.approx(_mean_kl_to_mean(spread))
    assert noise_floor(spread, agreeing) == pytest.approx(_mean_kl_to_mean(spread))  # a floor, never a cap


def test_the_noise_floor_is_waited_for_only_when_an_approximate_candidate_could_be_certified():
    from tasks.stages import needs_noise_floor

    waiting = {"skipped": [("gap_below_noise_floor", "missing fact(s) ['noise_floor', 'predicted_gap'] ...")]}
    assert needs_noise_floor(waiting, weigh_cost=False)
    assert not needs_noise_floor(waiting, weigh_cost=True)  # the planner would skip do_nothing for its cost
    assert not needs_noise_floor({"skipped": [("x", "objective='suppression' is not ...")]}, weigh_cost=False)


def test_the_nearest_rule_that_did_not_fire_is_named_with_the_value_that_kept_it_off():
    """The default rules on an unsharded batch whose predicted gap is 0.83 of its noise: retrain is picked; the
    gap rule (0.66 from its threshold) is nearer than the sharding flag or the suppression rules (1 each)."""
    from tasks.stages import nearest_miss_line
    from unlearning.config import load_params

    params = load_params()
    facts = {"objective": "retrain_equivalence", "n_forget": 3, "n_retain": 10, "forget_fraction": 0.2,
             "adjacent_fraction": 0.4, "retrain_cost": 10, "budget": 100, "retrain_cost_lt_budget": True,
             "has_gpu": False, "sharded": False, "noise_floor": 1.0, "predicted_gap": 0.83,
             "predicted_gap_to_noise": 0.83}
    sel = candidate_methods(params.deletion.model_copy(update={"method": "auto"}), facts)
    assert sel["candidates"] == ["retrain"]
    assert sel["nearest_miss"] == ("gap_below_noise_floor", "do_nothing", "predicted_gap_to_noise=0.83 is not < 0.5")
    assert nearest_miss_line(sel) == ("nearest rule that did not fire: gap_below_noise_floor -> do_nothing "
                                      "(predicted_gap_to_noise=0.83 is not < 0.5)")
    # without the diagnostics the gap rule is off for a fact not computed: still nearer than a flag that differs
    del facts["predicted_gap_to_noise"]
    name, _, why = candidate_methods(params.deletion.model_copy(update={"method": "auto"}), facts)["nearest_miss"]
    assert name == "gap_below_noise_floor" and why == "predicted_gap_to_noise not computed for this batch"
