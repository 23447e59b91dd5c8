"""The solver interface (`GGNSolver`) and the dense factorization both the full-model solvers (`solvers`) and
the head's (`head.LastLayerSolver`) use, in a module of its own so that neither imports the other's."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator, Sequence

import torch

from unlearning.leverage.rows import RowSet


class GGNSolver(ABC):
    """Applies (an approximation of) G^-1; `info` records what was done (dims, iterations, seconds)."""

    name: str = ""

    def __init__(self, lam: float):
        if not lam >= 0:
            raise ValueError(f"lam (damping) must be >= 0, got {lam}")
        self.lam = float(lam)
        self.info: dict = {"solver": self.name}

    @abstractmethod
    def fit(self, plus: Sequence[RowSet], minus: Sequence[RowSet] = ()) -> "GGNSolver": ...

    @abstractmethod
    def solve(self, V: torch.Tensor) -> torch.Tensor:
        """~ G^-1 V for V [p, m] (or [p])."""

    def leverage_handle(self, A_F: torch.Tensor) -> torch.Tensor:
        """Prepare leverage against the rows A_F [r, p]: default G^-1 A_F^T [p, r]."""
        return self.solve(A_F.T.contiguous())

    def cross(self, A: torch.Tensor, handle: torch.Tensor) -> torch.Tensor:
        """A G^-1 A_F^T [s, r] for rows A [s, p]."""
        return A @ handle

    def cross_chunks(self, rs: RowSet, handle: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
        """(slice, A_b G^-1 A_F^T [b*r, m]) over the chunks of a RowSet."""
        for sl, _, A in rs.weighted_chunks():
            yield sl, self.cross(A.reshape(-1, A.shape[-1]), handle)


class _DenseMixin:
    """Cholesky of a dense SPD matrix, eigh pseudo-inverse as the fallback when it is singular.

    `factor_float32_above`: past this dimension a float32 Cholesky is tried first (half the time of float64 on
    CPU for p^3 / 3 flops; its solves of a few columns get one step of float64 iterative refinement against G,
    the many-column leverage solves keep float32's ~cond x 1e-7 relative error); float64 when it fails."""

    factor_float32_above: int | None = None

    def _factor(self, G: torch.Tensor) -> None:
        n = G.shape[0]
        if self.factor_float32_above is not None and n > self.factor_float32_above:
            L, info = torch.linalg.cholesky_ex(G.to(torch.float32))
            if int(info) == 0:
                self._chol, self._pinv = L, None
                self.info["factorization"] = "cholesky_float32"
                return
        L, info = torch.linalg.cholesky_ex(G)
        if int(info) == 0:
            self._chol, self._pinv = L, None
            self.info["factorization"] = "cholesky"
        else:  # singular (lam = 0 and rank-deficient rows): minimum-norm solution
            w, U = torch.linalg.eigh(G)
            cut = w.abs().max() * G.shape[0] * torch.finfo(G.dtype).eps
            inv = torch.where(w > cut, 1.0 / w, torch.zeros_like(w))
            self._chol, self._pinv = None, (U * inv) @ U.T
            self.info["factorization"] = "eigh_pinv"
            self.info["rank"] = int((w > cut).sum())

    def _dense_solve(self, V: torch.Tensor) -> torch.Tensor:
        vec = V.dim() == 1
        V2 = (V.unsqueeze(1) if vec else V).to(torch.float64)  # G and its factor are float64 (see _sum_rows)
        if self._chol is None:
            X = self._pinv @ V2
        elif self._chol.dtype == torch.float64:
            X = torch.cholesky_solve(V2, self._chol)
        else:  # float32 factor: solve, then refine the few-column solves once in float64
            X = torch.cholesky_solve(V2.to(self._chol.dtype), self._chol).to(torch.float64)
            if V2.shape[1] <= 8:
                R = V2 - self.G @ X
                X = X + torch.cholesky_solve(R.to(self._chol.dtype), self._chol).to(torch.float64)
        X = X.to(V.dtype)
        return X[:, 0] if vec else X
