"""A set of samples seen through one output function at fixed parameters, streamed in bounded chunks.

`RowSet` is what enters a GGN sum (docs/design.md §4.1): for samples S it yields the Lambda-weighted Jacobian
rows A_i = F_i J_i ([r, p] per sample, F_i^T F_i = Lambda_i, see `curvature`), computes the gradient
sum_i J_i^T g_i and the matrix-free product sum_i J_i^T Lambda_i J_i V, all chunk by chunk so that memory
stays bounded by `chunk` samples. Jacobian chunks are kept in memory only when the whole set fits in
`cache_bytes`; otherwise they are recomputed on each pass.
"""

from __future__ import annotations

from typing import Iterator

import torch

from unlearning.leverage import curvature
from unlearning.leverage.functions import OutputFunction
from unlearning.progress import tick


def auto_chunk(p: int, n_outputs: int, itemsize: int = 8, budget_bytes: int = 192 * 2**20) -> int:
    """Samples per chunk so that a chunk of Jacobians (plus the weighted rows) fits in the budget."""
    return max(1, int(budget_bytes // max(1, 2 * n_outputs * p * itemsize)))


class RowSet:
    def __init__(self, fn: OutputFunction, theta: torch.Tensor, X: torch.Tensor, t: torch.Tensor, loss: str,
                 *, chunk: int | None = None, cache_bytes: int = 512 * 2**20):
        self.fn, self.theta, self.loss = fn, theta, curvature.check_loss(loss)
        self.X, self.t = fn.cast(X), t.to(fn.device)
        self.n, self.p, self.C = self.X.shape[0], fn.p, fn.n_outputs
        itemsize = torch.empty((), dtype=fn.dtype).element_size()
        self.chunk = int(chunk or auto_chunk(self.p, self.C, itemsize))
        self._cache_ok = self.n * self.C * self.p * itemsize <= cache_bytes
        self._cache: list[tuple[slice, torch.Tensor, torch.Tensor]] | None = None  # (slice, f, A)
        self.jacobian_passes = 0  # how often per-sample Jacobians were computed (cost accounting)
        self._tangent_budget = 256 * 2**20
        # progress accounting: called with (rows, kind) after each chunk of a pass ("jacobian" | "product")
        self.on_rows = None

    def advance(self, rows: int, kind: str = "product") -> None:
        """A chunk of `rows` is done: count it (the diagnostics' progress) and keep the 10 s lines coming."""
        if self.on_rows is not None:
            self.on_rows(rows, kind)
        tick()

    def __len__(self) -> int:
        return self.n

    def slices(self, m: int | None = None) -> Iterator[slice]:
        """Row chunks; with m tangent columns they are cut further so that m per-sample activation
        tangents ([m, b, activation size]) stay within the chunk memory budget."""
        chunk = self.chunk
        if m:
            itemsize = torch.empty((), dtype=self.fn.dtype).element_size()
            chunk = min(chunk, max(1, int(self._tangent_budget // (4 * m * self.fn.activation_size() * itemsize))))
        for a in range(0, self.n, chunk):
            yield slice(a, min(a + chunk, self.n))

    @torch.no_grad()
    def outputs(self) -> torch.Tensor:
        """f(theta, X) [n, C]."""
        if self.n == 0:
            return torch.empty(0, self.C, dtype=self.fn.dtype, device=self.fn.device)
        return torch.cat([self.fn.outputs(self.theta, self.X[s]) for s in self.slices()])

    def weighted_chunks(self) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        """Yields (slice, outputs [b, C], A [b, r, p]) with A_i = F_i J_i (Lambda_i = F_i^T F_i)."""
        if self._cache is not None:
            yield from self._cache
            return
        keep = [] if self._cache_ok else None
        self.jacobian_passes += 1
        for s in self.slices():
            X = self.X[s]
            with torch.no_grad():
                f = self.fn.outputs(self.theta, X)
            A = self.fn.weighted_jacobians(self.theta, X, curvature.curvature_factor(f, self.loss)).detach()
            if keep is not None:
                keep.append((s, f, A))
            self.advance(s.stop - s.start, "jacobian")
            yield s, f, A
        if keep is not None:
            self._cache = keep

    def all_weighted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole set at once: outputs [n, C], A [n, r, p] (use for small sets only)."""
        parts = list(self.weighted_chunks())
        if not parts:
            r = self.C - 1 if self.loss == "ce" else self.C
            z = torch.empty(0, r, self.p, dtype=self.fn.dtype, device=self.fn.device)
            return torch.empty(0, self.C, dtype=z.dtype, device=z.device), z
        return torch.cat([f for _, f, _ in parts]), torch.cat([A for _, _, A in parts])

    def residuals(self) -> torch.Tensor:
        """g = dloss/df [n, C] at theta."""
        return curvature.residual(self.outputs(), self.t, self.loss)

    def vjp_sum(self, U: torch.Tensor) -> torch.Tensor:
        """sum_i J_i^T u_i for U [n, C] -> [p]."""
        total = torch.zeros(self.p, dtype=self.fn.dtype, device=self.fn.device)
        for s in self.slices():
            total += self.fn.vjp(self.theta, self.X[s], U[s].unsqueeze(0))[0].detach()
            self.advance(s.stop - s.start)
        return total

    def gradient(self) -> torch.Tensor:
        """sum_i J_i^T g_i = grad of sum_i loss_i at theta [p] (reverse mode, no Jacobians)."""
        return self.vjp_sum(self.residuals())

    def loss_sum(self) -> float:
        with torch.no_grad():
            return float(sum(curvature.loss_values(self.fn.outputs(self.theta, self.X[s]), self.t[s], self.loss).sum()
                             for s in self.slices()))

    def ggn_matvec(self, V: torch.Tensor) -> torch.Tensor:
        """sum_i J_i^T Lambda_i J_i V for V [p, m] -> [p, m], matrix-free (one jvp + one vjp per chunk)."""
        out = torch.zeros_like(V)
        for s in self.slices(V.shape[1]):
            X = self.X[s]
            with torch.no_grad():
                f = self.fn.outputs(self.theta, X)
            JV = self.fn.jvp(self.theta, X, V).detach()                 # [m, b, C]
            LJV = curvature.apply_curvature(f, JV, self.loss)           # [m, b, C]
            out += self.fn.vjp(self.theta, X, LJV).detach().T           # [p, m]
            tick()
        return out

    def jvp(self, V: torch.Tensor) -> torch.Tensor:
        """J V for every sample: V [p, m] -> [m, n, C]."""
        if self.n == 0:
            return torch.empty(V.shape[1], 0, self.C, dtype=V.dtype, device=V.device)
        parts = []
        for s in self.slices(V.shape[1]):
            parts.append(self.fn.jvp(self.theta, self.X[s], V).detach())
            self.advance(s.stop - s.start)
        return torch.cat(parts, 1)

    def subset(self, idx: torch.Tensor) -> "RowSet":
        """The rows `idx` (positions) as a RowSet of the same function, parameters, loss and chunk size."""
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.X.device)
        return RowSet(self.fn, self.theta, self.X[idx], self.t[idx], self.loss, chunk=self.chunk)
