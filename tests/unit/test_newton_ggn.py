"""The `newton_ggn` preset: exact on ridge regression, a correct GGN step on a classifier, contract."""

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

import unlearning.methods.newton_ggn  # noqa: F401  (registers the preset)
from unlearning.leverage import StackedMemberFunction
from unlearning.methods.args import DataSizes
from unlearning.methods.base import TrainRecipe, UnlearnContext
from unlearning.methods.registry import REGISTRY, parse_args, run_method
from unlearning.models import build_model, flat_params, train_ensemble

RECIPE = TrainRecipe(epochs=1, batch_size=8, lr=0.1, weight_decay=0.0)


def ridge_problem(n=50, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * np.array([1.0, 3.0, 0.3, 1.5])
    y = X @ rng.normal(size=d) + 2.0 + 0.3 * rng.normal(size=n)
    return X, y


def ridge_with_bias(X, y, lam):
    """argmin 0.5 ||[X, 1] theta - y||^2 + 0.5 lam ||theta||^2: the bias is penalised like the weights,
    matching the preset's objective on an MLP with hidden=[] and n_classes=1 (flat order: weights, bias)."""
    Xa = np.c_[X, np.ones(len(X))]
    return np.linalg.solve(Xa.T @ Xa + lam * np.eye(Xa.shape[1]), Xa.T @ y)


def linear_model(d, seeds, theta=None):
    model = build_model({"arch": "mlp", "in_dim": d, "hidden": [], "n_classes": 1, "image_shape": None}, seeds)
    model = model.double()
    if theta is not None:
        with torch.no_grad():
            model.out__weight[:] = torch.tensor(theta[:-1]).view(1, 1, d)  # nn.Linear weight [1, d] per member
            model.out__bias[:] = float(theta[-1])
    return model


def ctx_for(model, X, y, forget, loss="mse", recipe=RECIPE):
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    retain = np.setdiff1d(np.arange(len(y)), forget)
    return UnlearnContext(model=model, X_forget=X[forget], y_forget=y[forget], X_retain=X[retain],
                          y_retain=y[retain], adjacent_mask=torch.zeros(len(retain), dtype=torch.bool),
                          recipe=recipe, loss=loss), retain


@pytest.mark.parametrize("solver", ["exact", "cg", "auto"])
def test_lands_on_ridge_retrain(solver):
    X, y = ridge_problem()
    lam, forget = 0.7, np.array([0, 3, 9, 20])
    theta_D = ridge_with_bias(X, y, lam)
    model = linear_model(4, [1, 2], theta_D)
    with torch.no_grad():  # member 1 starts somewhere else: one Newton step still lands (quadratic objective)
        model.out__weight[1] += 0.5
    before = flat_params(model).clone()
    ctx, retain = ctx_for(model, X, y, forget)
    res = run_method("newton_ggn", ctx, {"lam": lam, "solver": solver, "gradient": "retain"})
    theta_R = ridge_with_bias(X[retain], y[retain], lam)
    assert np.abs(theta_R - theta_D).max() > 1e-2  # removal matters
    got = flat_params(res.model).numpy()
    np.testing.assert_allclose(got, np.stack([theta_R, theta_R]), rtol=0, atol=1e-8)
    assert torch.equal(flat_params(model), before) and res.model is not model
    assert res.cost.steps == 1 and res.cost.gradient_evals > 0 and res.cost.seconds > 0
    assert res.info["lam"] == lam and res.info["solver"] in ("exact", "cg")


def test_default_lam_follows_the_recipe():
    X, y = ridge_problem(seed=1)
    forget = np.array([1, 2])
    model = linear_model(4, [3])
    wd = 0.01
    ctx, retain = ctx_for(model, X, y, forget, recipe=TrainRecipe(1, 8, 0.1, weight_decay=wd))
    res = run_method("newton_ggn", ctx, {"gradient": "retain"})
    lam = wd * len(retain)  # mean loss + wd/2 ||theta||^2, times |R|
    assert res.info["lam"] == pytest.approx(lam)
    np.testing.assert_allclose(flat_params(res.model)[0].numpy(), ridge_with_bias(X[retain], y[retain], lam),
                               atol=1e-8)


def brute_ggn_step(model, member, X, y, lam, damping):
    fn = StackedMemberFunction(model, member, dtype=torch.float64, device="cpu")
    th, X = fn.theta0, X.double()
    J = jacobian(lambda t: fn.outputs(t, X), th)
    p = torch.softmax(fn.outputs(th, X), 1)
    Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    G = torch.einsum("ncp,ncd,ndq->pq", J, Lam, J) + (lam + damping) * torch.eye(fn.p, dtype=th.dtype)
    grad = torch.einsum("ncp,nc->p", J, p - torch.nn.functional.one_hot(y, p.shape[1]).double()) + lam * th
    return th - torch.linalg.solve(G, grad)


def test_classifier_step_matches_brute_force_and_descends():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 3, generator=g)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    model = build_model({"arch": "mlp", "in_dim": 3, "hidden": [4], "n_classes": 3, "image_shape": None}, [7, 8])
    forget = np.arange(5)
    ctx, retain = ctx_for(model, X, y, forget, loss="ce")
    lam, damping = 0.5, 0.1
    res = run_method("newton_ggn", ctx, {"lam": lam, "damping": damping, "solver": "exact", "line_search": False, "gradient": "retain"})
    for k in range(2):
        ref = brute_ggn_step(model, k, X[retain], y[retain], lam, damping)
        torch.testing.assert_close(flat_params(res.model)[k].double(), ref.float().double(), rtol=0, atol=1e-6)
    # full steps overshoot here (objective 46.3 -> 52.8 for member 0, 39.2 -> 41.1 -> 45.7 for member 1);
    # the line search descends
    full = run_method("newton_ggn", ctx, {"lam": lam, "damping": damping, "steps": 3, "line_search": False, "gradient": "retain"})
    assert any(any(b > a for a, b in zip(m["objective"], m["objective"][1:])) for m in full.info["members"])
    res3 = run_method("newton_ggn", ctx, {"lam": lam, "damping": damping, "steps": 3, "gradient": "retain"})
    for member in res3.info["members"]:
        obj = member["objective"]
        assert len(obj) == 4 and all(b <= a for a, b in zip(obj, obj[1:])) and obj[-1] < obj[0]
    assert any(min(m["eta"]) < 1 for m in res3.info["members"])  # it did backtrack
    assert res3.cost.steps == 3 and res3.info["stop"] == "steps"  # steps of the ensemble, as the engine counts


def test_registration_and_args():
    spec = REGISTRY["newton_ggn"]
    assert spec.args_model.__name__ == "NewtonGGNArgs" and spec.summary
    args = parse_args("newton_ggn", {"gradient": "retain", "steps": 2, "solver": "cg", "cg_iters": 50, "cg_tol": 1e-8, "max_params": 10})
    assert args.steps == 2 and args.solver == "cg"
    with pytest.raises(ValueError, match="allowed keys"):
        parse_args("newton_ggn", {"stepz": 2})
    with pytest.raises(ValueError, match="solver"):
        parse_args("newton_ggn", {"solver": "projected-ish"})
    with pytest.raises(ValueError, match="steps"):
        parse_args("newton_ggn", {"steps": 0, "gradient": "retain"})


@pytest.mark.parametrize("solver", ["exact", "cg"])
def test_influence_removal_lands_on_ridge_retrain_from_the_full_minimiser(solver):
    # At theta_D (the full-data ridge minimiser) grad of the retain objective = -grad L_F: the influence-removal
    # step (gradient = forget) is the Newton step, exact on ridge (float64 reference).
    X, y = ridge_problem()
    lam, forget = 0.7, np.array([0, 3, 9, 20])
    model = linear_model(4, [1], ridge_with_bias(X, y, lam))
    ctx, retain = ctx_for(model, X, y, forget)
    res = run_method("newton_ggn", ctx, {"lam": lam, "solver": solver, "gradient": "forget"})
    np.testing.assert_allclose(flat_params(res.model)[0].numpy(), ridge_with_bias(X[retain], y[retain], lam),
                               rtol=1e-7, atol=1e-8)


def test_influence_removal_moves_only_by_the_forget_samples_away_from_a_minimiser():
    # From a point that is not the full minimiser the retain step also undoes the residual of the unfinished
    # training (it lands on theta_R whatever the start); the influence step moves by the forget part only:
    # theta0 + H_R^-1 grad L_F(theta0), checked against the closed form.
    X, y = ridge_problem()
    lam, forget = 0.7, np.array([0, 3, 9, 20])
    theta0 = ridge_with_bias(X, y, lam) + 0.3
    ctx, retain = ctx_for(linear_model(4, [1], theta0), X, y, forget)
    res_f = run_method("newton_ggn", ctx, {"lam": lam, "solver": "exact", "gradient": "forget"})
    res_r = run_method("newton_ggn", ctx, {"lam": lam, "solver": "exact", "gradient": "retain"})
    Xa = np.c_[X, np.ones(len(X))]
    H_R = Xa[retain].T @ Xa[retain] + lam * np.eye(5)
    g_F = Xa[forget].T @ (Xa[forget] @ theta0 - y[forget])  # gradient of 0.5 sum_F (f - y)^2
    np.testing.assert_allclose(flat_params(res_f.model)[0].numpy(), theta0 + np.linalg.solve(H_R, g_F),
                               rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(flat_params(res_r.model)[0].numpy(), ridge_with_bias(X[retain], y[retain], lam),
                               rtol=1e-7, atol=1e-8)


def test_influence_removal_is_one_step():
    with pytest.raises(ValueError, match="one influence-removal step"):
        parse_args("newton_ggn", {"gradient": "forget", "steps": 2})


def _two_layer_classifier():
    """A 5-16-16-3 MLP trained briefly on 30 rows: deep enough that a full influence step at a small lam leaves
    the region where the outputs move linearly in theta (measured: logits 20 -> 1.2e8 at lam = 1e-3)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(30) % 3
    X = torch.randn(30, 5, generator=g) + y[:, None] * 0.5
    model = build_model({"arch": "mlp", "in_dim": 5, "hidden": [16, 16], "n_classes": 3, "image_shape": None},
                        [0, 1])
    train_ensemble(model, X, y, epochs=5, batch_size=8, lr=0.05)
    ctx = UnlearnContext(model=model, X_forget=X[:6], y_forget=y[:6], X_retain=X[6:], y_retain=y[6:],
                         adjacent_mask=torch.zeros(24, dtype=torch.bool), recipe=RECIPE, loss="ce")
    return model, X, ctx


def test_influence_step_backtracks_where_the_outputs_leave_their_linear_prediction():
    model, X, ctx = _two_layer_classifier()
    with torch.no_grad():
        before = model(X).abs().max().item()
    full = run_method("newton_ggn", ctx, {"lam": 1e-3, "max_linearization_error": None})
    kept = run_method("newton_ggn", ctx, {"lam": 1e-3})
    with torch.no_grad():
        full_max, kept_max = full.model(X).abs().max().item(), kept.model(X).abs().max().item()
    assert full_max > 1e4 * before  # the failure the test guards against
    assert kept_max < 2 * before
    for member in kept.info["members"]:
        assert member["eta"][0] < 1.0 and member["linearization_error"][0] > 1.0
        assert member["linearization_error"][-1] <= 1.0  # the accepted halving passed the test
        # each halving halves eta: the accepted eta is 2^-(trials - 1)
        assert member["eta"][0] == 0.5 ** (len(member["linearization_error"]) - 1)
    sizes = DataSizes.of(ctx)
    assert kept.cost.gradient_evals <= parse_args("newton_ggn", {"lam": 1e-3}).budget(sizes)


def test_influence_step_is_kept_whole_where_the_outputs_stay_linear():
    model, X, ctx = _two_layer_classifier()
    whole = run_method("newton_ggn", ctx, {"lam": 1.0, "max_linearization_error": None})
    tested = run_method("newton_ggn", ctx, {"lam": 1.0})
    assert [m["eta"] for m in tested.info["members"]] == [[1.0], [1.0]]
    assert all(m["linearization_error"][0] <= 1.0 for m in tested.info["members"])
    torch.testing.assert_close(flat_params(tested.model), flat_params(whole.model), rtol=0, atol=0)


def test_influence_step_takes_no_step_when_no_halving_passes():
    # tau this small is beyond any halving of a nonlinear model's step: the model is left as it was (eta = 0)
    model, X, ctx = _two_layer_classifier()
    res = run_method("newton_ggn", ctx, {"lam": 1e-3, "max_linearization_error": 1e-12})
    assert [m["eta"] for m in res.info["members"]] == [[0.0], [0.0]]
    torch.testing.assert_close(flat_params(res.model), flat_params(model), rtol=0, atol=0)
