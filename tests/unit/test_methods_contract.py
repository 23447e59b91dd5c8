"""Contract of EVERY registered unlearning method (docs/design.md §4.3), parametrized over REGISTRY and over three
models: the project's MLP (trained on the fused kernel), and a team's own module through the generic torch.func
adapter, with BatchNorm (stacked running statistics, one vmapped call) and with BatchNorm + Dropout (members run
one by one on their own dropout streams). Deterministic under a seed, never mutates its input, stops within its
declared budget, reports its cost, runs on CPU, and member k of an N=3 ensemble equals the method run on member
k alone (BatchNorm running statistics included)."""

import functools
from pathlib import Path

import pytest
import torch

from unlearning.methods import REGISTRY, TrainRecipe, UnlearnContext, parse_args, run_method
from unlearning.methods.args import DataSizes
from unlearning.models import build_model, train_ensemble

METHODS = sorted(set(REGISTRY) - {"sisa"})  # sisa needs a sharded original (its contract: tests/unit/test_sharding.py)
# The contract holds for any arguments; al_wpgd's defaults take 100 + 300 steps, 6x the toy's other methods, over
# about 24 runs here. 10 + 30 steps go through both stages and the projection all the same.
CONTRACT_ARGS = {"al_wpgd": {"stage1_steps": 10, "stage2_steps": 30}}
N = 3
RECIPE = TrainRecipe(epochs=3, batch_size=16, lr=1e-2)
HERE = Path(__file__).resolve().parent
SPECS = {
    "mlp": {"arch": "mlp", "in_dim": 6, "hidden": [8], "n_classes": 3},
    # the generic adapter; factories in tests/unit/custom_modules.py
    "bn": {"arch": "custom", "factory": "custom_modules:bn_mlp", "in_shape": [6], "n_classes": 3},
    "bn_dropout": {"arch": "custom", "factory": "custom_modules:bn_dropout_mlp", "in_shape": [6], "n_classes": 3},
}


@pytest.fixture(params=sorted(SPECS))
def kind(request) -> str:
    return request.param


@functools.lru_cache(maxsize=None)
def toy(kind: str = "mlp") -> UnlearnContext:
    """3 Gaussian classes in 6-D, 66 rows: 12 forget, 54 retain (first 18 retain rows adjacent)."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 6, generator=g) * 2
    y = torch.arange(66) % 3
    X = centers[y] + torch.randn(66, 6, generator=g)
    model = build_model(SPECS[kind], [11, 12, 13], search_paths=[HERE])
    train_ensemble(model, X, y, epochs=5, batch_size=16, lr=1e-2)
    adj = torch.zeros(54, dtype=torch.bool)
    adj[:18] = True
    return UnlearnContext(model, X[:12], y[:12], X[12:], y[12:], adj, RECIPE, seed=7)


def with_model(ctx: UnlearnContext, model, seed: int) -> UnlearnContext:
    return UnlearnContext(model, ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain, ctx.adjacent_mask,
                          ctx.recipe, seed=seed, loss=ctx.loss)


@functools.lru_cache(maxsize=None)
def result(name: str, kind: str = "mlp", member: int | None = None, seed: int = 7, run: int = 0, args=()):
    """Cached runs; `run` distinguishes repeated runs of the same call (determinism); args: sorted items, over
    CONTRACT_ARGS."""
    ctx = toy(kind)
    ctx = with_model(ctx, ctx.model if member is None else ctx.model.select(member), seed=seed)
    return run_method(name, ctx, contract_args(name, dict(args)))


def contract_args(name: str, args: dict | None = None) -> dict:
    return {**CONTRACT_ARGS.get(name, {}), **(args or {})}


def state(model):
    """Parameters and buffers (BatchNorm running statistics), detached copies."""
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]


@pytest.mark.parametrize("name", METHODS)
def test_never_mutates_input_model_and_returns_a_new_one(name, kind):
    ctx = toy(kind)
    before = state(ctx.model)
    res = run_method(name, ctx, contract_args(name))
    assert all(torch.equal(a, b) for a, b in zip(before, state(ctx.model)))  # buffers too
    assert res.model is not ctx.model
    in_ptrs = {t.data_ptr() for t in [*ctx.model.parameters(), *ctx.model.buffers()]}
    assert not in_ptrs & {t.data_ptr() for t in [*res.model.parameters(), *res.model.buffers()]}
    assert res.model.seeds == ctx.model.seeds and res.model.n_models == N
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in res.model.parameters())
    assert not res.model.training  # returned ready for evaluation (BatchNorm uses its running stats)


@pytest.mark.parametrize("name", METHODS)
def test_deterministic_under_seed(name, kind):
    a, b = result(name, kind, run=0), result(name, kind, run=1)
    assert all(torch.equal(p, q) for p, q in zip(state(a.model), state(b.model)))
    assert (a.cost.gradient_evals, a.cost.steps) == (b.cost.gradient_evals, b.cost.steps)


@pytest.mark.parametrize("name", METHODS)
def test_reports_cost_within_declared_budget(name, kind):
    res = result(name, kind)
    assert res.cost.seconds >= 0 and res.cost.steps >= 0
    if name == "do_nothing":
        assert res.cost.gradient_evals == 0
    else:
        assert res.cost.gradient_evals > 0 and res.cost.steps > 0
    args = parse_args(name, contract_args(name))
    if hasattr(args, "budget"):
        bound = args.budget(DataSizes.of(toy(kind)), RECIPE.epochs)
        assert res.cost.gradient_evals <= bound * N


# Runs long enough that half their cost still allows some steps (newton_ggn takes one step by default, and
# without the line search its worst-case step cost is its actual cost).
# descent_ascent's default is one pass, one step on the toy: two passes leave a step within half the cost.
TRUNCATION_ARGS = {"newton_ggn": {"steps": 4, "line_search": False, "gradient": "retain"},
                   "descent_ascent": {"epochs": 2}}


@pytest.mark.parametrize("name", [n for n in METHODS if "max_grad_evals" in REGISTRY[n].args_model.model_fields])
def test_budget_stop_rule_truncates_the_run(name, kind):
    args = contract_args(name, TRUNCATION_ARGS.get(name))
    full = run_method(name, toy(kind), args)
    budget = max(1, full.cost.gradient_evals // N // 2)
    res = run_method(name, toy(kind), {**args, "max_grad_evals": budget})
    assert 0 < res.cost.gradient_evals <= budget * N
    assert res.cost.steps < full.cost.steps


def test_newton_budget_below_one_step_leaves_the_model_unchanged(kind):
    res = run_method("newton_ggn", toy(kind), {"max_grad_evals": 10})
    assert res.cost.gradient_evals == 0 and res.cost.steps == 0 and res.info["stop"] == "budget"
    assert all(torch.equal(a, b) for a, b in zip(state(res.model), state(toy(kind).model)))


def assert_members_equal_lone_runs(name: str, kind: str, args=()):
    ens = result(name, kind, args=args)
    for k in range(N):
        lone = result(name, kind, member=k, args=args)
        assert lone.model.n_models == 1
        for t_ens, t_one in zip(state(ens.model), state(lone.model)):  # parameters, then buffers
            torch.testing.assert_close(t_ens[k : k + 1], t_one, atol=1e-5, rtol=0)
    if name != "do_nothing":
        assert sum(result(name, kind, member=k, args=args).cost.gradient_evals for k in range(N)) \
            == ens.cost.gradient_evals


@pytest.mark.parametrize("name", METHODS)
def test_ensemble_member_equals_lone_member(name, kind):
    assert_members_equal_lone_runs(name, kind)


# Options whose code paths the defaults above do not reach: per-sample gradients (the diagonal Fisher, vmapped
# over one-sample batches), a per-member stop (target forget accuracy: here members 0 and 1 stop before the
# first step and member 2 runs on; a stopped member's BatchNorm statistics must stay as they were) and an epoch
# whose last batch has one row (54 retain rows, batch 53: with BatchNorm it joins the batch before).
OPTION_RUNS = {
    "gradient_ascent": {"geometry": "diag_fisher", "fisher_samples": 20},
    "descent_ascent": {"geometry": "diag_fisher", "fisher_samples": 20, "target_forget_acc": 0.8},
    "finetune": {"batch_size": 53, "epochs": 2},
    "noisy_finetune": {"batch_size": 53, "epochs": 2, "output_noise": 0.01},  # Langevin and output noise streams
}


@pytest.mark.parametrize("name", sorted(OPTION_RUNS))
def test_member_equals_lone_member_with_options(name, kind):
    args = tuple(sorted(OPTION_RUNS[name].items()))
    assert_members_equal_lone_runs(name, kind, args)
    res = result(name, kind, args=args)
    assert res.cost.steps > 0
    if "target_forget_acc" in OPTION_RUNS[name]:
        assert {"target", "epochs"} <= set(res.info["phases"][0]["stop"])  # members stopped at different steps


def test_args_are_validated_with_clear_errors():
    for name in METHODS:
        with pytest.raises(ValueError, match=f"bad args for method '{name}'.*allowed keys"):
            parse_args(name, {"no_such_knob": 1})


def test_describe_methods_lists_every_method_with_its_defaults():
    from unlearning.methods import describe_methods

    rows = describe_methods()
    assert [r["name"] for r in rows] == sorted(REGISTRY)  # sisa included
    for r in rows:
        assert r["summary"] and isinstance(r["args"], dict)
        assert r["args"] == parse_args(r["name"], {}).model_dump()  # every default is a valid value
    fin = next(r for r in rows if r["name"] == "finetune")
    assert fin["args"]["epochs"] == 2 and fin["args"]["max_grad_evals"] is None
