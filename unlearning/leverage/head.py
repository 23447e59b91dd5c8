"""Last-layer leverage: the GGN of the model's head over its penultimate features (docs/design.md §4.1).

The head is the final nn.Linear (`train.model.feature_layer`, whose INPUT is the penultimate feature h):
f(x) = W h(x) + b. With the body frozen at theta_D, f is linear in the head parameters, so every
diagnostic has closed forms in head space (p_h = C (d + 1) for d features and C outputs):

- parameters (this module's own order): Wb [C, d+1] = [W | b] row by row, flattened (class-major);
- per-sample Jacobian J_i = I_C kron h~_i with h~_i = [h_i, 1] ([C, p_h]);
- weighted rows A_i = F_i J_i: A_i[a, c*(d+1) + j] = F_i[a, c] h~_i[j];
- GGN G = lam I + sum_i Lambda_i kron h~_i h~_i^T: its (c, e) block [d+1, d+1] is H~^T diag(Lambda[:, c, e]) H~,
  formed in C (C + 1) / 2 products of cost n (d+1)^2 instead of n r p_h^2 for a dense sum of A^T A.

Past a parameter count (`diagnostics.last_layer_above`), or where the full-GGN cost would exceed the budget
(`cost.choose_within_budget`), `solver: auto` uses this mode; `check.subsample_check` measures its agreement
with the full GGN on a row subsample.
"""

from __future__ import annotations

import time
from typing import Iterator
import torch
from torch import nn

from unlearning.leverage import curvature
from unlearning.leverage.functions import OutputFunction, StackedMemberFunction
from unlearning.leverage.base import GGNSolver, _DenseMixin
from unlearning.progress import tick


class HeadFunction(OutputFunction):
    """f(theta [C k], X) = z W^T + offset for the head W [C, k] over a design z of width k (inputs: features).

    Plain (basis None): z = h~ = [h, 1] (k = d + 1), W = [weight | bias], offset 0, inputs X = h [b, d].
    Reduced (basis U [d+1, k], orthonormal columns): the head moves only within the span of U, W = Wb U, and
    the rest of the head stays at theta_D: inputs X = [z, offset], shape [b, k + C], with z = h~ U and
    offset = h~ (I - U U^T) Wb^T (`HeadOf.features` computes them), so f is still the model's output."""

    vectorized = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, *, layer: str = "head",
                 basis: torch.Tensor | None = None):
        C, d = weight.shape
        self.layer, self.d, self.n_outputs = layer, int(d), int(C)
        self.dtype, self.device = weight.dtype, weight.device
        self.Wb = torch.cat([weight, bias.reshape(C, 1)], 1).detach().clone()           # [C, d+1]
        self.basis = basis
        self.k = self.d + 1 if basis is None else int(basis.shape[1])
        self.theta0 = (self.Wb if basis is None else self.Wb @ basis).reshape(-1).clone()
        self.p = self.theta0.numel()

    def _w(self, theta: torch.Tensor) -> torch.Tensor:
        return theta.reshape(self.n_outputs, self.k)  # [C, k]

    @staticmethod
    def augmented(H: torch.Tensor) -> torch.Tensor:
        """h~ = [h, 1]: [b, d] -> [b, d+1]."""
        return torch.cat([H, torch.ones(H.shape[0], 1, dtype=H.dtype, device=H.device)], 1)

    def design(self, X: torch.Tensor) -> torch.Tensor:
        """z [b, k]: the rows the head's parameters multiply."""
        return self.augmented(X) if self.basis is None else X[:, :self.k]

    def inputs(self, H: torch.Tensor) -> torch.Tensor:
        """This function's inputs for penultimate features H [b, d]: H itself, or [z, offset] (reduced)."""
        if self.basis is None:
            return H
        Ht = self.augmented(H)
        z = Ht @ self.basis
        return torch.cat([z, Ht @ self.Wb.T - z @ self._w(self.theta0).T], 1)

    def outputs(self, theta, X):
        f = self.design(X) @ self._w(theta).T  # [b, C]
        return f if self.basis is None else f + X[:, self.k:]

    def jacobians(self, theta, X):
        b, C = X.shape[0], self.n_outputs
        eye = torch.eye(C, dtype=X.dtype, device=X.device)
        return (eye[None, :, :, None] * self.design(X)[:, None, None, :]).reshape(b, C, self.p)

    def weighted_jacobians(self, theta, X, left):
        # left [b, r, C] times I_C kron z_i -> [b, r, C, k] -> [b, r, p_h]
        Z = self.design(X)
        return (left[..., None] * Z[:, None, None, :]).reshape(X.shape[0], left.shape[1], self.p)

    def jvp(self, theta, X, V):
        # V [p_h, m] -> [m, C, k]; J V = z . V_c per class -> [m, b, C]
        Vm = V.T.reshape(V.shape[1], self.n_outputs, self.k)
        return torch.einsum("bj,mcj->mbc", self.design(X), Vm)

    def vjp(self, theta, X, U):
        # U [m, b, C] -> sum_i J_i^T u_i = u_i kron z_i -> [m, p_h]
        return torch.einsum("mbc,bj->mcj", U, self.design(X)).reshape(U.shape[0], self.p)

    def activation_size(self) -> int:
        return self.k + self.n_outputs


class LastLayerSolver(_DenseMixin, GGNSolver):
    """Dense GGN of the head (p_h x p_h, float64) formed from its Kronecker blocks (see the module docstring);
    the RowSets must be over a `HeadFunction`."""

    name = "last_layer"

    def __init__(self, lam: float, work_dtype: torch.dtype = torch.float64):
        super().__init__(lam)
        self.work_dtype = work_dtype
        # float32 rows (production): a float32 Cholesky past 2,048 head parameters (a CNN head of 7,850: ~5 s
        # less on two cores); float64 rows (the reference): float64 throughout
        self.factor_float32_above = 2048 if work_dtype == torch.float32 else None

    def fit(self, plus, minus=()):
        t0 = time.perf_counter()
        ref = (list(plus) + list(minus))[0]
        fn: HeadFunction = ref.fn
        if not isinstance(fn, HeadFunction):
            raise TypeError("LastLayerSolver needs RowSets over a HeadFunction (the head on penultimate features)")
        C, d1 = fn.n_outputs, fn.k
        # sum_i Lambda_i kron h~_i h~_i^T over the pairs c >= e (the (e, c) block is the transpose), P = C (C + 1) / 2
        # blocks [d1, d1]: narrow heads (d1 < 128) as ONE product per row chunk, (Lambda_i[c, e] h~_i)^T [P d1, b]
        # times h~ [b, d1]; wide heads one [d1, b] x [b, d1] product per pair (no [b, P d1] operand to stream).
        # In `work` precision (float32 unless the features are float64 for a reference: `self.work_dtype`),
        # summed over each set's chunks in it and over the sets in float64.
        work = self.work_dtype
        ci, ei = torch.tril_indices(C, C, device=fn.device)                           # pairs c >= e
        P = ci.numel()
        Gp = torch.zeros(P, d1, d1, dtype=torch.float64, device=fn.device)
        wide = d1 >= 128
        step = 4096 if wide else max(1, (64 << 20) // (8 * P * d1))
        for sign, sets in ((1.0, plus), (-1.0, minus)):
            for rs in sets:
                acc = torch.zeros(P, d1, d1, dtype=work, device=fn.device)
                for a in range(0, rs.n, step):
                    s = slice(a, min(a + step, rs.n))
                    Ht = fn.design(rs.X[s]).to(work)                               # [b, d1]
                    with torch.no_grad():
                        lam_i = _curvature_matrices(fn.outputs(rs.theta, rs.X[s]), rs.loss)[:, ci, ei].to(work)
                    if wide:
                        HtT = Ht.T.contiguous()                                       # [d1, b]
                        for k in range(P):
                            acc[k].addmm_(HtT * lam_i[:, k], Ht)
                    else:
                        left = (lam_i[:, :, None] * Ht[:, None, :]).reshape(Ht.shape[0], -1)  # [b, P d1]
                        acc += (left.T @ Ht).reshape(P, d1, d1)
                    if rs._cache is None:  # rows a cache holds were counted when they were computed
                        rs.advance(s.stop - s.start, "jacobian")
                    else:
                        tick()
                Gp.add_(acc.to(torch.float64), alpha=sign)
        G4 = torch.zeros(C, C, d1, d1, dtype=torch.float64, device=fn.device)
        G4[ci, ei] = Gp.reshape(P, d1, d1)
        G4[ei, ci] = Gp.reshape(P, d1, d1).transpose(1, 2)
        G = G4.permute(0, 2, 1, 3).reshape(C * d1, C * d1).contiguous()
        G.diagonal().add_(self.lam)
        self.G = G
        self._factor(G)
        self.info.update(p=C * d1, features=fn.d, design=d1, layer=fn.layer, seconds_fit=time.perf_counter() - t0)
        return self

    def solve(self, V):
        return self._dense_solve(V)

    def cross_norms(self, rs, handle: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
        """(slice, ||A_i G^-1 A_F^T||_F per row [b]) without forming the rows: with the handle H = G^-1 A_F^T
        viewed as H3 [C, d1, m], A_i H = F_i U_i with U_i = (I kron z_i^T) H [C, m], so
        ||A_i H||_F^2 = tr(U_i^T Lambda_i U_i): C d1 m + C^2 m per row instead of r C d1 m (or C^2 d1^2 through
        M = H H^T for a narrow head)."""
        fn: HeadFunction = rs.fn
        C, d1, m = fn.n_outputs, fn.k, handle.shape[1]
        # a narrow head (C d1 < m) contracts M = H H^T [C d1, C d1] instead: T_i[c, e] = z_i^T M[c, :, e, :] z_i,
        # ||A_i H||_F^2 = tr(Lambda_i T_i), C^2 d1^2 per row
        narrow = C * d1 < m
        if narrow:
            M = (handle @ handle.T).reshape(C, d1, C, d1).permute(1, 0, 2, 3).reshape(d1, C * C * d1)
        else:
            H3 = handle.reshape(C, d1, m).permute(1, 0, 2).reshape(d1, C * m)          # [d1, C m]
        width = C * C * d1 if narrow else C * m
        step = max(1, (64 << 20) // (handle.element_size() * width * 2))
        for a in range(0, rs.n, step):
            s = slice(a, min(a + step, rs.n))
            Ht = fn.design(rs.X[s]).to(handle.dtype)                                   # [b, d1]
            with torch.no_grad():
                lam_i = _curvature_matrices(fn.outputs(rs.theta, rs.X[s]).to(handle.dtype), rs.loss)
            if narrow:
                T = ((Ht @ M).reshape(-1, C, C, d1) * Ht[:, None, None, :]).sum(-1)     # [b, C, C]
                sq = (lam_i * T).sum((1, 2)).clamp_min(0)
            else:
                U = (Ht @ H3).reshape(-1, C, m)                                           # [b, C, m]
                sq = (U * torch.bmm(lam_i, U)).sum((1, 2)).clamp_min(0)
            if rs._cache is None:  # as the rows' pass would count (a cache's rows were counted once)
                rs.advance(s.stop - s.start, "jacobian")
            else:
                tick()
            yield s, sq.sqrt()


def _curvature_matrices(f: torch.Tensor, loss: str) -> torch.Tensor:
    """Lambda_i [b, C, C] (softmax Hessian for "ce", identity for "mse")."""
    b, C = f.shape
    if loss == "mse":
        return torch.eye(C, dtype=f.dtype, device=f.device).expand(b, C, C)
    p = torch.softmax(f, 1)
    return torch.diag_embed(p) - p[:, :, None] * p[:, None, :]


class HeadOf:
    """The head of one member of a full-model `StackedMemberFunction`: its `HeadFunction`, the features of
    any rows, and where the head's parameters sit in the full flat vector.

    The head must be an nn.Linear whose output is the model's output (checked on the given probe rows):
    otherwise the last-layer GGN is not the GGN of the model's head, and a clear error says how to fix it."""

    def __init__(self, full: StackedMemberFunction, probe_X: torch.Tensor | None = None):
        self.full = full
        module = full.module
        layer = module.feature_layer
        mod = dict(module._base.named_modules())[layer]
        if not isinstance(mod, nn.Linear) or mod.bias is None:
            raise ValueError(f"diagnostics solver last_layer: train.model.feature_layer = {layer!r} is a "
                             f"{type(mod).__name__}, not an nn.Linear with a bias; set feature_layer to the final "
                             f"Linear, or diagnostics.solver to exact / projected / cg")
        names = [f"{layer}.weight", f"{layer}.bias"]
        if any(n not in full.names for n in names):
            raise ValueError(f"diagnostics solver last_layer: the head {layer!r} is frozen (requires_grad=False), "
                             f"so a retrain does not move it; use diagnostics.solver exact / projected / cg")
        P = full.unflatten(full.theta0)  # the head in float64: p_h = C (d + 1) is small
        W, b = P[names[0]].to(torch.float64), P[names[1]].to(torch.float64)
        self.fn = HeadFunction(W, b, layer=layer)
        self.layer = layer
        if probe_X is not None and probe_X.shape[0]:
            X = full.cast(probe_X[:8])
            with torch.no_grad():
                want = full.outputs(full.theta0, X)
                got = self.fn.outputs(self.fn.theta0, self.features(X))
            if got.shape != want.shape or not torch.allclose(got.to(want.dtype), want, rtol=1e-4,
                                                             atol=1e-4 * float(want.abs().max().clamp_min(1))):
                raise ValueError(f"diagnostics solver last_layer: the output of feature_layer {layer!r} is not the "
                                 f"model's output (some layer follows it), so its GGN is not the head's; set "
                                 f"train.model.feature_layer to the final Linear, or diagnostics.solver to a "
                                 f"full-model solver")

    @torch.no_grad()
    def reduce(self, H: torch.Tensor, rank: int | None) -> None:
        """Let the head move only within the top `rank` eigenvectors of the second moment of h~ = [h, 1] over the
        feature rows H [n, d] (the feature directions the head's GGN weighs most, its Kronecker factor):
        p_h = C rank instead of C (d + 1). Nothing changes when rank is None or at least d + 1."""
        if rank is None or rank >= self.fn.d + 1 or H.shape[0] == 0:
            return
        Ht = HeadFunction.augmented(H)
        _, U = torch.linalg.eigh(Ht.T @ Ht)                                         # ascending
        basis = U[:, -rank:].flip(1).contiguous()                                   # [d+1, rank]
        fn = self.fn
        self.fn = HeadFunction(fn.Wb[:, :-1], fn.Wb[:, -1], layer=fn.layer, basis=basis)

    @torch.no_grad()
    def raw_features(self, X: torch.Tensor, chunk: int = 4096, on_rows=None) -> torch.Tensor:
        """Penultimate features h [n, d] (float64), computed in the full function's dtype; `on_rows(b)` after
        each chunk of b rows (progress)."""
        X = self.full.cast(X)
        if X.shape[0] == 0:
            return torch.zeros(0, self.fn.d, dtype=torch.float64, device=self.full.device)
        parts = []
        for a in range(0, X.shape[0], chunk):
            parts.append(self.full.module.features(X[a:a + chunk])[0].to(torch.float64))
            if on_rows is not None:
                on_rows(min(chunk, X.shape[0] - a))
            tick()
        return torch.cat(parts)

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """The head function's inputs for rows X: features h, or [z, offset] for a reduced head."""
        return self.fn.inputs(self.raw_features(X))


def weighted_rows(fn: OutputFunction, theta: torch.Tensor, X: torch.Tensor, loss: str) -> torch.Tensor:
    """A = F J for a few rows, all at once: [n, r, p] (the check's explicit rows)."""
    with torch.no_grad():
        f = fn.outputs(theta, X)
    return fn.weighted_jacobians(theta, X, curvature.curvature_factor(f, loss)).detach()
