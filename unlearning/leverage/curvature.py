"""Output-space loss pieces of the generalized Gauss-Newton matrix (docs/design.md §4.1).

For a sample with outputs f [C] and target t:
- cross-entropy ("ce"): p = softmax(f), residual g = p - onehot(y) = dloss/df, curvature
  Lambda = diag(p) - p p^T (the Hessian of the loss in f; rank C-1, its null vector is the common
  logit shift that softmax ignores);
- squared loss ("mse", loss 0.5 ||f - t||^2): g = f - t, Lambda = I.

The GGN is G = sum_i J_i^T Lambda_i J_i + lam I = sum_i (F_i J_i)^T (F_i J_i) + lam I with any factor
Lambda_i = F_i^T F_i. We take F_i = diag(sqrt(w)) U^T from the eigendecomposition Lambda = U diag(w) U^T
and drop the zero eigenvalue of the softmax curvature (C-1 rows instead of C: forming G costs ~10% less).
Every quantity reported (traces, Frobenius and spectral norms of leverage blocks, Fisher norms of
output gaps) is the same for any factor, since two factors differ by a partial isometry.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

LOSSES = ("ce", "mse")


def check_loss(loss: str) -> str:
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not supported; allowed: {list(LOSSES)}")
    return loss


def make_targets(y: torch.Tensor, n_outputs: int, loss: str, dtype: torch.dtype, device,
                 label_smoothing: float = 0.0) -> torch.Tensor:
    """Targets in the form the loss needs: class indices [n] (long) for "ce"; real targets [n, C] for
    "mse" (y [n] with C = 1 is a column; integer y with C > 1 becomes one-hot).

    "ce" with label smoothing eps (the recipe's `train.label_smoothing`) gives the smoothed distribution
    [n, C] = (1 - eps) one_hot(y) + eps / C instead: the model minimized that loss, so its gradients
    (residuals p - t) are the ones the Newton step and the predicted gaps need; the curvature (diag(p) - pp^T)
    does not depend on the targets."""
    check_loss(loss)
    y = y.to(device)
    if loss == "ce":
        if y.dim() != 1 or y.is_floating_point():
            raise ValueError(f"loss='ce' needs integer class labels of shape [n], got {tuple(y.shape)} {y.dtype}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_outputs):
            raise ValueError(f"labels must lie in [0, {n_outputs}), got [{int(y.min())}, {int(y.max())}]")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing = {label_smoothing!r} must be in [0, 1)")
        if label_smoothing:
            return (1.0 - label_smoothing) * F.one_hot(y.long(), n_outputs).to(dtype) + label_smoothing / n_outputs
        return y.long()
    if y.dim() == 1 and n_outputs == 1:
        return y.to(dtype).unsqueeze(1)
    if y.dim() == 1 and not y.is_floating_point():
        return F.one_hot(y.long(), n_outputs).to(dtype)
    if y.dim() == 2 and y.shape[1] == n_outputs:
        return y.to(dtype)
    raise ValueError(f"loss='mse' with {n_outputs} outputs needs targets [n, {n_outputs}] (or [n] labels), "
                     f"got {tuple(y.shape)}")


def loss_values(f: torch.Tensor, t: torch.Tensor, loss: str) -> torch.Tensor:
    """Per-sample loss [b] of outputs f [b, C]; "ce" takes class indices [b] or a target distribution [b, C]."""
    if loss == "ce":
        return F.cross_entropy(f, t, reduction="none")
    return 0.5 * ((f - t) ** 2).sum(1)


def residual(f: torch.Tensor, t: torch.Tensor, loss: str) -> torch.Tensor:
    """g = dloss/df [b, C]."""
    if loss == "ce":
        target = t.to(f.dtype) if t.is_floating_point() else F.one_hot(t, f.shape[1]).to(f.dtype)
        return torch.softmax(f, 1) - target
    return f - t


def apply_curvature(f: torch.Tensor, U: torch.Tensor, loss: str) -> torch.Tensor:
    """Lambda_i u_i for outputs f [b, C] and U [..., b, C] (no C x C matrices formed)."""
    if loss == "mse":
        return U
    p = torch.softmax(f, 1)
    return p * U - p * (p * U).sum(-1, keepdim=True)


def curvature_factor(f: torch.Tensor, loss: str) -> torch.Tensor:
    """F [b, r, C] with F_i^T F_i = Lambda_i; r = C - 1 for "ce" (C > 1), r = C for "mse"."""
    b, c = f.shape
    if loss == "mse":
        return torch.eye(c, dtype=f.dtype, device=f.device).expand(b, c, c)
    # In float64, whatever f's dtype: on a confident row (p ~ one-hot, other probabilities down to 1e-45) Lambda
    # is almost zero with repeated eigenvalues, and float32 eigh returned NaN for 171 of 30,000 Fashion-MNIST rows
    # (the NaN then made the check's kernel "not positive-definite"). C x C per row: negligible in float64.
    p = torch.softmax(f.to(torch.float64), 1)
    lam = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)  # [b, C, C]
    w, U = torch.linalg.eigh(lam)  # ascending: w[:, 0] is the (numerically) zero eigenvalue
    w, U = w[:, 1:].clamp_min(0), U[:, :, 1:]
    return (U * w.sqrt().unsqueeze(1)).transpose(1, 2).to(f.dtype)  # [b, C-1, C]


def fisher_norm(f: torch.Tensor, d: torch.Tensor, loss: str) -> torch.Tensor:
    """sqrt(d_i^T Lambda_i d_i) [b] for output changes d [b, C]: invariant to common logit shifts under
    "ce" (for small d it is sqrt(2 KL(p || p + dp)) to first order)."""
    return (d * apply_curvature(f, d, loss)).sum(1).clamp_min(0).sqrt()
