"""The batch planner (unlearning/planning/plan.py): a batch trains only what its decision needs."""

import pytest

from unlearning.config import ConfigError, Gate, Validation
from unlearning.planning.plan import Footprint, Timing, balanced_chunks, certificate_looks, fit_memory, plan_batch, plan_lines

V, G = Validation(), Gate()


def test_the_usual_retrain_trains_one_model_and_no_reference():
    plan = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", V, G, weigh_cost=True, explicit=False)
    assert plan.methods == ["retrain"]
    assert plan.steps[0].certificate == "exact"
    assert plan.models_to_train() == {"retrain": 1, "oracles": 0, "shadows": 0}
    (skipped, why), = plan.skipped
    assert skipped == "do_nothing" and "straight to retrain" in why and "80 oracles" in why


def test_cost_is_weighed_with_the_measured_member_cost():
    """A member cheap enough that 160 of them cost less than one retrain keeps the approximate candidate."""
    cheap = Timing(retrain_seconds=100.0, member_seconds=0.5, eval_seconds_per_member=0.01)
    plan = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", V, G, weigh_cost=True, explicit=False,
                      timing=cheap)
    assert plan.methods == ["do_nothing", "retrain"]
    assert plan.steps[0].cost_retrains_accept == pytest.approx(160 * 0.005)


def test_an_explicit_method_or_weigh_cost_off_is_certified_sequentially():
    for kw in ({"weigh_cost": False, "explicit": False}, {"weigh_cost": True, "explicit": True}):
        plan = plan_batch(["finetune", "retrain"], "retrain_equivalence", V, G, **kw)
        step = plan.steps[0]
        assert (step.method, step.certificate) == ("finetune", "sequential")
        assert step.looks == ((16, 16), (32, 32), (80, 80))
        assert sum(step.alphas) == pytest.approx(G.retrain_equivalence.alpha)
        assert plan.models_to_train() == {"retrain": 1, "oracles": 80, "shadows": 80}


def test_suppression_needs_no_reference_and_audit_is_opt_in():
    plan = plan_batch(["al_wpgd", "descent_ascent", "retrain"], "suppression", V, G, weigh_cost=True,
                      explicit=False)
    assert [s.certificate for s in plan.steps] == ["absolute", "absolute", "exact"]
    audit = plan_batch(["retrain"], "retrain_equivalence", Validation(audit_retrain=True), G, weigh_cost=True,
                       explicit=False)
    assert audit.steps[0].certificate == "audit" and audit.models_to_train()["oracles"] == 80


def test_looks_at_or_past_the_final_one_are_not_taken():
    assert certificate_looks(Validation(n_oracles=4, n_shadows=4)) == ((4, 4),)
    assert certificate_looks(Validation(n_oracles=24, n_shadows=24, looks=[8, 16, 32])) == ((8, 8), (16, 16), (24, 24))
    with pytest.raises(ValueError, match="validation.looks"):
        Validation(looks=[32, 16])


@pytest.mark.parametrize("n, cap, workers, want", [(80, 32, 2, [20, 20, 20, 20]), (80, 32, 1, [27, 27, 26]),
                                                   (16, 32, 2, [8, 8]), (3, 32, 2, [2, 1]), (1, 8, 4, [1]),
                                                   (0, 8, 2, [])])
def test_chunks_are_sized_to_the_workers_with_no_idle_tail(n, cap, workers, want):
    sizes = balanced_chunks(n, cap, workers)
    assert sizes == want and sum(sizes) == n and all(s <= cap for s in sizes)


def footprint(**kw):
    base = dict(n_params=100_000, activation_floats_per_row=20_000, data_bytes=60_000 * 784 * 4,
                baseline_bytes=700 * 2**20, batch_size=64, n_eval_rows=70_000, n_classes=10)
    return Footprint(**{**base, **kw})


def test_memory_budget_bounds_chunks_and_evaluation_or_refuses_naming_the_key():
    chunk, members, block, peak, refusal = fit_memory(footprint(), 4096, 32, 160)
    assert refusal is None and 1 <= chunk <= 32 and members >= 1 and block >= 64
    assert peak <= 4096 * 2**20
    *_, refusal = fit_memory(footprint(), 600, 32, 160)
    assert "validation.memory_mb = 600" in refusal and "raise validation.memory_mb" in refusal


def test_a_plan_that_cannot_fit_is_refused_before_anything_runs():
    plan = plan_batch(["retrain"], "retrain_equivalence", Validation(memory_mb=256), G, weigh_cost=True,
                      explicit=False, footprint=footprint())
    assert plan.refusal and "validation.memory_mb" in plan.refusal
    assert any(line.startswith("refused:") for line in plan_lines(plan))
    from unlearning.planning.plan import PlanRefused
    assert issubclass(PlanRefused, ConfigError)  # bad input: exit 2, one line


def test_predicted_seconds_and_cost_in_retrains():
    t = Timing(retrain_seconds=10.0, member_seconds=2.0, eval_seconds_per_member=0.1)
    retrain = plan_batch(["retrain"], "retrain_equivalence", V, G, weigh_cost=True, explicit=False, timing=t,
                         diagnostics_seconds=5.0)
    assert retrain.predicted_retrains == pytest.approx(1.5)
    assert retrain.predicted_seconds["unlearn"] == 10.0 and retrain.predicted_seconds["references"] == 0.0
    seq = plan_batch(["do_nothing", "retrain"], "retrain_equivalence", V, G, weigh_cost=False, explicit=False,
                     timing=t, workers=2)
    assert seq.predicted_seconds["references"] == pytest.approx(160 * 2.0 / 2)
    assert seq.steps[0].cost_retrains_reject == pytest.approx(32 * 0.2)


def test_sisa_on_a_sharded_original_trains_its_share_of_a_retrain_not_one_retrain():
    """The planner's sisa step retrains the shards holding the rows from a checkpoint: the plan says that
    share, never "1 retrain"."""
    plan = plan_batch(["do_nothing", "sisa", "retrain"], "retrain_equivalence", V, G, weigh_cost=True,
                      explicit=False, sisa_cost=0.125)
    assert plan.methods == ["sisa"]
    assert plan.models_to_train() == {"retrain": 0, "oracles": 0, "shadows": 0, "sisa_share": 0.125}
    (line,) = [x for x in plan_lines(plan) if x.startswith("models it trains at most")]
    assert "1 retrain" not in line and "0.125 of a full retrain" in line
