"""Geometry P of the engine update theta <- theta - eta * P^-1 * Proj(...) (docs/design.md §4.3).

A geometry is prepared once per phase at the phase's starting point and then applied to every update
direction, member-wise. `identity` is plain (stochastic) gradient geometry; `diag_fisher` is the
diagonal of the empirical Fisher of the retain loss, a cheap stand-in for H_R (§4.1: the step lands on
the oracle when P = H_R). The GGN/Newton geometry comes from `unlearning.methods.newton_ggn`, which may
add itself to `GEOMETRIES` with `register_geometry`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.func import functional_call, grad

from unlearning.methods.base import UnlearnContext
from unlearning.methods.losses import per_sample_loss
from unlearning.methods.memberwise import Vec, flatten, member_generators, member_view
from unlearning.models import Ensemble, vmap_or_loop


class Geometry:
    """Identity geometry: P = I."""

    name = "identity"

    def prepare(self, model: Ensemble, ctx: UnlearnContext, max_evals: int | None) -> int:
        """Build P at the model's current parameters. Returns the per-member per-sample gradient
        evaluations spent (at most `max_evals` when given)."""
        return 0

    def apply(self, direction: Vec) -> Vec:
        """P^-1 direction, member-wise."""
        return direction


class DiagFisher(Geometry):
    """P = diag(F) + damping * mean(diag F), per member, with F the empirical Fisher of the retain
    loss, F = (1/m) sum_i g_i g_i^T (g_i the per-sample gradient), estimated on at most `samples`
    retain rows drawn per member. The damping is relative to the member's mean diagonal, so it does
    not depend on the loss scale."""

    name = "diag_fisher"

    def __init__(self, samples: int = 256, damping: float = 0.1, chunk: int = 64):
        if samples < 1 or damping <= 0:
            raise ValueError(f"diag_fisher needs samples >= 1 and damping > 0, got {samples}, {damping}")
        self.samples, self.damping, self.chunk = samples, damping, chunk
        self.diag: Vec | None = None

    def prepare(self, model: Ensemble, ctx: UnlearnContext, max_evals: int | None) -> int:
        n_rows = ctx.X_retain.shape[0]
        m = min(self.samples, n_rows, max_evals if max_evals is not None else n_rows)
        if m <= 0:
            raise ValueError("diag_fisher geometry needs at least one retain row within the budget")
        gens = member_generators(ctx.seed, model.seeds, "diag_fisher")
        idx = torch.stack([torch.randperm(n_rows, generator=g)[:m] for g in gens]).to(ctx.X_retain.device)
        self.diag = per_sample_grad_sq_mean(model, ctx.X_retain[idx], ctx.y_retain[idx], ctx.loss, self.chunk)
        return m

    def apply(self, direction: Vec) -> Vec:
        if self.diag is None:
            raise RuntimeError("DiagFisher.apply called before prepare")
        mean = flatten(self.diag).mean(1)  # [N]: the member's mean Fisher diagonal over all parameters
        return [d / (f + member_view(self.damping * mean, f)) for d, f in zip(direction, self.diag)]


def per_sample_grad_sq_mean(model: Ensemble, X: torch.Tensor, y: torch.Tensor, loss: str, chunk: int = 64
                            ) -> Vec:
    """(1/m) sum_i g_i^2 elementwise, per member: X [N, m, d] (member k's rows), y [N, m] -> tensors
    shaped like the parameters. Per-sample gradients come from torch.func.vmap over the sample axis;
    the summed member losses make each member's gradient its own. They are taken in eval mode: in train
    mode a one-sample batch has no BatchNorm statistics (and the running-stat update is an in-place write
    the transform rejects), and dropout would draw random masks inside vmap."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    was_training = model.training
    model.eval()
    try:
        return _per_sample_grad_sq_mean(model, params, X, y, loss, chunk)
    finally:
        model.train(was_training)


def _per_sample_grad_sq_mean(model: Ensemble, params: dict, X: torch.Tensor, y: torch.Tensor, loss: str,
                             chunk: int) -> Vec:
    def loss_one(p, x, t):  # x [N, d], t [N]: one sample per member
        logits = functional_call(model, p, (x.unsqueeze(1),))  # [N, 1, C]
        return per_sample_loss(logits, t.unsqueeze(1), loss).sum()

    per_sample = vmap_or_loop(grad(loss_one), (None, 1, 1), model.vectorized)
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    m = X.shape[1]
    for i in range(0, m, chunk):
        g = per_sample(params, X[:, i : i + chunk], y[:, i : i + chunk])  # each [c, N, ...]
        for k in total:
            total[k] += g[k].pow(2).sum(0)
    return [total[k] / m for k, _ in model.named_parameters()]


GEOMETRIES: dict[str, Callable[..., Geometry]] = {"identity": Geometry, "diag_fisher": DiagFisher}


def register_geometry(name: str, factory: Callable[..., Geometry]) -> None:
    """Add a geometry (e.g. "ggn" from newton_ggn) so presets can name it."""
    if name in GEOMETRIES and GEOMETRIES[name] is not factory:
        raise ValueError(f"geometry {name!r} is registered twice")
    GEOMETRIES[name] = factory


def make_geometry(name: str, **kwargs) -> Geometry:
    if name not in GEOMETRIES:
        raise ValueError(f"geometry={name!r} is not known; allowed: {sorted(GEOMETRIES)}")
    return GEOMETRIES[name](**kwargs)
