"""Team-style model factories for the tests (`train.model.arch: custom`, factory "custom_modules:<fn>").

Importable with `search_paths=[<tests/unit>]` (the factory import puts the folder on sys.path)."""

from __future__ import annotations

import math

from torch import nn


def bn_mlp(in_shape, n_classes, hidden: int = 8):
    """Linear (no bias: BatchNorm follows) -> BatchNorm1d -> ReLU -> Linear: stacked buffers, no randomness."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(), nn.Linear(hidden, n_classes))


def bn_dropout_mlp(in_shape, n_classes, hidden: int = 8, p: float = 0.3):
    """Linear -> BatchNorm1d -> ReLU -> Dropout -> Linear: buffers AND per-member randomness."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, n_classes))
