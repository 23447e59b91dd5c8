"""Contract of EVERY registered unlearning method (DESIGN §4.3), parametrized over REGISTRY:
deterministic under a seed, never mutates its input, stops within its declared budget, reports its
cost, runs on CPU, and member k of an N=3 ensemble equals the method run on member k alone."""

import functools

import pytest
import torch

from unlearning.methods import REGISTRY, TrainRecipe, UnlearnContext, parse_args, run_method
from unlearning.methods.args import DataSizes
from unlearning.models import build_model, train_ensemble

METHODS = sorted(REGISTRY)
N = 3
RECIPE = TrainRecipe(epochs=3, batch_size=16, lr=1e-2)


@functools.lru_cache(maxsize=None)
def toy() -> UnlearnContext:
    """3 Gaussian classes in 6-D, 66 rows: 12 forget, 54 retain (first 18 retain rows adjacent)."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 6, generator=g) * 2
    y = torch.arange(66) % 3
    X = centers[y] + torch.randn(66, 6, generator=g)
    model = build_model({"arch": "mlp", "in_dim": 6, "hidden": [8], "n_classes": 3}, [11, 12, 13])
    train_ensemble(model, X, y, epochs=5, batch_size=16, lr=1e-2)
    adj = torch.zeros(54, dtype=torch.bool)
    adj[:18] = True
    return UnlearnContext(model, X[:12], y[:12], X[12:], y[12:], adj, RECIPE, seed=7)


def with_model(ctx: UnlearnContext, model, seed: int) -> UnlearnContext:
    return UnlearnContext(model, ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain, ctx.adjacent_mask,
                          ctx.recipe, seed=seed, loss=ctx.loss)


@functools.lru_cache(maxsize=None)
def result(name: str, member: int | None = None, seed: int = 7, run: int = 0):
    """Cached runs; `run` distinguishes repeated runs of the same call (determinism)."""
    ctx = toy()
    ctx = with_model(ctx, ctx.model if member is None else ctx.model.select(member), seed=seed)
    return run_method(name, ctx, {})


def params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", METHODS)
def test_never_mutates_input_model_and_returns_a_new_one(name):
    ctx = toy()
    before = params(ctx.model)
    res = run_method(name, ctx, {})
    assert all(torch.equal(a, b) for a, b in zip(before, params(ctx.model)))
    assert res.model is not ctx.model
    in_ptrs = {p.data_ptr() for p in ctx.model.parameters()}
    assert not in_ptrs & {p.data_ptr() for p in res.model.parameters()}
    assert res.model.seeds == ctx.model.seeds and res.model.n_models == N
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in res.model.parameters())


@pytest.mark.parametrize("name", METHODS)
def test_deterministic_under_seed(name):
    a, b = result(name, run=0), result(name, run=1)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert (a.cost.gradient_evals, a.cost.steps) == (b.cost.gradient_evals, b.cost.steps)


@pytest.mark.parametrize("name", METHODS)
def test_reports_cost_within_declared_budget(name):
    res = result(name)
    assert res.cost.seconds >= 0 and res.cost.steps >= 0
    if name == "do_nothing":
        assert res.cost.gradient_evals == 0
    else:
        assert res.cost.gradient_evals > 0 and res.cost.steps > 0
    args = parse_args(name, {})
    if hasattr(args, "budget"):
        bound = args.budget(DataSizes.of(toy()), RECIPE.epochs)
        assert res.cost.gradient_evals <= bound * N


# Runs long enough that half their cost still allows some steps (newton_ggn takes one step by default, and
# without the line search its worst-case step cost is its actual cost).
TRUNCATION_ARGS = {"newton_ggn": {"steps": 4, "line_search": False}}


@pytest.mark.parametrize("name", [n for n in METHODS if "max_grad_evals" in REGISTRY[n].args_model.model_fields])
def test_budget_stop_rule_truncates_the_run(name):
    args = TRUNCATION_ARGS.get(name, {})
    full = run_method(name, toy(), args)
    budget = max(1, full.cost.gradient_evals // N // 2)
    res = run_method(name, toy(), {**args, "max_grad_evals": budget})
    assert 0 < res.cost.gradient_evals <= budget * N
    assert res.cost.steps < full.cost.steps


def test_newton_budget_below_one_step_leaves_the_model_unchanged():
    res = run_method("newton_ggn", toy(), {"max_grad_evals": 10})
    assert res.cost.gradient_evals == 0 and res.cost.steps == 0 and res.info["stop"] == "budget"
    assert all(torch.equal(a, b) for a, b in zip(res.model.parameters(), toy().model.parameters()))


@pytest.mark.parametrize("name", METHODS)
def test_ensemble_member_equals_lone_member(name):
    ens = result(name)
    for k in range(N):
        lone = result(name, member=k)
        assert lone.model.n_models == 1
        for p_ens, p_one in zip(ens.model.parameters(), lone.model.parameters()):
            torch.testing.assert_close(p_ens[k : k + 1], p_one, atol=1e-5, rtol=0)
    if name != "do_nothing":
        assert sum(result(name, member=k).cost.gradient_evals for k in range(N)) == ens.cost.gradient_evals


def test_args_are_validated_with_clear_errors():
    for name in METHODS:
        with pytest.raises(ValueError, match=f"bad args for method '{name}'.*allowed keys"):
            parse_args(name, {"no_such_knob": 1})


def test_describe_methods_lists_every_method_with_its_defaults():
    from unlearning.methods import describe_methods

    rows = describe_methods()
    assert [r["name"] for r in rows] == METHODS
    for r in rows:
        assert r["summary"] and isinstance(r["args"], dict)
        assert r["args"] == parse_args(r["name"], {}).model_dump()  # every default is a valid value
    fin = next(r for r in rows if r["name"] == "finetune")
    assert fin["args"]["epochs"] == 5 and fin["args"]["max_grad_evals"] is None
