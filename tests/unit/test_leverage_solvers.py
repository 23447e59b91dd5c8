"""Jacobians, the GGN and the three solvers against brute-force float64 references on tiny models."""

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from unlearning.leverage import (
    CGSolver, ExactSolver, OutputFunction, ProjectedSolver, RandomProjection, RowSet, StackedMemberFunction,
    choose_solver, make_solver, make_targets, spearman,
)
from unlearning.leverage.cg import conjugate_gradient
from unlearning.leverage.curvature import apply_curvature, curvature_factor
from unlearning.models import build_model

MLP = {"arch": "mlp", "in_dim": 5, "hidden": [6, 4], "n_classes": 3, "image_shape": None}
CNN = {"arch": "cnn", "in_dim": 16, "channels": [2], "n_classes": 3, "image_shape": [4, 4]}


def member_fn(spec=MLP, seeds=(11, 12), member=1, scale=2.0):
    model = build_model(spec, list(seeds))
    with torch.no_grad():  # larger weights than the default init: confident, non-uniform softmax
        for p in model.parameters():
            p.mul_(scale)
    return model, StackedMemberFunction(model, member, dtype=torch.float64, device="cpu")


def brute_jacobians(fn, X):
    """[n, C, p] by differentiating the whole output table at once (no vmap)."""
    return jacobian(lambda t: fn.outputs(t, X), fn.theta0)


def brute_ggn(fn, X, y, lam):
    J = brute_jacobians(fn, X)
    p = torch.softmax(fn.outputs(fn.theta0, X), 1)
    Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndq->pq", J, Lam, J) + lam * torch.eye(fn.p, dtype=J.dtype), J, Lam


def sym_sqrt(L):
    w, U = torch.linalg.eigh(L)
    return (U * w.clamp_min(0).sqrt().unsqueeze(-2)) @ U.transpose(-1, -2)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(70, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (70,), generator=g)
    return X, y


@pytest.mark.parametrize("spec", [MLP, CNN, {**MLP, "hidden": []}])
def test_jacobians_and_products_match_autograd(spec):
    _, fn = member_fn(spec)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(9, spec["in_dim"], generator=g, dtype=torch.float64)
    J = brute_jacobians(fn, X)
    assert J.shape == (9, 3, fn.p)
    torch.testing.assert_close(fn.jacobians(fn.theta0, X), J, rtol=0, atol=1e-12)
    left = curvature_factor(fn.outputs(fn.theta0, X), "ce")
    torch.testing.assert_close(fn.weighted_jacobians(fn.theta0, X, left), left @ J, rtol=0, atol=1e-12)
    V = torch.randn(fn.p, 4, generator=g, dtype=torch.float64)
    U = torch.randn(4, 9, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(fn.jvp(fn.theta0, X, V), torch.einsum("bcp,pm->mbc", J, V), rtol=0, atol=1e-12)
    torch.testing.assert_close(fn.vjp(fn.theta0, X, U), torch.einsum("bcp,mbc->mp", J, U), rtol=0, atol=1e-12)


def test_member_function_copies_and_writes_back():
    model, fn = member_fn()
    flat1 = torch.cat([p[1].detach().reshape(-1) for p in model.parameters()]).double()
    torch.testing.assert_close(fn.theta0, flat1)
    fn.theta0.add_(1.0)  # the function holds its own copy
    assert torch.equal(torch.cat([p[1].detach().reshape(-1) for p in model.parameters()]).double(), flat1)
    fn.write_into(model, 0, flat1 * 3)
    torch.testing.assert_close(torch.cat([p[0].detach().reshape(-1) for p in model.parameters()]).double(),
                               (flat1 * 3).float().double())


def test_curvature_factor_and_products():
    g = torch.Generator().manual_seed(2)
    f = torch.randn(8, 4, generator=g, dtype=torch.float64) * 3
    p = torch.softmax(f, 1)
    Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    Fac = curvature_factor(f, "ce")
    assert Fac.shape == (8, 3, 4)
    torch.testing.assert_close(Fac.transpose(1, 2) @ Fac, Lam, rtol=0, atol=1e-14)
    U = torch.randn(2, 8, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(apply_curvature(f, U, "ce"), torch.einsum("bij,mbj->mbi", Lam, U))
    torch.testing.assert_close(curvature_factor(f, "mse"), torch.eye(4, dtype=f.dtype).expand(8, 4, 4))


def test_exact_ggn_and_downdate_match_brute_force(data):
    X, y = data
    _, fn = member_fn()
    lam = 0.3
    G, J, Lam = brute_ggn(fn, X, y, lam)
    t = make_targets(y, 3, "ce", torch.float64, "cpu")
    rs_R = RowSet(fn, fn.theta0, X[10:], t[10:], "ce", chunk=16)
    rs_F = RowSet(fn, fn.theta0, X[:10], t[:10], "ce", chunk=4)
    D = ExactSolver(lam).fit(plus=[rs_R, rs_F])
    torch.testing.assert_close(D.G, G, rtol=0, atol=1e-10)
    R = ExactSolver(lam).fit(plus=[rs_R, rs_F], minus=[rs_F])  # G_R = G_D - G_F
    G_R = G - torch.einsum("ncp,ncd,ndq->pq", J[:10], Lam[:10], J[:10])
    torch.testing.assert_close(R.G, G_R, rtol=0, atol=1e-10)
    # the Lambda^1/2-weighted leverage (symmetric square root) has the same per-sample traces / block norms
    W = sym_sqrt(Lam) @ J                                  # [n, C, p]
    WF, WR = W[:10].reshape(-1, fn.p), W[10:].reshape(-1, fn.p)
    S_ref = WF @ torch.linalg.solve(G_R, WF.T)
    C_ref = WR @ torch.linalg.solve(G_R, WF.T)
    _, A_F = rs_F.all_weighted()
    A_F = A_F.reshape(-1, fn.p)
    S = R.cross(A_F, R.leverage_handle(A_F))
    torch.testing.assert_close(S.diagonal().reshape(10, 2).sum(1), S_ref.diagonal().reshape(10, 3).sum(1))
    torch.testing.assert_close(torch.linalg.eigvalsh(S)[-1], torch.linalg.eigvalsh(S_ref)[-1])
    _, A_R = rs_R.all_weighted()
    Cm = R.cross(A_R.reshape(-1, fn.p), R.leverage_handle(A_F))
    torch.testing.assert_close(Cm.reshape(60, -1).norm(dim=1), C_ref.reshape(60, -1).norm(dim=1))
    # docs/design.md §4.1 with X -> A: S_F = P_F (I - P_F)^-1, P_F the leverage under the original G_D
    P = D.cross(A_F, D.leverage_handle(A_F))
    torch.testing.assert_close(S, P @ torch.linalg.inv(torch.eye(P.shape[0], dtype=P.dtype) - P), rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    _, fn = member_fn()
    t = make_targets(y, 3, "ce", torch.float64, "cpu")
    rs_R = RowSet(fn, fn.theta0, X[10:], t[10:], "ce")
    rs_F = RowSet(fn, fn.theta0, X[:10], t[:10], "ce")
    lam = 0.1
    exact = ExactSolver(lam).fit([rs_R, rs_F], [rs_F])
    _, A_F = rs_F.all_weighted()
    A_F = A_F.reshape(-1, fn.p)
    S = exact.cross(A_F, exact.leverage_handle(A_F))
    g = torch.Generator().manual_seed(3)
    V = torch.randn(fn.p, 3, generator=g, dtype=torch.float64)
    return dict(fn=fn, rs_R=rs_R, rs_F=rs_F, lam=lam, exact=exact, A_F=A_F, S=S, V=V, ref=exact.solve(V))


def self_lev(S, n):
    return S.diagonal().reshape(n, -1).sum(1)


@pytest.mark.parametrize("precondition", [False, True])
def test_cg_matches_exact(fitted, precondition):
    f = fitted
    cg = CGSolver(f["lam"], max_iters=2000, tol=1e-11, precondition=precondition)
    cg.fit([f["rs_R"], f["rs_F"]], [f["rs_F"]])
    X = cg.solve(f["V"])
    assert (X - f["ref"]).norm() / f["ref"].norm() < 1e-6
    A4 = f["A_F"][:8]  # the rows of the first 4 forget samples
    S = cg.cross(A4, cg.leverage_handle(A4))
    exact = self_lev(f["S"], 10)[:4]
    assert (self_lev(S, 4) - exact).norm() / exact.norm() < 1e-6
    assert cg.info["converged"] and cg.info["iterations"] > 1 and cg.info["max_rel_residual"] < 1e-10


def test_cg_matvec_is_the_ggn(fitted):
    f = fitted
    cg = CGSolver(f["lam"], precondition=False).fit([f["rs_R"], f["rs_F"]], [f["rs_F"]])
    torch.testing.assert_close(cg.matvec(f["V"]), f["exact"].G @ f["V"], rtol=0, atol=1e-10)


def test_multi_column_products_are_chunked_without_changing_results(fitted):
    f = fitted
    rs = f["rs_R"]
    full = rs.ggn_matvec(f["V"]), rs.jvp(f["V"])
    assert len(list(rs.slices(3))) == 1
    rs._tangent_budget = 1  # forces one sample per chunk
    try:
        assert len(list(rs.slices(3))) == rs.n
        torch.testing.assert_close(rs.ggn_matvec(f["V"]), full[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(rs.jvp(f["V"]), full[1], rtol=0, atol=1e-12)
    finally:
        rs._tangent_budget = 256 * 2**20


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_projected_full_rank_is_exact(fitted, kind):
    f = fitted
    pr = ProjectedSolver(f["lam"], k=10 * f["fn"].p, kind=kind, seed=5).fit([f["rs_R"], f["rs_F"]], [f["rs_F"]])
    assert pr.k == f["fn"].p  # capped at p
    S = pr.cross(f["A_F"], pr.leverage_handle(f["A_F"]))
    torch.testing.assert_close(self_lev(S, 10), self_lev(f["S"], 10), rtol=1e-7, atol=0)
    torch.testing.assert_close(pr.solve(f["V"]), f["ref"], rtol=1e-7, atol=1e-9)


def test_projected_low_rank_keeps_ranking_and_underestimates(fitted):
    f = fitted
    p = f["fn"].p
    exact = self_lev(f["S"], 10).numpy()
    for k, min_rho in ((p // 2, 0.85), (3 * p // 4, 0.9)):
        pr = ProjectedSolver(f["lam"], k=k, seed=1).fit([f["rs_R"], f["rs_F"]], [f["rs_F"]])
        got = self_lev(pr.cross(f["A_F"], pr.leverage_handle(f["A_F"])), 10).numpy()
        # Pi (Pi^T G Pi)^-1 Pi^T <= G^-1 (PSD order): every self-leverage is underestimated
        assert np.all(got <= exact * (1 + 1e-9))
        assert spearman(got, exact) >= min_rho, (k, spearman(got, exact))


def test_random_projection_blocks_are_consistent():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(5, 23, generator=g, dtype=torch.float64)
    cached = RandomProjection(23, 7, seed=9, block=10)
    streamed = RandomProjection(23, 7, seed=9, block=10, cache_bytes=0)
    assert streamed._full is None and cached._full is not None
    torch.testing.assert_close(cached.project(A), streamed.project(A), rtol=0, atol=1e-14)
    Pi = cached._full
    torch.testing.assert_close(streamed.gram(), Pi.T @ Pi)
    Z = torch.randn(7, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(streamed.lift(Z), Pi @ Z)
    rad = RandomProjection(23, 7, kind="rademacher", seed=9)._full
    assert torch.allclose(rad.abs(), torch.full_like(rad, 7 ** -0.5))
    with pytest.raises(ValueError, match="kind"):
        RandomProjection(3, 2, kind="sparse")


def test_batched_cg_on_spd_system():
    g = torch.Generator().manual_seed(5)
    M = torch.randn(30, 30, generator=g, dtype=torch.float64)
    A = M @ M.T + 0.5 * torch.eye(30, dtype=torch.float64)
    B = torch.randn(30, 4, generator=g, dtype=torch.float64)
    B[:, 2] = 0  # a zero right-hand side converges at once to zero
    for diag in (None, A.diagonal()):
        X, info = conjugate_gradient(lambda V: A @ V, B, precond_diag=diag, tol=1e-12, max_iters=500)
        torch.testing.assert_close(X, torch.linalg.solve(A, B), rtol=0, atol=1e-8)
        assert info["converged"] and torch.all(X[:, 2] == 0)


def test_singular_exact_falls_back_to_pseudo_inverse(data):
    X, y = data
    _, fn = member_fn()
    t = make_targets(y, 3, "ce", torch.float64, "cpu")
    rs = RowSet(fn, fn.theta0, X[:3], t[:3], "ce")  # 6 rows << p, lam = 0: singular
    s = ExactSolver(0.0).fit([rs])
    assert s.info["factorization"] == "eigh_pinv" and s.info["rank"] <= 6
    v = s.G @ torch.randn(fn.p, dtype=torch.float64)  # in the range: G G^+ v = v
    torch.testing.assert_close(s.G @ s.solve(v), v, rtol=0, atol=1e-8)


def test_choose_and_make_solver():
    assert choose_solver(100) == "exact"
    assert choose_solver(40_000) == "projected"
    assert choose_solver(100_000) == "last_layer"  # past last_layer_above (50,000)
    assert choose_solver(100_000, last_layer_above=None) == "projected"
    assert choose_solver(10_000_000, last_layer_above=None) == "cg"
    assert choose_solver(500, exact_max_params=400) == "projected"
    assert make_solver("last_layer", 1.0).name == "last_layer"
    assert make_solver("auto", 1.0, p=10).name == "exact"
    assert make_solver("projected", 1.0, proj_dim=8).k_requested == 8
    with pytest.raises(ValueError, match="solver='newton'"):
        make_solver("newton", 1.0)
    with pytest.raises(ValueError, match="lam"):
        ExactSolver(-1.0)


def test_generic_output_function_defaults(data):
    """The base class's torch.func paths (used for models without closed forms) agree with the MLP ones."""
    X, _ = data
    _, fn = member_fn()
    V = torch.randn(fn.p, 2, dtype=torch.float64)
    left = curvature_factor(fn.outputs(fn.theta0, X[:5]), "ce")
    torch.testing.assert_close(OutputFunction.weighted_jacobians(fn, fn.theta0, X[:5], left),
                               fn.weighted_jacobians(fn.theta0, X[:5], left), rtol=0, atol=1e-12)
    torch.testing.assert_close(OutputFunction.jvp(fn, fn.theta0, X, V), fn.jvp(fn.theta0, X, V))
    U = torch.randn(2, X.shape[0], 3, dtype=torch.float64)
    torch.testing.assert_close(OutputFunction.vjp(fn, fn.theta0, X, U), fn.vjp(fn.theta0, X, U))


def test_subsample_check_kernel_stays_positive_definite_for_large_scaled_rows():
    """A 30,000-row table checked on 64 rows scales them by sqrt(470): B B^T formed in float32 rounded by more than
    lam and Cholesky refused it ("not positive-definite"). The kernel is formed in float64; the solve matches
    the float64 closed form (lam I + B^T B)^-1."""
    import torch

    from unlearning.leverage.check import Woodbury

    g = torch.Generator().manual_seed(0)
    B = (torch.randn(600, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 40, generator=g, dtype=torch.float64)
         * 3e3).to(torch.float32)  # [q, p], rank 3, huge entries
    K32 = (B @ B.T).to(torch.float64)
    K32.diagonal().add_(1.0)
    assert torch.linalg.cholesky_ex(K32).info.item() != 0  # the float32 kernel is indefinite: the old failure
    w = Woodbury(B, 1.0)
    V = torch.randn(40, 2, generator=g, dtype=torch.float64)
    Bd = B.to(torch.float64)
    ref = torch.linalg.solve(torch.eye(40, dtype=torch.float64) + Bd.T @ Bd, V)
    got = w.solve(V.to(torch.float32)).to(torch.float64)  # rows and right-hand sides in the model's float32
    assert torch.allclose(got, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_curvature_factor_is_finite_on_confident_rows_in_float32():
    """A row the model is sure of (softmax 1.0, the rest down to 1e-45) gave NaN factors in float32 eigh: 171 of
    30,000 Fashion-MNIST rows, and a failed diagnostics stage. F^T F is still Lambda = diag(p) - p p^T."""
    import torch

    from unlearning.leverage.curvature import curvature_factor

    f = torch.tensor([[3.6873, 17.3675, 1.9589, 3.1899, -0.4625, -38.3956, -3.0782, -116.5358, -5.6851, -84.8916],
                      [0.1, 0.2, 0.3, 0.0, -0.1, 0.05, 0.0, 0.0, 0.2, 0.1]], dtype=torch.float32)
    F = curvature_factor(f, "ce")
    assert F.dtype == torch.float32 and torch.isfinite(F).all()
    p = torch.softmax(f.double(), 1)
    lam = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
    assert torch.allclose((F.double().transpose(1, 2) @ F.double()), lam, atol=1e-6)
