"""Float64 reference tests of the engine's kernels (docs/design.md §4.3): projection, W2, diagonal Fisher,
member-wise optimizers, weighting, the augmented Lagrangian, masks and the engine loop itself."""

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from unlearning.methods import TrainRecipe, UnlearnContext, run_method
from unlearning.methods.al_wpgd import AugmentedLagrangian
from unlearning.methods.engine import Phase, StopRule, Term, run_phases
from unlearning.methods.geometry import DiagFisher, make_geometry, per_sample_grad_sq_mean
from unlearning.methods.losses import clip_loss, kl_teacher_student, per_sample_loss
from unlearning.methods.memberwise import dot, flatten, unflatten
from unlearning.methods.optim import MemberOptimizer, OptimizerSpec
from unlearning.methods.projection import W2Projection, project_off_span, w2_squared
from unlearning.methods.retrain import train_mse
from unlearning.methods.salun import saliency_mask
from unlearning.methods.weighting import Weighting
from unlearning.models import build_model, flat_params, train_ensemble

SPEC = {"arch": "mlp", "in_dim": 4, "hidden": [5], "n_classes": 3}


def tiny_ctx(seeds=(1, 2), n=30, dtype=torch.float64, seed=0, loss="ce") -> UnlearnContext:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (n,), generator=g)
    model = build_model(SPEC, list(seeds)).to(dtype)
    adj = torch.arange(n - 8) % 2 == 0
    return UnlearnContext(model, X[:8], y[:8], X[8:], y[8:], adj, TrainRecipe(2, 8, 1e-2), seed=3, loss=loss)


def test_project_off_span_matches_numpy_least_squares_per_member():
    g = torch.Generator().manual_seed(0)
    d = torch.randn(3, 20, generator=g, dtype=torch.float64)
    v = torch.randn(3, 2, 20, generator=g, dtype=torch.float64)
    v[2, 1] = 2 * v[2, 0]  # rank-deficient member: the pseudo-inverse still projects onto span{v0}
    out = project_off_span(d, v)
    for k in range(3):
        V, dk = v[k].numpy().T, d[k].numpy()
        coef = np.linalg.lstsq(V, dk, rcond=None)[0]
        np.testing.assert_allclose(out[k].numpy(), dk - V @ coef, atol=1e-12)
        np.testing.assert_allclose(v[k].numpy() @ out[k].numpy(), 0, atol=1e-10)
        # member independence: projecting member k alone gives the same
        torch.testing.assert_close(project_off_span(d[k : k + 1], v[k : k + 1])[0], out[k], atol=1e-14, rtol=0)
    zero = project_off_span(d, torch.zeros_like(v))  # nothing protected -> nothing removed
    torch.testing.assert_close(zero, d)


def test_w2_squared_equals_optimal_assignment_with_squared_cost():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 7, generator=g, dtype=torch.float64) * 5
    b = torch.rand(2, 7, generator=g, dtype=torch.float64) * 5
    w2 = w2_squared(a, b)
    for k in range(2):
        cost = (a[k].numpy()[:, None] - b[k].numpy()[None, :]) ** 2
        r, c = linear_sum_assignment(cost)
        assert w2[k].item() == pytest.approx(cost[r, c].mean(), abs=1e-12)
    assert torch.all(w2_squared(a, a) == 0)
    with pytest.raises(ValueError, match="equal sample counts"):
        w2_squared(a, b[:, :3])


def test_diag_fisher_matches_per_sample_gradient_loop():
    ctx = tiny_ctx()
    model = ctx.model
    X = ctx.X_retain[:6].expand(2, -1, -1).clone()
    X[1] = ctx.X_retain[6:12]  # member 1 gets other rows
    y = torch.stack([ctx.y_retain[:6], ctx.y_retain[6:12]])
    got = per_sample_grad_sq_mean(model, X, y, "ce", chunk=4)
    for k in range(2):
        one = model.select(k)
        acc = [torch.zeros_like(p) for p in one.parameters()]
        for i in range(6):
            one.zero_grad()
            per_sample_loss(one(X[k, i : i + 1]), y[k, i : i + 1].unsqueeze(0), "ce").sum().backward()
            acc = [a + p.grad**2 for a, p in zip(acc, one.parameters())]
        for g_, a in zip(got, acc):
            torch.testing.assert_close(g_[k : k + 1], a / 6, atol=1e-12, rtol=1e-10)
    geo = DiagFisher(samples=10, damping=0.5)
    assert geo.prepare(model, ctx, max_evals=None) == 10
    d = [torch.ones_like(p) for p in model.parameters()]
    out = geo.apply(d)
    mean = flatten(geo.diag).mean(1)
    for o, f in zip(out, geo.diag):
        torch.testing.assert_close(o, 1 / (f + 0.5 * mean.view(-1, *[1] * (f.dim() - 1))))
    assert DiagFisher(samples=50).prepare(model, ctx, max_evals=4) == 4  # capped by the budget
    with pytest.raises(ValueError, match="allowed"):
        make_geometry("kfac")


def test_member_adam_and_sgd_match_torch_and_skip_inactive_members():
    g = torch.Generator().manual_seed(2)
    p0 = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    grads = [torch.randn(3, 4, 2, generator=g, dtype=torch.float64) for _ in range(5)]
    for spec, ref_cls, kw in [(OptimizerSpec("adam", lr=0.1), torch.optim.Adam, {"lr": 0.1}),
                              (OptimizerSpec("sgd", lr=0.1, momentum=0.9), torch.optim.SGD,
                               {"lr": 0.1, "momentum": 0.9})]:
        ref = torch.nn.Parameter(p0.clone())
        opt = ref_cls([ref], **kw)
        mine, mopt = p0.clone(), MemberOptimizer(spec, 3)
        frozen_member = p0.clone()
        for i, gr in enumerate(grads):
            ref.grad = gr.clone()
            opt.step()
            active = torch.tensor([True, True, i < 2])  # member 2 stops after two steps
            mine -= mopt.update([gr], active)[0]
            if i == 1:
                frozen_member = mine[2].clone()
        torch.testing.assert_close(mine[:2], ref.detach()[:2], atol=1e-12, rtol=0)
        assert torch.equal(mine[2], frozen_member)
        assert mopt.t.tolist() == [5, 5, 2]


def test_weighting_reduce_clips_and_weights_per_sample():
    losses = torch.tensor([[1.0, 20.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    idx = torch.tensor([[0, 2, 1], [2, 1, 0]])
    w = Weighting(forget_cap=10.0, forget_sample_weights=torch.tensor([1.0, 2.0, 3.0]))
    got = w.reduce("forget", losses, idx)
    # member 0: rows 0,2,1 -> weights 1,3,2; clipped losses 1,10,3
    assert got[0].item() == pytest.approx((1 * 1 + 3 * 10 + 2 * 3) / 6)
    assert got[1].item() == pytest.approx((3 * 4 + 2 * 5 + 1 * 6) / 6)
    assert torch.equal(Weighting().reduce("retain", losses, idx), losses.mean(1))
    per_member = Weighting(retain_sample_weights=torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
    assert per_member.reduce("retain", losses, idx).tolist() == [1.0, 4.0]
    z = torch.tensor([5.0, 15.0], requires_grad=True)
    clip_loss(z, 10.0).sum().backward()
    assert z.grad.tolist() == [1.0, 0.0]  # no gradient above the cap


def test_augmented_lagrangian_gradient_and_multiplier_update():
    """grad(w_R c - L_F) with w_R = lam + mu c equals grad(-L_F + lam c + mu/2 c^2); lam += mu c (where
    lam + mu c > 0; the inequality-constraint clamp is tested below)."""
    theta = torch.tensor([0.3, 0.7], dtype=torch.float64, requires_grad=True)
    lf = theta[:1] ** 2 + 1  # [1]: one member's forget loss
    c = theta[1:] * 2 - 0.1  # [1]
    al = AugmentedLagrangian(mu=3.0, lam0=0.5, cap=10.0)
    g_engine = torch.autograd.grad(al.objective({"forget": lf, "retain": c}), theta, retain_graph=True)[0]
    direct = -lf + 0.5 * c + 1.5 * c**2
    g_ref = torch.autograd.grad(direct.sum(), theta)[0]
    torch.testing.assert_close(g_engine, g_ref)
    al.after_step({"forget": lf.detach(), "retain": c.detach()}, torch.tensor([True]))
    assert al.lam.item() == pytest.approx(0.5 + 3.0 * c.item())
    al.after_step({"retain": c.detach()}, torch.tensor([False]))  # inactive member keeps its lam
    assert al.lam.item() == pytest.approx(0.5 + 3.0 * c.item())


def test_augmented_lagrangian_multiplier_clamped_at_zero():
    """Inequality constraint L_rem <= L_rem(theta_0): a satisfied constraint (c << 0) gets weight 0 and lam
    stays >= 0 (an unclamped multiplier went to -4.24, rewarding a higher remote loss)."""
    theta = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    lf = theta[:1] ** 2 + 1
    c = theta[1:] * 2 - 0.1  # -1.5: lam + mu c = 0.5 - 4.5 < 0
    al = AugmentedLagrangian(mu=3.0, lam0=0.5, cap=10.0)
    g_engine = torch.autograd.grad(al.objective({"forget": lf, "retain": c}), theta, retain_graph=True)[0]
    g_ref = torch.autograd.grad((-lf).sum(), theta)[0]
    torch.testing.assert_close(g_engine, g_ref)
    al.after_step({"forget": lf.detach(), "retain": c.detach()}, torch.tensor([True]))
    assert al.lam.item() == 0.0


def test_engine_full_batch_sgd_matches_manual_update():
    """descent_ascent-like phase, full batches, plain SGD: theta <- theta - eta (w_R g_R - w_F g_F)."""
    ctx = tiny_ctx()
    phase = Phase("p", retain=Term("retain", None), forget=Term("forget", None), primary="retain",
                  weighting=Weighting(forget_weight=0.3, retain_weight=1.0, forget_cap=2.0),
                  optimizer=OptimizerSpec("sgd", lr=0.05), stop=StopRule(epochs=4))
    res = run_phases(ctx, [phase])
    ref = ctx.model.select([0, 1])
    for _ in range(4):
        lr_ = per_sample_loss(ref(ctx.X_retain), ctx.y_retain.expand(2, -1)).mean(1)
        lf_ = clip_loss(per_sample_loss(ref(ctx.X_forget), ctx.y_forget.expand(2, -1)), 2.0).mean(1)
        grads = torch.autograd.grad((lr_ - 0.3 * lf_).sum(), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.05 * g
    for a, b in zip(res.model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert res.cost.steps == 4 and res.cost.gradient_evals == 4 * (22 + 8) * 2


def test_engine_batches_depend_on_seed_and_member_seed_only():
    ctx = tiny_ctx(seeds=(1, 2))
    phase = lambda: Phase("p", retain=Term("retain", 5), primary="retain", optimizer=OptimizerSpec("sgd", lr=0.1),
                          stop=StopRule(epochs=1))
    a = run_phases(ctx, [phase()])
    ctx.seed = 4
    b = run_phases(ctx, [phase()])
    assert not torch.equal(flatten(list(a.model.parameters())), flatten(list(b.model.parameters())))
    swapped = UnlearnContext(ctx.model.select([1, 0]), ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain,
                             ctx.adjacent_mask, ctx.recipe, seed=4)
    c = run_phases(swapped, [phase()])  # member order does not matter, only member seeds
    torch.testing.assert_close(flatten(list(c.model.parameters()))[[1, 0]], flatten(list(b.model.parameters())))


def test_target_stop_freezes_each_member_at_its_target():
    ctx = tiny_ctx(dtype=torch.float32)
    train_ensemble(ctx.model, torch.cat([ctx.X_forget, ctx.X_retain]).float(),
                   torch.cat([ctx.y_forget, ctx.y_retain]), epochs=30, batch_size=8, lr=1e-2)
    res = run_method("gradient_ascent", ctx, {"epochs": 200, "lr": 0.05, "target_forget_acc": 0.3})
    from unlearning.models import accuracy
    acc = accuracy(res.model, ctx.X_forget, ctx.y_forget)
    assert torch.all(acc <= 0.3)
    assert res.info["phases"][0]["stop"] == ["target", "target"]
    assert res.cost.steps < 200


def test_no_finite_stop_rule_is_an_error():
    with pytest.raises(ValueError, match="no finite stop rule"):
        run_phases(tiny_ctx(), [Phase("p", retain=Term("retain"), stop=StopRule(epochs=None))])


def test_w2_projection_direction_is_orthogonal_to_protected_gradients():
    ctx = tiny_ctx()
    model = ctx.model.select([0, 1])
    proj = W2Projection(alpha=0.5, cap=10.0, remote_batch_size=None)
    proj.start(model, ctx)
    with torch.no_grad():  # move away from the reference so the W2 term has a gradient
        for p in model.parameters():
            p.add_(0.1)
    d = [torch.randn_like(p) for p in model.parameters()]
    out = proj.project(model, d)
    losses, evals = proj.protected(model)
    assert evals == 8 + 11 and len(losses) == 2
    for loss in losses:
        g = torch.autograd.grad(loss.sum(), list(model.parameters()), retain_graph=True)
        assert torch.all(dot(g, out).abs() < 1e-10 * (1 + dot(g, d).abs()))


def test_saliency_mask_keeps_the_top_fraction_per_member(caplog):
    ctx = tiny_ctx()
    mask = saliency_mask(ctx.model, ctx.X_forget, ctx.y_forget, 0.25)
    flat = flatten(mask)
    p = flat.shape[1]
    assert flat.sum(1).tolist() == [round(0.25 * p)] * 2
    with caplog.at_level("WARNING", logger="unlearning.methods.salun"):
        res = run_method("salun", ctx, {"mask_fraction": 0.25, "epochs": 2})
    assert "nonzero forget gradient" not in caplog.text  # the whole fraction was held: no warning
    delta = flatten([a - b for a, b in zip(res.model.parameters(), ctx.model.parameters())])
    mask = flatten(saliency_mask(ctx.model, ctx.X_forget, ctx.y_forget, 0.25))
    assert torch.all(delta[mask == 0] == 0) and torch.any(delta[mask == 1] != 0)


def test_saliency_mask_never_selects_a_weight_of_zero_saliency(caplog):
    # digits: pixels that are 0 in every forget row give their first-layer weights a zero gradient; with more
    # zeros than 1 - mask_fraction the threshold was 0 and the mask held every weight (an unmasked SalUn)
    ctx = tiny_ctx()
    ctx.X_forget[:, 1:] = 0.0  # inputs 1..3 are 0 in every forget row: 15 of the 5x4 first-layer weights
    masks = saliency_mask(ctx.model, ctx.X_forget, ctx.y_forget, 0.9)
    flat, p = flatten(masks), flatten(masks).shape[1]
    assert flat.sum(1).max() < round(0.9 * p)
    first_weight = masks[0]  # [N, 5, 4]: the hidden layer's weight
    assert first_weight.shape[-1] == 4 and not first_weight[..., 1:].any()
    with caplog.at_level("WARNING", logger="unlearning.methods.salun"):
        res = run_method("salun", ctx, {"mask_fraction": 0.9, "epochs": 1})
    realised = res.info["mask_fraction_realised"]
    assert realised == (flat.sum(1) / p).tolist() and max(realised) < 0.9
    # counts, not a rounded share ("0.500 of the weights, fewer than mask_fraction = 0.5" contradicted itself)
    held = int(flat.sum(1).min())
    assert f"only {held} of the {p} weights" in caplog.text
    assert f"fewer than the {round(0.9 * p)} that mask_fraction = 0.9 asks for" in caplog.text
    delta = flatten([a - b for a, b in zip(res.model.parameters(), ctx.model.parameters())])
    assert torch.all(delta[flat == 0] == 0)


def test_retrain_is_the_oracle_and_mse_is_supported():
    ctx = tiny_ctx(dtype=torch.float32)
    res = run_method("retrain", ctx, {})
    oracle = build_model(SPEC, ctx.model.seeds)
    train_ensemble(oracle, ctx.X_retain.float(), ctx.y_retain, epochs=2, batch_size=8, lr=1e-2)
    assert all(torch.equal(a, b) for a, b in zip(res.model.parameters(), oracle.parameters()))
    assert res.cost.gradient_evals == 2 * 22 * 2
    # mse: the same loop with the squared loss lowers the retain loss from a fresh init
    ctx = tiny_ctx(dtype=torch.float32, loss="mse")
    res = run_method("retrain", ctx, {"epochs": 20})
    fresh = build_model(SPEC, ctx.model.seeds)
    mse = lambda m: per_sample_loss(m(ctx.X_retain.float()), ctx.y_retain.expand(2, -1), "mse").mean().item()
    assert mse(res.model) < 0.7 * mse(fresh)
    assert train_mse(fresh, ctx.X_retain.float(), ctx.y_retain, ctx.recipe, 1) == 3  # ceil(22 / 8) steps


@pytest.mark.parametrize("name", ["do_nothing", "finetune", "gradient_ascent", "descent_ascent"])
def test_mse_methods_run(name):
    ctx = tiny_ctx(loss="mse")
    res = run_method(name, ctx, {})
    assert all(torch.isfinite(p).all() for p in res.model.parameters())
    if name == "finetune":
        before = per_sample_loss(ctx.model(ctx.X_retain), ctx.y_retain.expand(2, -1), "mse").mean()
        after = per_sample_loss(res.model(ctx.X_retain), ctx.y_retain.expand(2, -1), "mse").mean()
        assert after < before


@pytest.mark.parametrize("name", ["scrub", "salun", "al_wpgd"])
def test_ce_only_methods_refuse_mse_clearly(name):
    with pytest.raises(ValueError, match=f"{name} needs loss='ce'"):
        run_method(name, tiny_ctx(loss="mse"), {})


def test_losses_reference_values():
    z = torch.tensor([[[2.0, 0.0, -1.0]]], dtype=torch.float64)
    y = torch.tensor([[0]])
    ce = -torch.log_softmax(z, -1)[0, 0, 0]
    assert per_sample_loss(z, y, "ce").item() == pytest.approx(ce.item())
    assert per_sample_loss(z, y, "mse").item() == pytest.approx(0.5 * (1 + 0 + 1))
    zf = torch.tensor([[[1.5]]], dtype=torch.float64)
    assert per_sample_loss(zf, torch.tensor([[0.5]], dtype=torch.float64), "mse").item() == pytest.approx(0.5)
    t = torch.tensor([[[0.0, 1.0, 0.5]]], dtype=torch.float64)
    p, q = torch.softmax(t / 2, -1), torch.softmax(z / 2, -1)
    assert kl_teacher_student(z, t, 2.0).item() == pytest.approx(4 * (p * (p / q).log()).sum().item())
    with pytest.raises(ValueError, match="allowed"):
        per_sample_loss(z, y, "hinge")


def test_flatten_roundtrip():
    like = [torch.zeros(2, 3, 4), torch.zeros(2, 1, 5)]
    flat = torch.arange(2 * 17, dtype=torch.float32).view(2, 17)
    assert torch.equal(flatten(unflatten(flat, like)), flat)


@pytest.mark.parametrize("args", [
    {"geometry": "diag_fisher", "fisher_samples": 12, "optimizer": "sgd", "lr": 1e-3, "batch_size": 3, "epochs": 2},
    {"epochs": 50, "lr": 0.05, "batch_size": 3, "target_forget_acc": 0.4, "max_grad_evals": 60},
])
def test_member_equivalence_with_fisher_geometry_target_and_budget(args):
    """Per-member stop rules (target, budget) and the Fisher geometry keep member k == lone member k."""
    ctx = tiny_ctx(seeds=(1, 2, 3), dtype=torch.float32)
    ens = run_method("gradient_ascent", ctx, args)
    total = 0
    for k in range(3):
        lone_ctx = UnlearnContext(ctx.model.select(k), ctx.X_forget, ctx.y_forget, ctx.X_retain, ctx.y_retain,
                                  ctx.adjacent_mask, ctx.recipe, seed=ctx.seed)
        lone = run_method("gradient_ascent", lone_ctx, args)
        total += lone.cost.gradient_evals
        for a, b in zip(ens.model.parameters(), lone.model.parameters()):
            torch.testing.assert_close(a[k : k + 1], b, atol=1e-5, rtol=0)
    assert total == ens.cost.gradient_evals
    if "max_grad_evals" in args:
        assert max(ens.info["gradient_evals_per_member"]) <= 60


def test_member_adam_in_bfloat16_steps_like_torch_adam():
    # the bias correction was computed in the parameters' dtype: in bfloat16 0.999 is 1.0, so 1 - 0.999**t was 0
    # and every step was 0 or NaN (descent_ascent, salun and al_wpgd returned all-NaN bf16 members)
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(2, 4, generator=g).to(torch.bfloat16)
    grads = [torch.randn(2, 4, generator=g).to(torch.bfloat16) for _ in range(3)]
    grads[0][:, 0] = 0.0  # a zero gradient: 0 / 0 before
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([ref], lr=1e-2)
    mine, mopt = p0.clone(), MemberOptimizer(OptimizerSpec(kind="adam", lr=1e-2), 2)
    for gr in grads:
        ref.grad = gr.clone()
        opt.step()
        mine -= mopt.update([gr], torch.tensor([True, True]))[0]
    assert torch.isfinite(mine).all() and not torch.equal(mine, p0)
    torch.testing.assert_close(mine.float(), ref.detach().float(), atol=2e-2, rtol=0)


def test_newton_ggn_without_weight_decay_steps_with_the_zero_decay_lam_and_keeps_an_explicit_zero(caplog):
    """train.weight_decay = 0 made the default lam 0: a singular GGN whose pseudo-inverse stepped by 1e11 (NaN
    logits). The lam it reports must be the lam it steps with: on ridge regression (a linear member, squared loss)
    one step lands on the closed-form solution for that lam, computed here in numpy float64 (docs/design.md §4.1):
    from the full-data minimiser, the default influence step lands on the retain rows' ridge solution; an explicit
    lam = 0 steps to the retain rows' least squares."""
    from tests.unit.test_newton_ggn import ctx_for, linear_model, ridge_problem, ridge_with_bias

    X, y = ridge_problem(seed=2)
    forget = np.array([0, 5, 7, 11])
    retain = np.setdiff1d(np.arange(len(y)), forget)
    no_decay = TrainRecipe(1, 8, 0.1, weight_decay=0.0)
    for args, lam in (({}, 1.0), ({"zero_decay_lam": 3.0}, 3.0)):
        ctx, _ = ctx_for(linear_model(4, [1], ridge_with_bias(X, y, lam)), X, y, forget, recipe=no_decay)
        res = run_method("newton_ggn", ctx, args)
        assert res.info["lam"] == lam and "train.weight_decay is 0" in caplog.text
        np.testing.assert_allclose(flat_params(res.model)[0].numpy(), ridge_with_bias(X[retain], y[retain], lam),
                                   rtol=0, atol=1e-8)
    ctx, _ = ctx_for(linear_model(4, [1]), X, y, forget, recipe=no_decay)
    res = run_method("newton_ggn", ctx, {"lam": 0.0, "gradient": "retain"})  # the user's choice stays
    least_squares = np.linalg.lstsq(np.c_[X[retain], np.ones(len(retain))], y[retain], rcond=None)[0]
    assert res.info["lam"] == 0.0
    np.testing.assert_allclose(flat_params(res.model)[0].numpy(), least_squares, rtol=0, atol=1e-8)
