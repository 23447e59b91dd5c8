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
from unlearning.leverage.solvers import GGNSolver, _DenseMixin
from unlearning.progress import tick


class HeadFunction(OutputFunction):
    """f(theta [C*(d+1)], H [b, d]) = H W^T + b for the head Wb [C, d+1] (inputs are penultimate features)."""

    vectorized = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, *, layer: str = "head"):
        C, d = weight.shape
        self.layer, self.d, self.n_outputs = layer, int(d), int(C)
        self.dtype, self.device = weight.dtype, weight.device
        self.theta0 = torch.cat([weight, bias.reshape(C, 1)], 1).reshape(-1).detach().clone()
        self.p = self.theta0.numel()

    def _wb(self, theta: torch.Tensor) -> torch.Tensor:
        return theta.reshape(self.n_outputs, self.d + 1)  # [C, d+1]

    @staticmethod
    def augmented(H: torch.Tensor) -> torch.Tensor:
        """h~ = [h, 1]: [b, d] -> [b, d+1]."""
        return torch.cat([H, torch.ones(H.shape[0], 1, dtype=H.dtype, device=H.device)], 1)

    def outputs(self, theta, X):
        return self.augmented(X) @ self._wb(theta).T  # [b, C]

    def jacobians(self, theta, X):
        b, C = X.shape[0], self.n_outputs
        eye = torch.eye(C, dtype=X.dtype, device=X.device)
        return (eye[None, :, :, None] * self.augmented(X)[:, None, None, :]).reshape(b, C, self.p)

    def weighted_jacobians(self, theta, X, left):
        # left [b, r, C] times I_C kron h~_i -> [b, r, C, d+1] -> [b, r, p_h]
        Ht = self.augmented(X)
        return (left[..., None] * Ht[:, None, None, :]).reshape(X.shape[0], left.shape[1], self.p)

    def jvp(self, theta, X, V):
        # V [p_h, m] -> [m, C, d+1]; J V = h~ . V_c per class -> [m, b, C]
        Vm = V.T.reshape(V.shape[1], self.n_outputs, self.d + 1)
        return torch.einsum("bj,mcj->mbc", self.augmented(X), Vm)

    def vjp(self, theta, X, U):
        # U [m, b, C] -> sum_i J_i^T u_i = u_i kron h~_i -> [m, p_h]
        return torch.einsum("mbc,bj->mcj", U, self.augmented(X)).reshape(U.shape[0], self.p)

    def activation_size(self) -> int:
        return self.d + 1 + self.n_outputs


class LastLayerSolver(_DenseMixin, GGNSolver):
    """Dense GGN of the head (p_h x p_h, float64) formed from its Kronecker blocks (see the module docstring);
    the RowSets must be over a `HeadFunction`."""

    name = "last_layer"

    def fit(self, plus, minus=()):
        t0 = time.perf_counter()
        ref = (list(plus) + list(minus))[0]
        fn: HeadFunction = ref.fn
        if not isinstance(fn, HeadFunction):
            raise TypeError("LastLayerSolver needs RowSets over a HeadFunction (the head on penultimate features)")
        C, d1 = fn.n_outputs, fn.d + 1
        # sum_i Lambda_i kron h~_i h~_i^T as ONE product per row chunk: (Lambda_i kron h~_i)^T [C C d1, b] times
        # h~ [b, d1] -> [C, C, d1, d1] (c, e, j, k); rows per chunk keep the [b, C C d1] operand near 64 MB
        G4 = torch.zeros(C * C * d1, d1, dtype=torch.float64, device=fn.device)
        step = max(1, (64 << 20) // (8 * C * C * d1))
        for sign, sets in ((1.0, plus), (-1.0, minus)):
            for rs in sets:
                for a in range(0, rs.n, step):
                    s = slice(a, min(a + step, rs.n))
                    Ht = fn.augmented(rs.X[s]).to(torch.float64)                      # [b, d1]
                    with torch.no_grad():
                        lam_i = _curvature_matrices(fn.outputs(rs.theta, rs.X[s]).to(torch.float64), rs.loss)
                    left = (lam_i[:, :, :, None] * Ht[:, None, None, :]).reshape(Ht.shape[0], -1)  # [b, C C d1]
                    G4.addmm_(left.T, Ht, alpha=sign)
                    if rs._cache is None:  # rows a cache holds were counted when they were computed
                        rs.advance(s.stop - s.start, "jacobian")
                    else:
                        tick()
        G = G4.reshape(C, C, d1, d1).permute(0, 2, 1, 3).reshape(C * d1, C * d1).contiguous()
        G.diagonal().add_(self.lam)
        self.G = G
        self._factor(G)
        self.info.update(p=C * d1, features=fn.d, layer=fn.layer, seconds_fit=time.perf_counter() - t0)
        return self

    def solve(self, V):
        return self._dense_solve(V)

    def cross_norms(self, rs, handle: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
        """(slice, ||A_i G^-1 A_F^T||_F per row [b]) without forming the rows, when that is cheaper: with
        M = handle handle^T [p_h, p_h] viewed as M4 [C, d1, C, d1], ||A_i H||_F^2 = tr(Lambda_i T_i) with
        T_i[c, e] = h~_i^T M4[c, :, e, :] h~_i: C^2 d1^2 per row instead of r C d1 |F| r (rows times handle)."""
        fn: HeadFunction = rs.fn
        C, d1, m = fn.n_outputs, fn.d + 1, handle.shape[1]
        r = C - 1 if rs.loss == "ce" else C
        if C * d1 >= r * m:  # the rows-times-handle product is cheaper
            for sl, C_b in self.cross_chunks(rs, handle):
                yield sl, C_b.reshape(sl.stop - sl.start, -1).norm(dim=1)
            return
        H64 = handle.to(torch.float64)
        M4 = (H64 @ H64.T).reshape(C, d1, C, d1).permute(1, 0, 2, 3).reshape(d1, C * C * d1)  # [j, (c, e, k)]
        step = max(1, (64 << 20) // (8 * C * C * d1))
        for a in range(0, rs.n, step):
            s = slice(a, min(a + step, rs.n))
            Ht = fn.augmented(rs.X[s]).to(torch.float64)                                  # [b, d1]
            with torch.no_grad():
                lam_i = _curvature_matrices(fn.outputs(rs.theta, rs.X[s]).to(torch.float64), rs.loss)
            T = ((Ht @ M4).reshape(-1, C, C, d1) * Ht[:, None, None, :]).sum(-1)          # [b, C, C]
            sq = (lam_i * T).sum((1, 2)).clamp_min(0)
            if rs._cache is None:  # as the rows' pass would count (a cache's rows were counted once)
                rs.advance(s.stop - s.start, "jacobian")
            else:
                tick()
            yield s, sq.sqrt().to(handle.dtype)


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
        self.fn = HeadFunction(P[names[0]].to(torch.float64), P[names[1]].to(torch.float64), layer=layer)
        self.layer = layer
        if probe_X is not None and probe_X.shape[0]:
            X = full.cast(probe_X[:8])
            with torch.no_grad():
                want = full.outputs(full.theta0, X)
                got = self.fn.outputs(self.fn.theta0, self.features(X))
            if not torch.allclose(got.to(want.dtype), want, rtol=1e-4,
                                  atol=1e-4 * float(want.abs().max().clamp_min(1))):
                raise ValueError(f"diagnostics solver last_layer: the output of feature_layer {layer!r} is not the "
                                 f"model's output (some layer follows it), so its GGN is not the head's; set "
                                 f"train.model.feature_layer to the final Linear, or diagnostics.solver to a "
                                 f"full-model solver")

    @torch.no_grad()
    def features(self, X: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        """Penultimate features [n, d] (float64, the head's dtype), computed in the full function's dtype."""
        X = self.full.cast(X)
        if X.shape[0] == 0:
            return torch.zeros(0, self.fn.d, dtype=self.fn.dtype, device=self.full.device)
        parts = []
        for a in range(0, X.shape[0], chunk):
            parts.append(self.full.module.features(X[a:a + chunk])[0].to(self.fn.dtype))
            tick()
        return torch.cat(parts)


def weighted_rows(fn: OutputFunction, theta: torch.Tensor, X: torch.Tensor, loss: str) -> torch.Tensor:
    """A = F J for a few rows, all at once: [n, r, p] (the check's explicit rows)."""
    with torch.no_grad():
        f = fn.outputs(theta, X)
    return fn.weighted_jacobians(theta, X, curvature.curvature_factor(f, loss)).detach()
