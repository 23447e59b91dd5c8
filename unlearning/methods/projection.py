"""Projection of the engine update direction (docs/design.md §4.3): none; off the span of protected gradients;
W2-regularized (al_wpgd stage 2).

All projections work PER MEMBER: member k's direction is projected off the span of member k's
protected gradients with member k's own k x k Gram solve, so members never interact.
"""

from __future__ import annotations

from typing import Callable

import torch

from unlearning.methods.base import UnlearnContext
from unlearning.methods.losses import clip_loss, per_sample_loss
from unlearning.methods.memberwise import Vec, flatten, member_generators, unflatten
from unlearning.methods.sampling import PoolStream
from unlearning.models import Ensemble


def project_off_span(direction: torch.Tensor, protected: torch.Tensor) -> torch.Tensor:
    """d - V^T (V V^T)^+ V d per member, in float64.

    direction [N, p], protected [N, k, p] (k protected gradients per member) -> [N, p] (float64). The
    k x k Gram matrix G = V V^T is solved with a Hermitian pseudo-inverse, so a zero or repeated
    protected gradient (e.g. an empty remote set) removes nothing instead of dividing by zero."""
    d = direction.double()
    v = protected.double()
    gram = v @ v.transpose(1, 2)  # [N, k, k]
    rhs = (v @ d.unsqueeze(2))  # [N, k, 1]
    coef = torch.linalg.pinv(gram, hermitian=True) @ rhs  # [N, k, 1]
    return d - (v.transpose(1, 2) @ coef).squeeze(2)


def w2_squared(losses: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Squared 2-Wasserstein distance between two empirical distributions of equal size, per member:
    the mean squared difference of the sorted values (the optimal coupling of 1-D samples is the
    monotone one). losses [N, n], reference [N, n] -> [N]; differentiable in `losses`."""
    if losses.shape != reference.shape:
        raise ValueError(f"W2 needs equal sample counts, got {tuple(losses.shape)} and {tuple(reference.shape)}")
    return (losses.sort(1).values - reference.sort(1).values).pow(2).mean(1)


ProtectedLosses = Callable[[Ensemble], tuple[list[torch.Tensor], int]]


class Projection:
    """No projection."""

    name = "none"

    def start(self, model: Ensemble, ctx: UnlearnContext) -> int:
        """Called at the phase start with the phase's starting model; returns evaluations spent."""
        return 0

    def evals_per_step(self) -> int:
        """Per-member per-sample gradient evaluations one `project` call spends."""
        return 0

    def project(self, model: Ensemble, direction: Vec) -> Vec:
        return direction


class SpanProjection(Projection):
    """Remove from the direction its component in span{grad l_1, ..., grad l_k} (member-wise).

    `protected(model)` returns k per-member losses ([N] each, differentiable) and the per-member
    per-sample gradient evaluations it used; the direction then changes none of them to first order."""

    name = "span"

    def __init__(self, protected: ProtectedLosses, evals_per_step: int):
        self.protected, self._evals = protected, evals_per_step

    def evals_per_step(self) -> int:
        return self._evals

    def protected_gradients(self, model: Ensemble) -> torch.Tensor:
        """[N, k, p]: the flattened gradients of the k protected losses, per member."""
        params = list(model.parameters())
        losses, _ = self.protected(model)
        grads = []
        for i, loss in enumerate(losses):
            g = torch.autograd.grad(loss.sum(), params, retain_graph=i < len(losses) - 1, allow_unused=True)
            grads.append(flatten([torch.zeros_like(p) if gi is None else gi for gi, p in zip(g, params)]))
        return torch.stack(grads, 1)

    def project(self, model: Ensemble, direction: Vec) -> Vec:
        v = self.protected_gradients(model)
        return unflatten(project_off_span(flatten(direction), v), direction)


class W2Projection(SpanProjection):
    """al_wpgd stage 2 (docs/design.md §4.3): project off span{grad[(1-a) L_F + a W2^2], grad L_rem}.

    L_F is the mean clipped CE (cap `cap`) on the whole forget set; W2^2 compares the per-sample forget
    losses now with those at the phase start (the stage-1 result), so the step keeps both the mean
    forget loss and the shape of its distribution; L_rem is the mean loss on a remote-retain minibatch
    (`remote_batch_size` rows per member, None = all). A 2 x 2 Gram solve per member, float64."""

    name = "w2"

    def __init__(self, alpha: float = 0.5, cap: float | None = 10.0, remote_batch_size: int | None = 128):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"w2 projection needs 0 <= alpha <= 1, got {alpha}")
        self.alpha, self.cap, self.remote_batch_size = alpha, cap, remote_batch_size
        self.reference: torch.Tensor | None = None  # [N, nF] per-sample forget losses at the phase start
        self.ctx: UnlearnContext | None = None
        self.remote: PoolStream | None = None
        super().__init__(self._losses, 0)

    def _forget_losses(self, model: Ensemble) -> torch.Tensor:
        ctx = self.ctx
        return clip_loss(per_sample_loss(model(ctx.X_forget), ctx.y_forget.expand(model.n_models, -1), ctx.loss,
                                         ctx.label_smoothing), self.cap)  # [N, nF]

    def start(self, model: Ensemble, ctx: UnlearnContext) -> int:
        self.ctx = ctx
        with torch.no_grad():
            self.reference = self._forget_losses(model).detach()
        remote_rows = torch.nonzero(~ctx.adjacent_mask.bool()).flatten()
        gens = member_generators(ctx.seed, model.seeds, "w2_remote")
        self.remote = PoolStream(remote_rows, self.remote_batch_size, gens)
        n_rem = 0 if len(remote_rows) == 0 else min(len(remote_rows), self.remote.batch_size)
        self._evals = ctx.X_forget.shape[0] + n_rem
        return 0  # a forward pass only

    def _losses(self, model: Ensemble) -> tuple[list[torch.Tensor], int]:
        ctx = self.ctx
        lf = self._forget_losses(model)  # [N, nF]
        first = (1 - self.alpha) * lf.mean(1) + self.alpha * w2_squared(lf, self.reference)
        if len(self.remote) == 0:
            return [first], self._evals
        idx = self.remote.next()  # [N, b]
        rem = per_sample_loss(model(ctx.X_retain[idx]), ctx.y_retain[idx], ctx.loss, ctx.label_smoothing).mean(1)
        return [first, rem], self._evals
