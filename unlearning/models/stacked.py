"""Grouped-layer ensembles: N independent models evaluated in one pass.

Every parameter carries a leading model dimension N, so an ensemble of N models is one module and a
single model is the case N = 1. Members never mix: the loss of an ensemble is the sum of the members'
losses, so each member's gradient (and each elementwise optimizer state, e.g. Adam's) is its own.
Member k is initialised from its own seed, so member k of an ensemble equals a lone model with that
seed, whatever N is.
"""

from __future__ import annotations

import copy
import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def _uniform_(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float64).mul(2 * bound).sub(bound).to(t.dtype))


class StackedLinear(nn.Module):
    """N linear maps: x [N, B, in] -> [N, B, out]. weight [N, in, out], bias [N, 1, out]."""

    def __init__(self, n_models: int, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(n_models, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(n_models, 1, out_features))

    def init_member(self, k: int, gen: torch.Generator) -> None:
        # Same distribution as torch.nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        bound = 1.0 / math.sqrt(self.in_features)
        _uniform_(self.weight[k], bound, gen)
        _uniform_(self.bias[k], bound, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class StackedConv2d(nn.Module):
    """N convolutions as one grouped conv: x [N, B, Cin, H, W] -> [N, B, Cout, H', W']."""

    def __init__(self, n_models: int, in_channels: int, out_channels: int, kernel_size: int, padding: int = 1):
        super().__init__()
        self.in_channels, self.out_channels, self.padding = in_channels, out_channels, padding
        self.weight = nn.Parameter(torch.empty(n_models, out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(n_models, out_channels))

    def init_member(self, k: int, gen: torch.Generator) -> None:
        fan_in = self.in_channels * self.weight.shape[-1] * self.weight.shape[-2]
        bound = 1.0 / math.sqrt(fan_in)
        _uniform_(self.weight[k], bound, gen)
        _uniform_(self.bias[k], bound, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, b, c, h, w = x.shape
        grouped = x.permute(1, 0, 2, 3, 4).reshape(b, n * c, h, w)
        out = F.conv2d(grouped, self.weight.reshape(n * self.out_channels, c, *self.weight.shape[-2:]),
                       self.bias.reshape(-1), padding=self.padding, groups=n)
        return out.reshape(b, n, self.out_channels, *out.shape[-2:]).permute(1, 0, 2, 3, 4)


class StackedModel(nn.Module):
    """Base of the ensemble models: inputs are flat features [B, d] (shared by all members) or
    [N, B, d] (one batch per member); outputs are logits [N, B, C]."""

    arch: str = ""

    def __init__(self, seeds: Sequence[int]):
        super().__init__()
        self.seeds = [int(s) for s in seeds]

    @property
    def n_models(self) -> int:
        return len(self.seeds)

    def spec(self) -> dict:
        """Constructor arguments (without seeds): enough to rebuild the architecture."""
        raise NotImplementedError

    def _init_members(self) -> None:
        for k, seed in enumerate(self.seeds):
            gen = torch.Generator().manual_seed(seed)
            for layer in self.modules():
                if hasattr(layer, "init_member"):
                    layer.init_member(k, gen)

    def _per_member(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return x.unsqueeze(0).expand(self.n_models, -1, -1)
        if x.shape[0] != self.n_models:
            raise ValueError(f"input has {x.shape[0]} member batches but the ensemble has {self.n_models} models")
        return x

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate-layer activations [N, B, H]."""
        raise NotImplementedError

    def head(self) -> StackedLinear:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head()(self.features(x))

    def select(self, members: Sequence[int] | int) -> "StackedModel":
        """A new ensemble holding copies of the given members (an int gives a single model)."""
        idx = [members] if isinstance(members, int) else list(members)
        out = copy.deepcopy(self)
        out.seeds = [self.seeds[i] for i in idx]
        index = torch.tensor(idx, device=next(self.parameters()).device)
        with torch.no_grad():
            for p_out, p_in in zip(out.parameters(), self.parameters()):
                p_out.data = p_in.data.index_select(0, index).clone()
        return out

    @staticmethod
    def concat(models: Sequence["StackedModel"]) -> "StackedModel":
        """Join ensembles of one architecture into a larger ensemble."""
        out = copy.deepcopy(models[0])
        out.seeds = [s for m in models for s in m.seeds]
        with torch.no_grad():
            for name, p in out.named_parameters():
                p.data = torch.cat([dict(m.named_parameters())[name].data for m in models], 0)
        return out


class StackedMLP(StackedModel):
    """MLP with ReLU hidden layers; input flat features."""

    arch = "mlp"

    def __init__(self, in_dim: int, hidden: Sequence[int], n_classes: int, seeds: Sequence[int], image_shape=None):
        super().__init__(seeds)
        self.in_dim, self.hidden, self.n_classes = in_dim, list(hidden), n_classes
        self.image_shape = list(image_shape) if image_shape else None
        dims = [in_dim, *hidden]
        self.body = nn.ModuleList(StackedLinear(len(self.seeds), a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = StackedLinear(len(self.seeds), dims[-1], n_classes)
        self._init_members()

    def spec(self) -> dict:
        return {"arch": self.arch, "in_dim": self.in_dim, "hidden": self.hidden, "n_classes": self.n_classes,
                "image_shape": self.image_shape}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self._per_member(x)
        for layer in self.body:
            h = torch.relu(layer(h))
        return h

    def head(self) -> StackedLinear:
        return self.out


class StackedCNN(StackedModel):
    """Small CNN: [conv3x3 -> ReLU -> maxpool2] per channel entry, then a linear head.
    Takes flat features and reshapes them to image_shape (H, W) with one input channel."""

    arch = "cnn"

    def __init__(self, in_dim: int, channels: Sequence[int], n_classes: int, seeds: Sequence[int], image_shape):
        super().__init__(seeds)
        if not image_shape or image_shape[0] * image_shape[1] != in_dim:
            raise ValueError(f"cnn needs image_shape (H, W) with H*W == in_dim={in_dim}, got {image_shape}")
        self.in_dim, self.channels, self.n_classes = in_dim, list(channels), n_classes
        self.image_shape = list(image_shape)
        n = len(self.seeds)
        chans = [1, *channels]
        self.convs = nn.ModuleList(StackedConv2d(n, a, b, 3) for a, b in zip(chans[:-1], chans[1:]))
        h, w = self.image_shape
        for _ in channels:
            h, w = h // 2, w // 2
        self.out = StackedLinear(n, chans[-1] * h * w, n_classes)
        self._init_members()

    def spec(self) -> dict:
        return {"arch": self.arch, "in_dim": self.in_dim, "channels": self.channels, "n_classes": self.n_classes,
                "image_shape": self.image_shape}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self._per_member(x)
        n, b = h.shape[:2]
        h = h.reshape(n, b, 1, *self.image_shape)
        for conv in self.convs:
            h = torch.relu(conv(h))
            h = F.max_pool2d(h.reshape(n * b, *h.shape[2:]), 2)
            h = h.reshape(n, b, *h.shape[1:])
        return h.reshape(n, b, -1)

    def head(self) -> StackedLinear:
        return self.out


ARCHITECTURES: dict[str, type[StackedModel]] = {"mlp": StackedMLP, "cnn": StackedCNN}


def build_model(spec: dict, seeds: Sequence[int]) -> StackedModel:
    """Build an ensemble from a spec dict (see `StackedModel.spec`) and one seed per member."""
    spec = dict(spec)
    arch = spec.pop("arch")
    if arch not in ARCHITECTURES:
        raise ValueError(f"model.arch={arch!r} is not known; allowed: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[arch](seeds=seeds, **spec)
