"""The error of a non-exact solver against exact, on a row subsample where the full exact solve is unaffordable
(docs/design.md §4.1).

The sub-problem: `check_rows` retain rows drawn at random (seeded) and up to `check_subset` forget rows (evenly
spaced), with the retain rows weighted by n_R / n_s so that G_s = lam I + (n_R / n_s) sum_{i in s} A_i^T A_i is an
unbiased estimate of the full G_R (same regime of damping against data), and its retain gradient likewise. On it:

- exact: Woodbury in the q = n_s r dimensional row space, never a p x p matrix:
  G_s^-1 V = (V - B^T (lam I + B B^T)^-1 B V) / lam with B = sqrt(n_R / n_s) A_s [q, p];
- the solver under test on the SAME sub-problem: projected with the same projection (seed, kind, k), cg with the
  same tolerance, last_layer as the exact GGN of the head (Woodbury over the head's rows).

Reported: relative error and Spearman of per-forget-row self-leverage and predicted gap (Fisher norm of the
predicted output change ||A_i delta||), and the Newton step's relative error for full-model solvers. The
numbers measure the solver's approximation at a stated size, not the subsampling (both sides share it).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from unlearning.leverage import curvature
from unlearning.leverage.functions import OutputFunction
from unlearning.progress import tick

DEFAULT_CHECK_ROWS = 64


class MatrixRows:
    """Explicit weighted rows B [q, p] seen as a RowSet by the solvers (weighted_chunks, ggn_matvec)."""

    def __init__(self, B: torch.Tensor, chunk: int = 512):
        self.B, self.p, self.n, self.chunk = B, B.shape[1], B.shape[0], chunk
        self.fn = SimpleNamespace(dtype=B.dtype, device=B.device)

    def slices(self, m=None):
        for a in range(0, self.n, self.chunk):
            yield slice(a, min(a + self.chunk, self.n))

    def weighted_chunks(self):
        for s in self.slices():
            yield s, None, self.B[s].unsqueeze(1)  # [b, 1, p]

    def ggn_matvec(self, V):
        return self.B.T @ (self.B @ V)


def _rows(fn: OutputFunction, theta, X, t, loss, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted rows A [n, r, p] and J^T g summed [p] for a few rows."""
    A, grad = [], torch.zeros(fn.p, dtype=fn.dtype, device=fn.device)
    for a in range(0, X.shape[0], chunk):
        Xc = X[a:a + chunk]
        with torch.no_grad():
            f = fn.outputs(theta, Xc)
        A.append(fn.weighted_jacobians(theta, Xc, curvature.curvature_factor(f, loss)).detach())
        g = curvature.residual(f, t[a:a + chunk], loss)
        grad += fn.vjp(theta, Xc, g.unsqueeze(0))[0].detach()
        tick()
    return torch.cat(A), grad


class Woodbury:
    """Exact G^-1 for G = lam I + B^T B with few rows B [q, p] (float64 kernel solve)."""

    def __init__(self, B: torch.Tensor, lam: float):
        if not lam > 0:
            raise ValueError("the subsample check needs damping lam > 0 (Woodbury divides by it)")
        self.B, self.lam = B, float(lam)
        # the kernel in float64 from float64 rows: B B^T in float32 rounds by ~1e-7 x ||B||^2, which past a few
        # thousand rows per check row (B scaled by sqrt(n_R / check_rows)) exceeds lam and made K indefinite
        Bd = B.to(torch.float64)
        K = Bd @ Bd.T
        K.diagonal().add_(self.lam)
        self.L = torch.linalg.cholesky(K)

    def solve(self, V: torch.Tensor) -> torch.Tensor:
        BV = (self.B @ V).to(torch.float64)
        Z = torch.cholesky_solve(BV, self.L).to(V.dtype)
        return (V - self.B.T @ Z) / self.lam

    def quad(self, A: torch.Tensor) -> torch.Tensor:
        """A G^-1 A^T [m, m] for rows A [m, p] in the row space, (A A^T - (A B^T) K^-1 (B A^T)) / lam: no [p, m]
        intermediate (m q p + m^2 p flops instead of 2 m q p + m^2 p)."""
        Ad, Bd = A.to(torch.float64), self.B.to(torch.float64)
        AB = Ad @ Bd.T                                                              # [m, q]
        return (Ad @ Ad.T - AB @ torch.cholesky_solve(AB.T, self.L)) / self.lam


def _block_traces(S: torch.Tensor, n: int, r: int) -> np.ndarray:
    return S.diagonal().reshape(n, r).sum(1).detach().cpu().to(torch.float64).numpy()


def _quantities(solve: Callable, A_F: torch.Tensor, grad: torch.Tensor, quad: Callable | None = None) -> dict:
    """Per forget row self-leverage, predicted gap ||A_i delta||, and the Newton step delta (`quad(A)` = A G^-1 A^T
    when the solver has a cheaper form of it)."""
    m, r, p = A_F.shape
    Af = A_F.reshape(m * r, p)
    S = quad(Af) if quad is not None else Af @ solve(Af.T.contiguous())
    delta = solve(grad.unsqueeze(1))[:, 0]
    gap = (A_F @ delta).norm(dim=1)                                    # [m]
    return {"self": _block_traces(S, m, r), "gap": gap.detach().cpu().to(torch.float64).numpy(), "delta": delta}


def _compare(got: np.ndarray, ref: np.ndarray, spearman) -> dict:
    return {"rel_err": float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300)),
            "max_rel_err": float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300))) if ref.size else 0.0,
            "spearman": spearman(got, ref) if ref.size > 2 else None}


def subsample_check(fn: OutputFunction, theta, X_F, t_F, X_R, t_R, loss: str, lam: float, solver_name: str, *,
                    make_solver: Callable | None = None, head=None, check_subset: int = 16,
                    check_rows: int = DEFAULT_CHECK_ROWS, seed: int = 0, spearman=None) -> dict:
    """Error of `solver_name` against exact on the sub-problem (module docstring). `make_solver()`: a fresh
    solver like the one under test (projected / cg); `head`: a `head.HeadOf` (last_layer)."""
    t0 = time.perf_counter()
    nF, nR = X_F.shape[0], X_R.shape[0]
    f_idx = np.unique(np.linspace(0, nF - 1, min(check_subset, nF)).round().astype(int))
    n_s = min(check_rows, nR)
    r_idx = np.sort(np.random.default_rng(seed).choice(nR, size=n_s, replace=False))
    scale = nR / max(n_s, 1)
    XF, XR = fn.cast(X_F[torch.as_tensor(f_idx)]), fn.cast(X_R[torch.as_tensor(r_idx)])
    tF, tR = t_F[torch.as_tensor(f_idx)], t_R[torch.as_tensor(r_idx)]
    A_F, _ = _rows(fn, theta, XF, tF, loss)
    A_R, g_R = _rows(fn, theta, XR, tR, loss)
    B = A_R.reshape(-1, fn.p) * scale ** 0.5
    grad = scale * g_R + lam * theta
    exact = Woodbury(B, lam)
    ref = _quantities(exact.solve, A_F, grad, exact.quad)
    if solver_name == "last_layer":
        hf, th = head.fn, head.fn.theta0
        HF, HR = head.features(XF), head.features(XR)
        Ah_F, _ = _rows(hf, th, HF, tF, loss)
        Ah_R, gh_R = _rows(hf, th, HR, tR, loss)
        head_exact = Woodbury(Ah_R.reshape(-1, hf.p) * scale ** 0.5, lam)
        got = _quantities(head_exact.solve, Ah_F, scale * gh_R + lam * th, head_exact.quad)
        step_err = None  # head space: compared through the gaps
    else:
        solver = make_solver().fit(plus=[MatrixRows(B)], minus=[])
        got = _quantities(solver.solve, A_F, grad)
        step_err = float((got["delta"] - ref["delta"]).norm() / ref["delta"].norm().clamp_min(1e-300))
    sl, gap = _compare(got["self"], ref["self"], spearman), _compare(got["gap"], ref["gap"], spearman)
    return {
        "reference": "exact_subsample", "subset_size": int(f_idx.size), "retain_rows": int(n_s),
        "retain_weight": float(scale), "seconds": time.perf_counter() - t0,
        "self_leverage_rel_err": sl["rel_err"], "self_leverage_max_rel_err": sl["max_rel_err"],
        "self_leverage_spearman": sl["spearman"],
        "predicted_gap_rel_err": gap["rel_err"], "predicted_gap_spearman": gap["spearman"],
        "newton_step_rel_err": step_err,
    }


# The diagnostics' own error check (the solver against exact, `subsample_check` or the check subset) is POOR
# past these: a predicted gap ranked with Spearman below POOR_SPEARMAN against exact orders the forget rows little
# better than chance, and a relative error above POOR_REL_ERR is as large as the quantity. The rules that read
# these numbers (predicted_gap_to_noise, leakage) then decide on noise: the batch warns on the console.
POOR_SPEARMAN = 0.5
POOR_REL_ERR = 0.5


def poor_check(approx_error: dict | None) -> list[str]:
    """The measures of a diagnostics error check past POOR_SPEARMAN / POOR_REL_ERR, in words (empty: fine)."""
    poor = []
    for key, value in (approx_error or {}).items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
            continue
        if key.endswith("_spearman") and value < POOR_SPEARMAN:
            poor.append(f"{key.removesuffix('_spearman').replace('_', ' ')} Spearman {value:.2f} < {POOR_SPEARMAN}")
        elif key.endswith("_rel_err") and not key.endswith("max_rel_err") and value > POOR_REL_ERR:
            poor.append(f"{key.removesuffix('_rel_err').replace('_', ' ')} relative error {value:.2f} > "
                        f"{POOR_REL_ERR}")
    return poor
