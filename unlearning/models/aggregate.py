"""The deployed model of a sharded original (unlearning/sharding.py, docs/sharding.md): the S constituents
aggregated into one model with the one-member `Ensemble` interface (Bourtoule et al., IEEE S&P 2021, §IV-D)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from unlearning.models.ensemble import Ensemble

AGGREGATES = ("mean_probs", "size_weighted", "vote")


class Aggregate(nn.Module):
    """The S constituents as one model: input [B, d] (or [B, *in_shape]) -> [1, B, C], the same shape as a
    one-member `Ensemble`, so code that evaluates or serves one (softmax over the last axis, mean over members)
    works unchanged. Its logits are log-probabilities: `mean_probs`, log of the mean of the constituents'
    softmax; `vote`, log of each class's vote share, the mean softmax breaking ties (shares + 1e-3 x mean,
    renormalised); `size_weighted`, log of the constituents' softmax averaged with weights proportional to
    `weights` [S] (each shard's training rows: a constituent trained on 143 rows does not outvote one trained on
    35,068; the mean of per-shard estimates weighted by sample size). `active` [S] (bool): constituents that
    count (a shard whose every row was forgotten holds no data and is left out)."""

    def __init__(self, constituents: Ensemble, aggregate: str = "mean_probs", active: Sequence[bool] | None = None,
                 weights: Sequence[float] | None = None):
        super().__init__()
        if aggregate not in AGGREGATES:
            raise ValueError(f"train.sharding.aggregate = {aggregate!r} is not known; allowed: {list(AGGREGATES)}")
        self.constituents = constituents
        self.aggregate = aggregate
        mask = torch.ones(constituents.n_models, dtype=torch.bool) if active is None else \
            torch.as_tensor(list(active), dtype=torch.bool)
        if not bool(mask.any()):
            raise ValueError("every shard is empty: the aggregate has no constituent to predict with")
        self.register_buffer("active", mask)
        w = torch.ones(constituents.n_models, dtype=torch.float64) if weights is None else \
            torch.as_tensor(list(weights), dtype=torch.float64)
        if w.shape != mask.shape or bool((w < 0).any()) or not bool((w[mask] > 0).any()):
            raise ValueError(f"aggregate weights {w.tolist()}: one non-negative weight per constituent, some active "
                             f"one above 0")
        self.register_buffer("weights", w)

    # the one-member Ensemble interface the pipeline reads (serving, tracking, evaluation)
    n_models = 1

    @property
    def seeds(self) -> list[int]:
        return list(self.constituents.seeds)

    @property
    def n_classes(self) -> int:
        return self.constituents.n_classes

    @property
    def in_dim(self) -> int:
        return self.constituents.in_dim

    @property
    def in_shape(self) -> list[int]:
        return self.constituents.in_shape

    @property
    def arch(self) -> str:
        return self.constituents.arch

    def spec(self) -> dict:
        return self.constituents.spec()

    def trainable_mask(self) -> list[bool]:
        return self.constituents.trainable_mask()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.constituents(x)[self.active.to(x.device)]  # [S', B, C]
        probs = torch.softmax(logits.double(), -1)  # [S', B, C]
        if self.aggregate == "size_weighted":
            w = self.weights.to(x.device)[self.active.to(x.device)]  # [S']
            mean = torch.einsum("s,sbc->bc", w / w.sum(), probs)
        else:
            mean = probs.mean(0)
        if self.aggregate == "vote":
            votes = nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double().mean(0)
            mean = votes + 1e-3 * mean
            mean = mean / mean.sum(-1, keepdim=True)
        return torch.log(mean.clamp_min(1e-300)).to(logits.dtype).unsqueeze(0)


AGGREGATE_FORMAT = "unlearning-sisa-aggregate/1"


def aggregate_payload(model: Aggregate) -> dict:
    """The aggregate's checkpoint (`save_model` writes it, `load_model` reads it back as an `Aggregate`): the
    constituents' spec, seeds and weights, the rule and the active mask."""
    return {"format": AGGREGATE_FORMAT, "spec": model.spec(), "seeds": model.seeds,
            "state_dict": model.constituents.state_dict(), "aggregate": model.aggregate,
            "active": model.active.tolist(), "weights": model.weights.tolist()}


def aggregate_from(ckpt: dict, constituents: Ensemble) -> Aggregate:
    constituents.load_state_dict(ckpt["state_dict"])
    return Aggregate(constituents.eval(), ckpt["aggregate"], ckpt["active"], ckpt.get("weights")).eval()
