"""Three ways to apply the inverse of a damped GGN, behind one interface (docs/design.md §4.1).

    G = lam I + sum_{S in plus} sum_{i in S} A_i^T A_i - sum_{S in minus} sum_{i in S} A_i^T A_i

with A_i = F_i J_i the Lambda-weighted Jacobian rows of `RowSet`s. The retrain geometry is obtained by
DOWNDATING the original one, G_R = G_D - sum_{i in F} J_i^T Lambda_i J_i: fit(plus=[R, F], minus=[F]),
all Jacobians taken at the original parameters (no retraining).

- `ExactSolver`: dense p x p matrix in the working dtype (float64: the reference), Cholesky. G is formed
  as sum A^T A over row chunks, lower block-triangle only (about 1.5x faster than full products).
- `ProjectedSolver`: TRAK-style sketch. With Pi [p, k] random (see `projection`), it applies
  M = Pi (Pi^T G Pi)^-1 Pi^T, formed from projected rows A_i Pi only (k x k system). M = G^-1 when
  k >= p (any invertible Pi), and M <= G^-1 in the PSD order otherwise: projected leverage keeps the
  ranking but underestimates magnitudes when k is below the effective dimension.
- `CGSolver`: matrix-free; conjugate gradient on GGN-vector products (jvp + vjp per row chunk). No p x p
  matrix. An optional Jacobi preconditioner (diag G from one streamed Jacobian pass) exists but is off by
  default: on digits MLPs it took 2-3x MORE iterations (bench/leverage.py).

Every solver offers `solve(V)` (~ G^-1 V in parameter space) and the leverage pair
`handle = leverage_handle(A_F)` / `cross(A, handle)` (~ A G^-1 A_F^T), which lets the projected solver stay
in k dimensions.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from unlearning.leverage.base import GGNSolver, _DenseMixin  # noqa: F401  (re-exported)
from unlearning.leverage.cg import conjugate_gradient
from unlearning.leverage.head import LastLayerSolver
from unlearning.leverage.projection import RandomProjection
from unlearning.leverage.rows import RowSet

SOLVERS = ("exact", "projected", "cg", "last_layer")

# `auto` thresholds (parameters of one member). Exact costs ~ n*C*p^2 flops to form G: on 2 CPU cores
# (~150 GFLOP/s float64) p = 4,810 on all 1,797 digits takes ~3 s (bench/leverage.py).
EXACT_MAX_PARAMS = 6_000
PROJECTED_MAX_PARAMS = 2_000_000
# Past this many parameters the full-model solvers cost more than a retrain on the project's models (and CG
# hundreds of GB at ResNet-18 size): auto uses the GGN of the head over the penultimate features (`head`).
LAST_LAYER_ABOVE = 50_000


def choose_solver(p: int, exact_max_params: int = EXACT_MAX_PARAMS,
                  projected_max_params: int = PROJECTED_MAX_PARAMS,
                  last_layer_above: int | None = LAST_LAYER_ABOVE) -> str:
    """Solver for `solver="auto"` by parameter count: exact (dense) for small models, projected (k x k) up to
    `projected_max_params`, matrix-free CG beyond; past `last_layer_above` (None = never) the last-layer
    mode. `cost.choose_within_budget` may then trade a full-model choice for last_layer under a time budget."""
    if last_layer_above is not None and p > last_layer_above:
        return "last_layer"
    if p <= exact_max_params:
        return "exact"
    return "projected" if p <= projected_max_params else "cg"


def _sum_rows(p: int, plus: Sequence[RowSet], minus: Sequence[RowSet], project, dtype, device,
              n_blocks: int, keep: dict | None = None, keep_bytes: int = 256 * 2**20) -> torch.Tensor:
    """sum_plus A^T A - sum_minus A^T A for (optionally projected) rows, lower block-triangle + mirror.

    Rows stay in their dtype (float32 in production: each chunk's products are exact enough); the sum over
    chunks accumulates in float64, where cancellation between thousands of chunks and the downdate would
    cost digits. With `keep` (a dict) the projected rows of each RowSet are kept there, keyed by id(rowset),
    while they fit `keep_bytes` in total, so a later pass over the same rows needs no Jacobians or projection."""
    G = torch.zeros(p, p, dtype=torch.float64, device=device)
    edges = [round(i * p / n_blocks) for i in range(n_blocks + 1)]
    kept = 0
    for sign, sets in ((1.0, plus), (-1.0, minus)):
        for rs in sets:
            rows = [] if keep is not None and id(rs) not in keep else None
            for sl, _, A in rs.weighted_chunks():
                A = A.reshape(-1, A.shape[-1])  # [b*r, p_in]
                if project is not None:
                    A = project(A)               # [b*r, k]
                if rows is not None:
                    kept += A.numel() * A.element_size()
                    rows = rows if kept <= keep_bytes else None
                    if rows is not None:
                        rows.append((sl, A))
                for a, b in zip(edges[:-1], edges[1:]):
                    if A.dtype == torch.float64:
                        G[a:b, :b].addmm_(A[:, a:b].T, A[:, :b], alpha=sign)
                    else:
                        G[a:b, :b].add_((A[:, a:b].T @ A[:, :b]).to(torch.float64), alpha=sign)
            if rows is not None:
                keep[id(rs)] = (rs, rows)  # the RowSet is held so that its id stays unique
    # mirror the strictly lower triangle
    return torch.tril(G) + torch.tril(G, -1).T


class ExactSolver(_DenseMixin, GGNSolver):
    """Dense G (p x p) accumulated and factored in float64 (the reference for every other solver)."""

    name = "exact"

    def fit(self, plus, minus=()):
        t0 = time.perf_counter()
        ref = (list(plus) + list(minus))[0]
        p, dtype, device = ref.p, ref.fn.dtype, ref.fn.device
        G = _sum_rows(p, plus, minus, None, dtype, device, n_blocks=4 if p >= 1024 else 1)
        G.diagonal().add_(self.lam)
        self.G = G
        self._factor(G)
        self.info.update(p=p, seconds_fit=time.perf_counter() - t0)
        return self

    def solve(self, V):
        return self._dense_solve(V)


class ProjectedSolver(_DenseMixin, GGNSolver):
    """M = Pi (Pi^T G Pi)^-1 Pi^T with Pi^T G Pi = lam Pi^T Pi + sum (A Pi)^T (A Pi) [- downdate].

    k is capped at p (k = p with an invertible Pi already gives M = G^-1 exactly)."""

    name = "projected"

    # the projection is generated once per fit and held while it fits this many bytes (p = 131k at k = 2,048
    # in float32); past it, blocks are regenerated per use (see `projection`)
    CACHE_BYTES = 1 << 30

    def __init__(self, lam: float, k: int = 2048, *, kind: str = "gaussian", seed: int = 0, keep_rows: bool = True):
        super().__init__(lam)
        self.k_requested, self.kind, self.seed, self.keep_rows = int(k), kind, int(seed), bool(keep_rows)

    def fit(self, plus, minus=()):
        t0 = time.perf_counter()
        ref = (list(plus) + list(minus))[0]
        p, dtype, device = ref.p, ref.fn.dtype, ref.fn.device
        self.k = min(self.k_requested, p)
        self.proj = RandomProjection(p, self.k, kind=self.kind, seed=self.seed, dtype=dtype, device=device,
                                     cache_bytes=self.CACHE_BYTES)
        self._rows: dict = {}  # projected rows kept from this pass (see cross_chunks)
        Gk = _sum_rows(self.k, plus, minus, self.proj.project, dtype, device,
                       n_blocks=4 if self.k >= 1024 else 1, keep=self._rows if self.keep_rows else None)
        Gk += self.lam * self.proj.gram().to(torch.float64)
        self.Gk = Gk
        self._factor(Gk)
        self.info.update(p=p, k=self.k, kind=self.kind, seed=self.seed, seconds_fit=time.perf_counter() - t0)
        return self

    def solve(self, V):
        vec = V.dim() == 1
        V2 = V.unsqueeze(1) if vec else V
        X = self.proj.lift(self._dense_solve(self.proj.project(V2.T).T))
        return X[:, 0] if vec else X

    def leverage_handle(self, A_F):
        return self._dense_solve(self.proj.project(A_F).T.contiguous())  # [k, r]

    def clone(self) -> "ProjectedSolver":
        """A fresh solver with the same projection (k, kind, seed): the subsample check's twin."""
        return ProjectedSolver(self.lam, self.k_requested, kind=self.kind, seed=self.seed)

    def kept(self, rs) -> bool:
        """The projected rows of `rs` were kept from the fit (no Jacobians needed again)."""
        return id(rs) in self._rows

    def cross(self, A, handle):
        return self.proj.project(A) @ handle

    def cross_chunks(self, rs, handle):
        if id(rs) in self._rows:  # projected during fit: no Jacobians, no projection again
            for sl, Ak in self._rows[id(rs)][1]:
                yield sl, Ak @ handle
        else:
            yield from super().cross_chunks(rs, handle)


class CGSolver(GGNSolver):
    """Matrix-free: G V = lam V + sum_plus J^T Lambda J V - sum_minus J^T Lambda J V, solved by batched
    conjugate gradient (optionally Jacobi-preconditioned)."""

    name = "cg"

    def __init__(self, lam: float, *, max_iters: int = 500, tol: float = 1e-10, precondition: bool = False):
        super().__init__(lam)
        self.max_iters, self.tol, self.precondition = int(max_iters), float(tol), bool(precondition)
        self.info.update(iterations=0, matvec_columns=0, max_rel_residual=0.0, converged=True)

    def fit(self, plus, minus=()):
        t0 = time.perf_counter()
        self.plus, self.minus = list(plus), list(minus)
        ref = (self.plus + self.minus)[0]
        self.p = ref.p
        self.diag = None
        if self.precondition:  # diag(G) = lam + sum_i sum_rows A_i^2 (one streamed Jacobian pass)
            d = torch.full((self.p,), self.lam, dtype=ref.fn.dtype, device=ref.fn.device)
            for sign, sets in ((1.0, self.plus), (-1.0, self.minus)):
                for rs in sets:
                    for _, _, A in rs.weighted_chunks():
                        d += sign * (A * A).sum((0, 1))
            floor = max(self.lam, float(d.abs().max()) * 1e-12, torch.finfo(d.dtype).tiny)
            self.diag = d.clamp_min(floor)
        self.info.update(p=self.p, preconditioner="jacobi" if self.precondition else "none",
                         seconds_fit=time.perf_counter() - t0)
        return self

    def clone(self) -> "CGSolver":
        """A fresh solver with the same tolerance and iteration cap: the subsample check's twin."""
        return CGSolver(self.lam, max_iters=self.max_iters, tol=self.tol, precondition=self.precondition)

    def matvec(self, V: torch.Tensor) -> torch.Tensor:
        out = self.lam * V
        for rs in self.plus:
            out = out + rs.ggn_matvec(V)
        for rs in self.minus:
            out = out - rs.ggn_matvec(V)
        return out

    def solve(self, V):
        X, info = conjugate_gradient(self.matvec, V, precond_diag=self.diag, tol=self.tol, max_iters=self.max_iters)
        self.info["iterations"] = max(self.info["iterations"], info["iterations"])
        self.info["matvec_columns"] += info["matvec_columns"]
        self.info["max_rel_residual"] = max(self.info["max_rel_residual"], info["max_rel_residual"])
        self.info["converged"] = self.info["converged"] and info["converged"]
        return X


def make_solver(name: str, lam: float, *, p: int | None = None, proj_dim: int = 2048,
                proj_kind: str = "gaussian", seed: int = 0, cg_iters: int = 500, cg_tol: float = 1e-10,
                cg_precondition: bool = False, exact_max_params: int = EXACT_MAX_PARAMS,
                projected_max_params: int = PROJECTED_MAX_PARAMS,
                last_layer_above: int | None = LAST_LAYER_ABOVE, keep_rows: bool = True) -> GGNSolver:
    """Build a solver by name; "auto" needs `p` and picks by parameter count (`choose_solver`). "last_layer"
    is the head's GGN (`head.LastLayerSolver`): it needs RowSets over the head's function."""
    if name == "auto":
        if p is None:
            raise ValueError("solver='auto' needs the parameter count p")
        name = choose_solver(p, exact_max_params, projected_max_params, last_layer_above)
    if name == "exact":
        return ExactSolver(lam)
    if name == "projected":
        return ProjectedSolver(lam, proj_dim, kind=proj_kind, seed=seed, keep_rows=keep_rows)
    if name == "cg":
        return CGSolver(lam, max_iters=cg_iters, tol=cg_tol, precondition=cg_precondition)
    if name == "last_layer":
        return LastLayerSolver(lam)
    raise ValueError(f"solver={name!r} is not known; allowed: {['auto', *SOLVERS]}")
