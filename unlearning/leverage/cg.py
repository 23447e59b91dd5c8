"""Batched preconditioned conjugate gradient for symmetric positive definite operators.

Solves A X = B column by column (independent CG recursions run side by side so that each operator call
is one batched product); a column stops once ||b - A x|| <= tol ||b||, and stopped columns are left out
of later operator calls. Hestenes & Stiefel (1952); Jacobi preconditioning (Saad, Iterative Methods for
Sparse Linear Systems, §9.2).
"""

from __future__ import annotations

from typing import Callable

import torch

from unlearning.progress import tick


def conjugate_gradient(matvec: Callable[[torch.Tensor], torch.Tensor], B: torch.Tensor, *,
                       precond_diag: torch.Tensor | None = None, tol: float = 1e-10,
                       max_iters: int = 1000) -> tuple[torch.Tensor, dict]:
    """X [p, m] with matvec(X) ~= B [p, m]; info = {iterations, matvec_columns, max_rel_residual, converged}."""
    if B.dim() == 1:
        X, info = conjugate_gradient(matvec, B.unsqueeze(1), precond_diag=precond_diag, tol=tol, max_iters=max_iters)
        return X[:, 0], info
    inv_d = None if precond_diag is None else 1.0 / precond_diag.unsqueeze(1)
    X = torch.zeros_like(B)
    R = B.clone()
    Z = R if inv_d is None else R * inv_d
    P = Z.clone()
    rz = (R * Z).sum(0)
    bnorm = B.norm(dim=0)
    bnorm = torch.where(bnorm > 0, bnorm, torch.ones_like(bnorm))
    active = R.norm(dim=0) / bnorm > tol
    iters = cols = 0
    while bool(active.any()) and iters < max_iters:
        idx = active.nonzero().squeeze(1)
        Pa = P[:, idx]
        APa = matvec(Pa)
        cols += idx.numel()
        alpha = rz[idx] / (Pa * APa).sum(0)
        X[:, idx] += alpha * Pa
        R[:, idx] -= alpha * APa
        Za = R[:, idx] if inv_d is None else R[:, idx] * inv_d
        rz_new = (R[:, idx] * Za).sum(0)
        P[:, idx] = Za + (rz_new / rz[idx]) * Pa
        rz[idx] = rz_new
        iters += 1
        active[idx] = R[:, idx].norm(dim=0) / bnorm[idx] > tol
        tick()
    # The recursive residual drifts from the true one in finite precision: report the true residual.
    true_rel = ((B - matvec(X)).norm(dim=0) / bnorm) if B.shape[1] else torch.zeros(0)
    return X, {"iterations": iters, "matvec_columns": cols + B.shape[1],
               "max_rel_residual": float(true_rel.max()) if true_rel.numel() else 0.0,
               "converged": bool((true_rel <= max(tol, 1e-14) * 10).all())}
