"""SISA sharded training (unlearning/sharding.py): the plan, the per-member training it rests on, the aggregate,
and the exactness audit (unlearned constituents == constituents trained from scratch on the retain rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unlearning.models import TrainRecipe, build_model, fit, load_model, save_model
from unlearning.serving import probabilities
from unlearning.sharding import (
    Aggregate, ShardPlan, affected, assign_shards, assign_slices, cost_in_retrains, make_plan, order_seed,
    sisa_unlearn, slice_epochs, train_from_scratch,
)

SPEC = {"arch": "mlp", "in_shape": [4], "n_classes": 3, "kwargs": {"hidden": [5]}}
RECIPE = TrainRecipe(epochs=4, batch_size=4, lr=0.05, weight_decay=1e-3)


def data(n=60, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=dtype)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    return X, y


# --- the plan ---------------------------------------------------------------------------------------------------
def test_every_key_value_sits_in_exactly_one_shard_balanced_and_seeded():
    rng = np.random.default_rng(1)
    keys = rng.choice([f"c{i}" for i in range(37)], size=500)
    shard = assign_shards(keys, 5, seed=3)
    for v in np.unique(keys):
        assert len(set(shard[keys == v])) == 1, v
    sizes = np.bincount(shard, minlength=5)
    biggest = max(np.unique(keys, return_counts=True)[1])
    assert sizes.max() - sizes.min() <= biggest
    assert np.array_equal(shard, assign_shards(keys, 5, seed=3))  # deterministic from the seed
    assert not np.array_equal(shard, assign_shards(keys, 5, seed=4))


def test_random_sharding_balances_rows_to_one():
    ids = [f"s{i}" for i in range(103)]
    sizes = np.bincount(assign_shards(ids, 10, seed=0), minlength=10)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 103


def test_slices_are_equal_parts_and_a_small_group_sits_in_at_most_two():
    rng = np.random.default_rng(2)
    keys = rng.choice([f"g{i}" for i in range(40)], size=400)
    shard = assign_shards(keys, 4, seed=0)
    sl = assign_slices(keys, shard, 4, 5, seed=0)
    for k in range(4):
        counts = np.bincount(sl[shard == k], minlength=5)
        assert counts.max() - counts.min() <= 1
    for v in np.unique(keys):
        assert len(set(sl[keys == v])) <= 2


def test_affected_shards_and_their_first_slice():
    plan = ShardPlan(np.array([f"s{i}" for i in range(6)], dtype=object), np.array([0, 0, 1, 1, 2, 2]),
                     np.array([0, 1, 0, 1, 0, 1]), 3, 2, (1, 2, 3), 2)
    assert affected(plan, np.array([1, 2, 3])) == {0: 1, 1: 0}
    assert affected(plan, np.array([], dtype=int)) == {}
    assert cost_in_retrains(plan, {0: 1}) == pytest.approx(2 / 9)  # shard 0 slice 1 sees 2 rows; total 3 x (1 + 2)


def test_slice_epochs_spend_what_the_unsliced_recipe_spends():
    for e, R in [(30, 4), (10, 1), (20, 3)]:
        per = slice_epochs(e, R)
        assert per * sum(r + 1 for r in range(R)) / R == pytest.approx(e, rel=0.1)


def test_more_shards_than_key_values_is_refused_with_the_key():
    with pytest.raises(ValueError, match="only 2 distinct value"):
        make_plan(["a", "b", "c"], ["x", "y", "x"], 3, 1, 0, 4, [1, 2, 3], by="column", column="customer")


# --- per-member training ----------------------------------------------------------------------------------------
def test_members_on_their_own_rows_equal_members_trained_alone_float64():
    X, y = data()
    rows = torch.tensor([list(range(0, 20)), list(range(30, 50))])
    together = build_model(SPEC, [7, 8]).double()
    fit(together, X, y, RECIPE, rows=rows, order_seeds=[11, 12])
    for k in range(2):
        alone = build_model(SPEC, [7 + k]).double()
        fit(alone, X[rows[k]], y[rows[k]], RECIPE, rows=torch.arange(20)[None], order_seeds=[11 + k])
        for a, b in zip(together.select(k).parameters(), alone.parameters()):
            assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_rows_of_the_wrong_shape_are_refused():
    X, y = data()
    with pytest.raises(ValueError, match="rows must be"):
        fit(build_model(SPEC, [1, 2]).double(), X, y, RECIPE, rows=torch.zeros(3, 5, dtype=torch.long))


# --- the exactness audit -----------------------------------------------------------------------------------------
def _plan(n, shards=3, slices=3, keys=None):
    ids = [f"s{i}" for i in range(n)]
    return make_plan(ids, ids if keys is None else keys, shards, slices, seed=0, epochs=RECIPE.epochs,
                     member_seeds=[100 + k for k in range(shards)], by="random" if keys is None else "group")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unlearned_constituents_equal_constituents_trained_from_scratch_on_the_retain_rows(dtype):
    X, y = data(dtype=dtype)
    plan = _plan(len(X))
    stored = {}
    original, report = train_from_scratch(SPEC, plan, X, y, RECIPE, dtype=dtype,
                                          checkpoint=lambda k, r, m: stored.__setitem__((k, r), m.select(0)))
    assert sorted(stored) == [(k, r) for k in range(3) for r in range(3)] and len(report.trained) == 9
    # forget two rows of shard 1: one in slice 1, one in slice 2 -> shard 1 retrains slices 1 and 2 only
    f1 = np.flatnonzero((plan.shard == 1) & (plan.slice == 1))[:1]
    f2 = np.flatnonzero((plan.shard == 1) & (plan.slice == 2))[:1]
    forget = np.concatenate([f1, f2])
    unlearned, rep, first = sisa_unlearn(original, lambda k, r: stored[(k, r)], plan, forget, X, y, RECIPE)
    assert first == {1: 1} and rep.trained == [(1, 1), (1, 2)]
    keep = np.ones(len(X), bool)
    keep[forget] = False
    reference, _ = train_from_scratch(SPEC, plan, X, y, RECIPE, keep=keep, dtype=dtype)
    for a, b in zip(unlearned.parameters(), reference.parameters()):
        assert torch.equal(a, b)  # bit-equal: each shard trains in a pass of its own
    for k in (0, 2):  # untouched: the original's constituents, bit for bit
        for a, b in zip(unlearned.select(k).parameters(), original.select(k).parameters()):
            assert torch.equal(a, b)
    changed = max((a - b).abs().max().item() for a, b in zip(unlearned.select(1).parameters(),
                                                             original.select(1).parameters()))
    assert changed > 0  # the affected constituent did change


def test_a_forgotten_row_in_slice_zero_retrains_the_shard_from_its_seed_and_later_deletions_keep_earlier_ones_out():
    X, y = data()
    keys = [f"cust{i % 9}" for i in range(len(X))]
    plan = _plan(len(X), keys=keys)
    stored = {}
    save = lambda k, r, m: stored.__setitem__((k, r), m.select(0))  # noqa: E731
    original, _ = train_from_scratch(SPEC, plan, X, y, RECIPE, checkpoint=save, dtype=torch.float64)
    cust = np.array(keys)
    first_forget = np.flatnonzero(cust == "cust0")
    after1, rep1, first = sisa_unlearn(original, lambda k, r: stored[(k, r)], plan, first_forget, X, y, RECIPE,
                                       checkpoint=save)
    assert len(first) == 1  # one customer, one shard
    keep = cust != "cust0"
    second = np.flatnonzero(cust == "cust4")
    after2, _, _ = sisa_unlearn(after1, lambda k, r: stored[(k, r)], plan, second, X, y, RECIPE, keep=keep,
                                checkpoint=save)
    keep &= cust != "cust4"
    reference, _ = train_from_scratch(SPEC, plan, X, y, RECIPE, keep=keep, dtype=torch.float64)
    for a, b in zip(after2.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    # every stored checkpoint is now the checkpoint of a model trained without both customers
    ref_ckpts = {}
    train_from_scratch(SPEC, plan, X, y, RECIPE, keep=keep, dtype=torch.float64,
                       checkpoint=lambda k, r, m: ref_ckpts.__setitem__((k, r), m.select(0)))
    for key, m in stored.items():
        for a, b in zip(m.parameters(), ref_ckpts[key].parameters()):
            assert torch.equal(a, b), key


def test_vectorized_shards_match_the_per_shard_passes_to_summation_order_float64():
    X, y = data()
    plan = _plan(len(X))  # random sharding of 60 rows into 3: equal sizes, so the shards share one pass
    alone, _ = train_from_scratch(SPEC, plan, X, y, RECIPE, dtype=torch.float64)
    together, report = train_from_scratch(SPEC, plan, X, y, RECIPE, dtype=torch.float64, vectorize=True)
    assert len(report.trained) == 9
    assert max((a - b).abs().max().item() for a, b in zip(alone.parameters(), together.parameters())) <= 1e-12


def test_order_seeds_differ_per_slice_and_per_member():
    assert len({order_seed(s, r) for s in range(5) for r in range(5)}) == 25


# --- the aggregate ------------------------------------------------------------------------------------------------
def test_mean_probs_aggregate_is_the_mean_softmax_and_round_trips(tmp_path):
    X, _ = data(10)
    members = build_model(SPEC, [1, 2, 3]).double()
    agg = Aggregate(members, "mean_probs")
    out = agg(X)
    assert out.shape == (1, 10, 3)
    expect = torch.softmax(members(X), -1).mean(0).detach()
    assert torch.allclose(torch.softmax(out[0], -1), expect, atol=1e-12)
    save_model(agg, tmp_path / "agg.pt", {"note": 1})
    back, extra = load_model(tmp_path / "agg.pt")
    assert isinstance(back, Aggregate) and extra == {"note": 1} and back.aggregate == "mean_probs"
    assert torch.allclose(back(X).double(), out, atol=1e-6)  # load_model builds float32 members
    # the pyfunc's probabilities() calls it as it calls a one-member ensemble
    assert np.allclose(probabilities(back, X.numpy()), expect.numpy(), atol=1e-6)


def test_vote_aggregate_follows_the_majority_and_leaves_empty_shards_out():
    members = build_model(SPEC, [1, 2, 3]).double()
    with torch.no_grad():  # member 0 and 1 say class 2, member 2 says class 0, strongly
        for k, cls, scale in [(0, 2, 1.0), (1, 2, 1.0), (2, 0, 50.0)]:
            for name, p in members.named_parameters():
                if p.dim() == 3 and p.shape[1] == 3:  # the last weight [N, C, H]
                    p[k].zero_()
                if p.dim() == 2 and p.shape[1] == 3:  # the last bias [N, C]
                    p[k].zero_()
                    p[k, cls] = scale
    X, _ = data(4)
    assert Aggregate(members, "vote")(X)[0].argmax(-1).tolist() == [2] * 4
    assert Aggregate(members, "mean_probs")(X)[0].argmax(-1).tolist() == [0] * 4
    assert Aggregate(members, "vote", active=[False, False, True])(X)[0].argmax(-1).tolist() == [0] * 4
    with pytest.raises(ValueError, match="allowed"):
        Aggregate(members, "median")


# --- the method, the planner, the policy, the params -------------------------------------------------------------
def _sharded_context(forget_ids):
    from unlearning.methods import UnlearnContext
    from unlearning.sharding import ShardState, id_hash

    X, y = data(dtype=torch.float32)
    ids = [f"s{i}" for i in range(len(X))]
    keys = [f"cust{i % 6}" for i in range(len(X))]
    plan = make_plan([id_hash(i) for i in ids], keys, 3, 2, seed=0, epochs=RECIPE.epochs,
                     member_seeds=[100, 101, 102], by="column", column="customer")
    stored = {}
    constituents, _ = train_from_scratch(SPEC, plan, X, y, RECIPE,
                                         checkpoint=lambda k, r, m: stored.__setitem__((k, r), m.select(0)))
    model = ShardState(plan, X, y, stored, "mean_probs").model(constituents)
    forget = [ids.index(i) for i in forget_ids]
    retain = [i for i in range(len(X)) if i not in forget]
    ctx = UnlearnContext(model, X[forget], y[forget], X[retain], y[retain], torch.zeros(len(retain), dtype=torch.bool),
                         RECIPE, forget_ids=list(forget_ids))
    return ctx, plan, keys, ids


def test_sisa_through_the_registry_retrains_one_shard_for_one_customer_and_reports_it():
    from unlearning.methods import run_method

    ctx, plan, keys, ids = _sharded_context([f"s{j}" for j in range(60) if j % 6 == 2])  # customer cust2
    before = [t.detach().clone() for t in ctx.model.parameters()]
    res = run_method("sisa", ctx)
    assert len(res.info["shards_retrained"]) == 1 and res.info["shards_retrained"][0] in range(3)
    assert 0 < res.info["cost_in_retrains"] < 1
    assert all(torch.equal(a, b) for a, b in zip(before, ctx.model.parameters()))  # the input is not mutated
    st = res.model.shard_state
    assert len(st.plan.shard) == 50 and st.X.shape[0] == 50  # the customer's 10 rows left the plan
    # exact: the constituents equal a from-scratch run on the rows left, with the same plan
    reference, _ = train_from_scratch(SPEC, st.plan, st.X, st.y, RECIPE)
    for a, b in zip(res.model.constituents.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    # every checkpoint of the new state is the checkpoint a from-scratch run on the rows left writes
    ref = {}
    train_from_scratch(SPEC, st.plan, st.X, st.y, RECIPE,
                       checkpoint=lambda k, r, m: ref.__setitem__((k, r), m.select(0)))
    assert sorted(st.checkpoints) == sorted(ref)
    for key, m in st.checkpoints.items():
        for a, b in zip(m.parameters(), ref[key].parameters()):
            assert torch.equal(a, b), key


def test_sisa_on_a_model_trained_as_one_is_refused_with_the_fix():
    from unlearning.methods import UnlearnContext, run_method
    from unlearning.sharding import NotSharded

    X, y = data(dtype=torch.float32)
    ctx = UnlearnContext(build_model(SPEC, [1]), X[:2], y[:2], X[2:], y[2:], torch.zeros(58, dtype=torch.bool),
                         RECIPE, forget_ids=["a", "b"])
    with pytest.raises(NotSharded, match="train.sharding.shards"):
        run_method("sisa", ctx)


def test_the_planner_knows_sisa_is_exact_and_its_cost_and_refuses_it_for_one_model():
    from unlearning.config import Gate, Validation
    from unlearning.planning.plan import PlanRefused, plan_batch

    plan = plan_batch(["sisa", "retrain"], "retrain_equivalence", Validation(), Gate(), weigh_cost=True,
                      explicit=False, sisa_cost=0.08)
    assert plan.methods == ["sisa"] and plan.steps[0].certificate == "exact" and plan.steps[0].references == (0, 0)
    assert plan.predicted_retrains == pytest.approx(0.08)
    plan = plan_batch(["sisa", "retrain"], "retrain_equivalence", Validation(), Gate(), weigh_cost=True,
                      explicit=False, sisa_cost=None)
    assert plan.methods == ["retrain"] and plan.skipped[0][0] == "sisa"
    with pytest.raises(PlanRefused, match="sharded original"):
        plan_batch(["sisa", "retrain"], "retrain_equivalence", Validation(), Gate(), weigh_cost=True,
                   explicit=True, sisa_cost=None)
    # a sharded original: sisa alone, whatever else the rules add; another method named explicitly is refused
    plan = plan_batch(["do_nothing", "sisa", "retrain"], "retrain_equivalence", Validation(), Gate(),
                      weigh_cost=True, explicit=False, sisa_cost=0.1)
    assert plan.methods == ["sisa"] and {m for m, _ in plan.skipped} == {"do_nothing", "retrain"}
    with pytest.raises(PlanRefused, match="deletion.method = 'finetune': the original is sharded"):
        plan_batch(["finetune", "retrain"], "retrain_equivalence", Validation(), Gate(), weigh_cost=True,
                   explicit=True, sisa_cost=0.1)


def test_the_default_policy_picks_sisa_whenever_the_original_is_sharded():
    from unlearning.policy.selection_policy import DEFAULT_RULES, SelectionPolicy, select_methods

    policy = SelectionPolicy(rules=DEFAULT_RULES)
    for objective in ("retrain_equivalence", "suppression"):
        facts = {"objective": objective, "n_forget": 10, "n_retain": 100, "retrain_cost_lt_budget": False,
                 "adjacent_fraction": 0.2}
        assert select_methods(policy, {**facts, "sharded": True}).candidates[0] == "sisa"
        assert "sisa" not in select_methods(policy, {**facts, "sharded": False}).candidates


def test_sharding_params_are_checked_with_the_key_and_the_fix():
    from unlearning.config import ConfigError, parse_params

    with pytest.raises(ConfigError, match="train.sharding.by = 'column' needs train.sharding.column"):
        parse_params({"train": {"sharding": {"shards": 4, "by": "column"}}})
    with pytest.raises(ConfigError, match=r"^params.yaml: deletion.method = 'sisa' needs a sharded original"):
        parse_params({"deletion": {"method": "sisa"}})
    with pytest.raises(ConfigError, match="train.sharding.aggregate = 'max'"):
        parse_params({"train": {"sharding": {"shards": 2, "aggregate": "max"}}})
    with pytest.raises(ConfigError, match="init_checkpoint"):
        parse_params({"train": {"init_checkpoint": "m.pt", "sharding": {"shards": 2}}})
    assert parse_params({}).train.sharding.on is False  # off by default
    p = parse_params({"train": {"sharding": {"shards": 5, "slices": 4, "by": "column", "column": "customer"}},
                      "deletion": {"method": "sisa"}})
    assert p.train.sharding.on and p.train.sharding.column == "customer"
