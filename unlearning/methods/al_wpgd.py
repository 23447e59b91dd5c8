"""`al_wpgd`: augmented-Lagrangian ascent, then W2-projected gradient descent on the adjacent set
(docs/design.md §4.3; "Machine Unlearning under Retain-Forget Entanglement").

Stage 1 (Adam) minimizes  -L_F + lam * c + mu/2 * c^2,  c = L_rem(theta) - L_rem(theta_0),
with L_F the clipped CE (cap 10) on forget batches, L_rem the loss on remote-retain batches (c on the
same batch at theta and theta_0), and lam <- max(0, lam + mu * c) after each step (per member). The
constraint is an INEQUALITY, L_rem <= L_rem(theta_0) (an unclamped multiplier went to -4.24, which
rewards a higher remote loss), so this is the Powell-Hestenes-Rockafellar form: the constraint's gradient
weight is max(0, lam + mu * c) and lam never goes below 0.
Stage 2 takes plain SGD steps (momentum 0 by default) on the adjacent-retain gradient and projects them off
span{grad[(1-a) L_F + a W2^2], grad L_rem} with a 2 x 2 float64 Gram solve per member (a = 0.5; W2^2 =
mean squared difference of the sorted per-sample forget losses now vs at the end of stage 1), so it
repairs the adjacent set without undoing the forgetting or moving the remote loss, to first order.
Stage-2 defaults (sweep in bench/al_wpgd_fine.py, Fashion-MNIST fine labels, forget = Shirt):
lr 1e-3, momentum 0, 300 steps, adjacent batch 256, remote batch 1024 for grad L_rem: forget accuracy 0,
remote within 0.01 of the original's on 60,000 rows (seeds 0 and 1), 10,000 and 3,000 rows. The projection is
first order only, so the remote loss drifts with the step size, the momentum and the steps: the former
defaults (lr 1e-2, momentum 0.9, 30 steps, remote batch 128) cut remote accuracy from 0.97 to 0.71 (to ~0 on
3,000 rows); a 128-row grad L_rem is too noisy to protect it (lr 1e-3, 300 steps: remote -0.028 with 128 rows
and an adjacent batch of 64, -0.008 with 1024 and 256); lr 3e-3 held on 60,000 rows but not on 10,000 (remote
-0.07). A setting whose stage 1 wipes out the adjacent set (super-class targets: adjacent accuracy ~0 after
stage 1) needs thousands of steps (bench/entanglement.py).
Adjacent vs remote comes from ctx.adjacent_mask. CE models only."""

from __future__ import annotations

import torch
from pydantic import Field

from unlearning.methods.args import DataSizes, MethodArgs, phase_bound
from unlearning.methods.base import UnlearnContext, UnlearnResult
from unlearning.methods.engine import Phase, StopRule, Term, run_phases
from unlearning.methods.losses import per_sample_loss
from unlearning.methods.optim import OptimizerSpec
from unlearning.methods.projection import W2Projection
from unlearning.methods.registry import register
from unlearning.methods.weighting import Weighting
from unlearning.models.training import frozen_copy


class AlWpgdArgs(MethodArgs):
    stage1_steps: int = Field(100, ge=0, description="stage 1 (augmented-Lagrangian ascent) steps")
    stage1_lr: float = Field(1e-3, gt=0, description="Adam learning rate of stage 1")
    mu: float = Field(10.0, gt=0, description="penalty weight; lam += mu * c after each step")
    lam0: float = Field(0.0, ge=0, description="initial multiplier (>= 0: inequality constraint)")
    cap: float = Field(10.0, gt=0, description="per-sample forget CE clipped at this value")
    forget_batch_size: int = Field(64, ge=1)
    remote_batch_size: int = Field(64, ge=1, description="remote batch of the constraint c")
    target_forget_acc: float | None = Field(None, ge=0, le=1, description="end stage 1 for a member at this")
    stage2_steps: int = Field(300, ge=0, description="stage 2 (W2-projected descent) steps")
    stage2_lr: float = Field(1e-3, gt=0, description="step size eta of stage 2")
    stage2_momentum: float = Field(0.0, ge=0, lt=1, description="momentum on the adjacent gradient (0 = plain SGD)")
    alpha: float = Field(0.5, ge=0, le=1, description="a in grad[(1-a) L_F + a W2^2]")
    adjacent_batch_size: int = Field(256, ge=1, description="adjacent rows per stage-2 step")
    projection_remote_batch_size: int | None = Field(1024, ge=1,
                                                     description="remote rows for grad L_rem (None=all)")
    max_grad_evals: int | None = Field(None, ge=0, description="per-member budget of per-sample gradient evals")

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        s1 = phase_bound(sizes.n_forget, self.forget_batch_size, max_steps=self.stage1_steps,
                         others=((sizes.n_remote, self.remote_batch_size),))
        rem = 0 if sizes.n_remote == 0 else min(sizes.n_remote, self.projection_remote_batch_size or sizes.n_remote)
        s2 = phase_bound(sizes.n_adjacent, self.adjacent_batch_size, max_steps=self.stage2_steps,
                         per_step=sizes.n_forget + rem)
        bound = s1 + s2
        return bound if self.max_grad_evals is None else min(bound, self.max_grad_evals)


class AugmentedLagrangian(Weighting):
    """Stage-1 weights: w_F = 1 and w_R = lam + mu * c on the constraint term c (the "retain" term, per
    member), so grad(w_R c - L_F) = grad(lam c + mu/2 c^2 - L_F); lam += mu * c after each step."""

    def __init__(self, mu: float, lam0: float, cap: float):
        super().__init__(forget_weight=1.0, retain_weight=0.0, forget_cap=cap)
        self.mu, self.lam0 = mu, lam0
        self.lam: torch.Tensor | None = None  # [N]

    def _lam(self, like: torch.Tensor) -> torch.Tensor:
        if self.lam is None:
            self.lam = torch.full_like(like, self.lam0)
        return self.lam

    def weights(self, terms):
        w_r, w_f = super().weights(terms)
        if "retain" in terms:
            w_r = torch.clamp(self._lam(terms["retain"]) + self.mu * terms["retain"], min=0.0)
        return w_r, w_f

    def after_step(self, terms, active):
        if "retain" in terms:
            lam = self._lam(terms["retain"])
            self.lam = torch.where(active.to(lam.device), torch.clamp(lam + self.mu * terms["retain"], min=0.0), lam)


@register("al_wpgd", AlWpgdArgs, "suppression: augmented-Lagrangian ascent, then W2-projected adjacent descent")
def run(ctx: UnlearnContext, args: AlWpgdArgs) -> UnlearnResult:
    if ctx.loss != "ce":
        raise ValueError(f"al_wpgd needs loss='ce' (clipped CE), got loss={ctx.loss!r}")
    original = frozen_copy(ctx.model)

    def constraint(model, X, y, idx):  # per-sample l_rem(theta) - l_rem(theta_0) on the same rows: [N, b]
        with torch.no_grad():
            base = per_sample_loss(original(X), y, "ce", ctx.label_smoothing)
        return per_sample_loss(model(X), y, "ce", ctx.label_smoothing) - base

    al = AugmentedLagrangian(args.mu, args.lam0, args.cap)
    stage1 = Phase("stage1", forget=Term("forget", args.forget_batch_size),
                   retain=Term("remote", args.remote_batch_size, constraint), primary="forget", weighting=al,
                   optimizer=OptimizerSpec("adam", lr=args.stage1_lr),
                   stop=StopRule(epochs=None, max_steps=args.stage1_steps, target_forget_acc=args.target_forget_acc))
    stage2 = Phase("stage2", retain=Term("adjacent", args.adjacent_batch_size), primary="retain",
                   weighting=Weighting(forget_weight=0.0, retain_weight=1.0),
                   projection=W2Projection(args.alpha, args.cap, args.projection_remote_batch_size),
                   optimizer=OptimizerSpec("sgd", lr=args.stage2_lr), pre_momentum=args.stage2_momentum,
                   stop=StopRule(epochs=None, max_steps=args.stage2_steps))
    result = run_phases(ctx, [stage1, stage2], max_grad_evals=args.max_grad_evals, method="al_wpgd")
    result.info["lambda"] = None if al.lam is None else al.lam.tolist()
    return result
