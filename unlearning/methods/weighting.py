"""Weighting of the engine update: w_R * grad L_R - w_F * grad L_F (docs/design.md §4.3).

A weighting turns the per-sample losses of a step ([N, b] per term) into per-member term losses
([N]) with loss clipping and per-sample weights, and gives the member weights w_R, w_F ([N] each).
Subclasses make the weights dynamic (e.g. the augmented Lagrangian of al_wpgd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unlearning.methods.losses import clip_loss


def gather_rows(weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per-sample weights of the rows a step drew: weights [n_rows] (shared) or [N, n_rows] (per member),
    idx [N, b] -> [N, b]."""
    if weights.dim() == 1:
        return weights[idx]
    return torch.gather(weights, 1, idx)


@dataclass
class Weighting:
    """Static weights. `*_cap` clips per-sample losses (min(l, cap)); `*_sample_weights` are weights over
    the rows of the term's source table (X_forget for the forget term, X_retain for the retain term),
    shape [n_rows] or [N, n_rows]; a term's loss is the weighted mean sum(w l) / sum(w) per member."""

    forget_weight: float = 1.0
    retain_weight: float = 1.0
    forget_cap: float | None = None
    retain_cap: float | None = None
    forget_sample_weights: torch.Tensor | None = None
    retain_sample_weights: torch.Tensor | None = None

    def reduce(self, term: str, losses: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """losses [N, b] of `term` ("forget" or "retain") at rows idx [N, b] -> [N]."""
        cap = self.forget_cap if term == "forget" else self.retain_cap
        weights = self.forget_sample_weights if term == "forget" else self.retain_sample_weights
        losses = clip_loss(losses, cap)
        if weights is None:
            return losses.mean(1)
        w = gather_rows(weights.to(losses), idx)
        return (w * losses).sum(1) / w.sum(1).clamp_min(torch.finfo(losses.dtype).tiny)

    def weights(self, terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_R [N], w_F [N]) for this step, given the reduced term losses (detached use only)."""
        n = next(iter(terms.values())).shape[0]
        like = next(iter(terms.values()))
        return (torch.full((n,), self.retain_weight, dtype=like.dtype, device=like.device),
                torch.full((n,), self.forget_weight, dtype=like.dtype, device=like.device))

    def after_step(self, terms: dict[str, torch.Tensor], active: torch.Tensor) -> None:
        """Called after every step with the step's reduced losses (detached) and the active-member mask."""

    def objective(self, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """sum over members of w_R L_R - w_F L_F (a scalar whose gradient is the member-wise direction)."""
        w_r, w_f = self.weights({k: v.detach() for k, v in terms.items()})
        total = torch.zeros((), dtype=w_r.dtype, device=w_r.device)
        if "retain" in terms:
            total = total + (w_r * terms["retain"]).sum()
        if "forget" in terms:
            total = total - (w_f * terms["forget"]).sum()
        return total
