"""Ridge regression: the exact special case of the leverage diagnostics (docs/design.md §4.1).

Objective over the given rows (no implicit intercept: add a constant column to X for one):
    L_S(theta) = 0.5 ||X_S theta - y_S||^2 + 0.5 lam ||theta||^2,   H_S = X_S^T X_S + lam I.
With D = R u F and e_F = y_F - X_F theta_D:
    theta_D - theta_R = H_R^-1 X_F^T e_F,  S_F = X_F H_R^-1 X_F^T,  C_RF = X_R H_R^-1 X_F^T,
    output gap (original minus retrained) on F = S_F e_F, on R = C_RF e_F,
    H_R = H_D - X_F^T X_F  =>  S_F = P_F (I - P_F)^-1 with P_F = X_F H_D^-1 X_F^T.
`ridge_diagnostics` runs the SAME code path as the neural-network diagnostics (`diagnostics.diagnose`
with a linear output function, squared loss, exact float64 solver), so these identities test it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from unlearning.leverage import curvature
from unlearning.leverage.diagnostics import LeverageReport, diagnose
from unlearning.leverage.functions import LinearFunction
from unlearning.leverage.solvers import ExactSolver


@dataclass
class RidgeLeverage:
    """Ridge leverage quantities as float64 numpy arrays; readable as `r.x` or `r["x"]`."""

    forget_idx: np.ndarray            # [nF] row positions of F (as given)
    retain_idx: np.ndarray            # [nR] the other rows, ascending
    theta_D: np.ndarray               # [d] ridge solution on all rows
    theta_R: np.ndarray               # [d] retrained solution, theta_D - H_R^-1 X_F^T e_F (no retraining)
    residual_forget: np.ndarray       # [nF] e_F = y_F - X_F theta_D
    original_leverage: np.ndarray     # [nF, nF] P_F = X_F H_D^-1 X_F^T
    self_leverage: np.ndarray         # [nF, nF] S_F = X_F H_R^-1 X_F^T
    cross_leverage: np.ndarray        # [nR, nF] C_RF = X_R H_R^-1 X_F^T
    predicted_gap_forget: np.ndarray  # [nF] original minus retrained outputs on F (= S_F e_F)
    predicted_gap_retain: np.ndarray  # [nR] original minus retrained outputs on R (= C_RF e_F)
    leakage_ratio: float              # ||C_RF e_F|| / ||S_F e_F||
    report: LeverageReport            # the generic report it came from

    def __getitem__(self, key: str):
        if key not in self.keys():
            raise KeyError(f"{key!r}; available: {self.keys()}")
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]


def ridge_diagnostics(X, y, forget_idx, lam: float) -> RidgeLeverage:
    """Exact leverage diagnostics of ridge regression (float64) for the rows `forget_idx` of (X, y)."""
    X = torch.as_tensor(np.asarray(X), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float64).reshape(-1)
    if X.dim() != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be [n, d] and y [n], got {tuple(X.shape)} and {tuple(y.shape)}")
    n, d = X.shape
    f_idx = np.ascontiguousarray(np.asarray(forget_idx, dtype=np.int64).reshape(-1))  # torch refuses negative strides
    if f_idx.size == 0 or f_idx.min() < 0 or f_idx.max() >= n or np.unique(f_idx).size != f_idx.size:
        raise ValueError(f"forget_idx must be distinct row positions in [0, {n}), got {f_idx.tolist()[:10]}")
    if not lam > 0 and n - f_idx.size < d:
        raise ValueError(f"lam={lam} with fewer retain rows than features leaves H_R singular")
    r_idx = np.setdiff1d(np.arange(n), f_idx)
    if not lam > 0:  # without damping, rank-deficient features (a repeated or constant column) have no solution
        rank = int(torch.linalg.matrix_rank(X[torch.as_tensor(r_idx)]))
        if rank < d:
            raise ValueError(f"lam={lam}: the retain rows' features have rank {rank} < {d} columns, so H_R is "
                             f"singular; use lam > 0 or drop the linearly dependent columns")
    H_D = X.T @ X + lam * torch.eye(d, dtype=torch.float64)
    theta_D = torch.linalg.solve(H_D, X.T @ y)

    fn = LinearFunction(theta_D)
    Xf, Xr = X[torch.as_tensor(f_idx)], X[torch.as_tensor(r_idx)]
    tg = lambda v: curvature.make_targets(v, 1, "mse", torch.float64, "cpu")  # noqa: E731
    yf, yr = y[torch.as_tensor(f_idx)], y[torch.as_tensor(r_idx)]
    rep = diagnose(fn, theta_D, Xf, tg(yf), Xr, tg(yr), X[:0], tg(y[:0]), lam, "mse", ExactSolver(lam),
                   check_subset=0, keep_cross_matrix=True)
    P_F = Xf @ torch.linalg.solve(H_D, Xf.T)
    cross = rep.cross_leverage_matrix if rep.cross_leverage_matrix is not None else np.zeros((0, f_idx.size))
    return RidgeLeverage(
        forget_idx=f_idx, retain_idx=r_idx, theta_D=theta_D.numpy(), theta_R=theta_D.numpy() - rep.newton_step,
        residual_forget=(yf - Xf @ theta_D).numpy(), original_leverage=P_F.numpy(),
        self_leverage=rep.self_leverage_matrix, cross_leverage=cross,
        predicted_gap_forget=rep.predicted_output_gap_forget[:, 0],
        predicted_gap_retain=rep.predicted_output_gap_retain[:, 0],
        leakage_ratio=rep.leakage_ratio, report=rep)
