"""Shared types of the unlearner engine (docs/design.md §4.3).

A method takes an `UnlearnContext` (the original ensemble, the forget and retain data, the training
recipe) and returns an `UnlearnResult` (a NEW ensemble plus its compute cost). Methods work member-wise
on ensembles, so one call unlearns the production model (N = 1) or N shadow originals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from unlearning.models import Ensemble, TrainRecipe


@dataclass
class UnlearnContext:
    """Inputs of every unlearner. Tensors are on the model's device.

    X_forget [nF, d], y_forget [nF]; X_retain [nR, d], y_retain [nR]; adjacent_mask [nR] (bool) marks the
    retain rows entangled with the forget set (docs/design.md §4.4). `model` is never mutated."""

    model: Ensemble
    X_forget: torch.Tensor
    y_forget: torch.Tensor
    X_retain: torch.Tensor
    y_retain: torch.Tensor
    adjacent_mask: torch.Tensor
    recipe: TrainRecipe
    seed: int = 0
    loss: str = "ce"  # "ce" (classification) or "mse" (squared loss, e.g. ridge regression tests)
    # Progress of the method's loop (unlearning/progress.py): False (default), True, a label for the bar, or
    # None = the process default (base.progress; what the deletion flow's contexts use).
    progress: bool | str | None = False
    # The forget rows' sample ids, for methods that find rows by id (`sisa`: which shard and slice held them);
    # None where the caller has only the tensors.
    forget_ids: list[str] | None = None

    @property
    def label_smoothing(self) -> float:
        """The recipe's label smoothing: the training loss is CE with it (terms on true labels use it)."""
        return float(getattr(self.recipe, "label_smoothing", 0.0) or 0.0)

    @property
    def X_adjacent(self) -> torch.Tensor:
        return self.X_retain[self.adjacent_mask]

    @property
    def y_adjacent(self) -> torch.Tensor:
        return self.y_retain[self.adjacent_mask]

    @property
    def X_remote(self) -> torch.Tensor:
        return self.X_retain[~self.adjacent_mask]

    @property
    def y_remote(self) -> torch.Tensor:
        return self.y_retain[~self.adjacent_mask]


@dataclass
class MethodCost:
    """What a method spent: per-sample gradient evaluations summed over members, optimizer steps, seconds."""

    gradient_evals: int = 0
    steps: int = 0
    seconds: float = 0.0


@dataclass
class UnlearnResult:
    model: Ensemble
    cost: MethodCost
    info: dict[str, Any] = field(default_factory=dict)


def method_progress(ctx: UnlearnContext, label: str, total: int, unit: str = "steps"):
    """The progress bar of a method's loop: "finetune x32: 120/300 steps (40%), ..." (x = members), or
    `ctx.progress` as the label when it is one; off unless ctx.progress (or the process default) says on.
    Multi-phase methods name the running phase as the bar's stage ("scrub x32 [min2]: ...")."""
    from unlearning.progress import Progress

    p = ctx.progress
    desc = p if isinstance(p, str) else f"{label} x{ctx.model.n_models}"
    return Progress(total, desc, unit=unit, enabled=None if p is None else bool(p))
