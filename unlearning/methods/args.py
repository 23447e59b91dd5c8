"""Argument models of the presets: pydantic, extra="forbid", each able to state its stop rule as a
budget (an upper bound of per-member gradient evaluations) before running."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from unlearning.methods.base import UnlearnContext
from unlearning.methods.geometry import DiagFisher, Geometry
from unlearning.methods.optim import OptimizerSpec


@dataclass(frozen=True)
class DataSizes:
    """Row counts a method's budget depends on."""

    n_forget: int
    n_retain: int
    n_adjacent: int
    n_remote: int
    n_outputs: int = 1  # model outputs C (a per-sample Jacobian costs C gradient evaluations)

    @classmethod
    def of(cls, ctx: UnlearnContext) -> "DataSizes":
        n_adj = int(ctx.adjacent_mask.bool().sum())
        return cls(int(ctx.X_forget.shape[0]), int(ctx.X_retain.shape[0]), n_adj, int(ctx.X_retain.shape[0]) - n_adj,
                   int(ctx.model.n_classes))


class MethodArgs(BaseModel):
    """Base of every preset's arguments."""

    model_config = ConfigDict(extra="forbid")

    def budget(self, sizes: DataSizes, recipe_epochs: int | None = None) -> int:
        """Upper bound of the per-member per-sample gradient evaluations the declared stop rule allows
        (the reported cost is at most this times the number of members). `recipe_epochs` is the
        training recipe's epoch count (used by `retrain`)."""
        raise NotImplementedError


class IterativeArgs(MethodArgs):
    """Shared knobs of the gradient-based presets."""

    epochs: int = Field(5, ge=0, description="passes over the primary pool")
    lr: float = Field(1e-3, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    momentum: float = Field(0.0, ge=0, lt=1, description="heavy-ball momentum (sgd only)")
    batch_size: int = Field(64, ge=1)
    max_grad_evals: int | None = Field(None, ge=0, description="per-member budget of per-sample gradient evals")

    def capped(self, bound: int) -> int:
        return bound if self.max_grad_evals is None else min(bound, self.max_grad_evals)

    def optimizer_spec(self, share_key: str | None = None) -> OptimizerSpec:
        return OptimizerSpec(kind=self.optimizer, lr=self.lr, momentum=self.momentum, share_key=share_key)


class AscentArgs(IterativeArgs):
    """Knobs of the presets that ascend the forget loss."""

    loss_cap: float | None = Field(None, gt=0, description="clip per-sample forget loss at this value")
    target_forget_acc: float | None = Field(None, ge=0, le=1, description="stop a member at this forget accuracy")
    geometry: Literal["identity", "diag_fisher"] = "identity"
    fisher_samples: int = Field(256, ge=1, description="retain rows for the diagonal Fisher")
    fisher_damping: float = Field(0.1, gt=0, description="relative to the mean Fisher diagonal")

    def make_geometry(self) -> Geometry:
        if self.geometry == "identity":
            return Geometry()
        return DiagFisher(samples=self.fisher_samples, damping=self.fisher_damping)

    def geometry_bound(self, sizes: DataSizes) -> int:
        return 0 if self.geometry == "identity" else min(self.fisher_samples, sizes.n_retain)


def phase_bound(n_primary: int, bs_primary: int | None, *, epochs: int | None = None, max_steps: int | None = None,
                others: tuple[tuple[int, int | None], ...] = (), per_step: int = 0) -> int:
    """Upper bound of per-member gradient evaluations of one engine phase: the primary pool's rows
    (n_primary per epoch, or max_steps full batches), plus per step a batch of each other term
    (n, batch_size) and `per_step` evaluations of a projection."""
    if n_primary == 0:
        return 0
    bs = n_primary if bs_primary is None else min(bs_primary, n_primary)
    spe = math.ceil(n_primary / bs)
    bounds = []
    if epochs is not None:
        bounds.append((epochs * spe, epochs * n_primary))
    if max_steps is not None:
        bounds.append((max_steps, max_steps * bs))
    if not bounds:
        raise ValueError("a phase bound needs epochs or max_steps")
    steps, rows = min(b[0] for b in bounds), min(b[1] for b in bounds)
    other = sum(0 if n == 0 else (n if b is None else min(b, n)) for n, b in others)
    return rows + steps * (other + per_step)
