"""The per-sample loss every trainer of members shares (training.py's loops and fused_mlp.py's fused step):
a module of its own so both import it and neither imports the other back."""

from __future__ import annotations

import torch


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-sample cross-entropy, logits [..., C], integer y [...] -> [...]: logsumexp(z) - z_y, or with
    label smoothing eps, logsumexp(z) - (1 - eps) z_y - eps mean_j z_j (F.cross_entropy's definition).

    Same values as F.cross_entropy, about 3x faster for few classes (measured on [100, 64, 10]: 0.6 vs
    1.8 ms forward + backward), where log_softmax's kernel dominates an ensemble step."""
    lse = torch.logsumexp(logits, -1)
    z_y = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    if not label_smoothing:
        return lse - z_y
    return lse - (1.0 - label_smoothing) * z_y - label_smoothing * logits.mean(-1)
