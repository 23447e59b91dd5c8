"""Per-sample, per-member losses used by the unlearner engine (docs/design.md §4.3).

All functions take member logits [N, b, C] and return per-sample losses [N, b], so a method's
ensemble objective is a sum over members of per-member reductions and members never interact.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from unlearning.models.training import cross_entropy

LOSS_KINDS = ("ce", "mse")


def _check_kind(kind: str) -> None:
    if kind not in LOSS_KINDS:
        raise ValueError(f"loss={kind!r} is not known; allowed: {list(LOSS_KINDS)}")


def mse_targets(y: torch.Tensor, n_outputs: int, dtype: torch.dtype) -> torch.Tensor:
    """Regression targets [..., C]: integer labels become one-hot rows, float targets [...] get a
    trailing output axis (C must then be 1), float targets [..., C] pass through."""
    if not torch.is_floating_point(y):
        return F.one_hot(y, n_outputs).to(dtype)
    if y.dim() >= 1 and y.shape[-1] == n_outputs and n_outputs > 1:
        return y.to(dtype)
    if n_outputs != 1:
        raise ValueError(f"float targets of shape {tuple(y.shape)} need one column per output ({n_outputs})")
    return y.unsqueeze(-1).to(dtype)


def per_sample_loss(logits: torch.Tensor, y: torch.Tensor, kind: str = "ce", label_smoothing: float = 0.0
                    ) -> torch.Tensor:
    """Loss of every member on every sample: logits [N, b, C], y [N, b] (or [N, b, C] floats) -> [N, b].

    "ce": cross-entropy, with the recipe's label smoothing where the term is the training loss (so
    fine-tuning continues the training the model had); "mse": 0.5 * ||z - t||^2 (the 1/2 makes the gradient
    the residual, as in the ridge closed form of docs/design.md §4.1)."""
    _check_kind(kind)
    n, b, c = logits.shape
    if kind == "ce":
        return cross_entropy(logits, y, label_smoothing)
    t = mse_targets(y, c, logits.dtype)
    return 0.5 * (logits - t).pow(2).sum(-1)


def clip_loss(losses: torch.Tensor, cap: float | None) -> torch.Tensor:
    """min(loss, cap) per sample. Above the cap the gradient is zero, so gradient ascent stops pushing a
    sample whose loss is already large (the clipped CE of al_wpgd, docs/design.md §4.3, cap 10)."""
    return losses if cap is None else losses.clamp(max=cap)


def kl_teacher_student(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
                       ) -> torch.Tensor:
    """KL(p_teacher || p_student) per sample, softmax at temperature T, times T^2 (SCRUB's distillation
    loss, Kurmanji et al. 2023 "Towards Unbounded Machine Unlearning"): [N, b, C] x2 -> [N, b]."""
    log_s = F.log_softmax(student_logits / temperature, -1)
    log_t = F.log_softmax(teacher_logits / temperature, -1)
    return (log_t.exp() * (log_t - log_s)).sum(-1) * temperature**2


def correct(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[N, b] bool: argmax equals the label."""
    return logits.argmax(-1) == y
