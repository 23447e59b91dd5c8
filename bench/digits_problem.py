"""Shared by the digits benches: the digits default dataset, model spec and training recipe from params.yaml."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from unlearning.config import Params
from unlearning.data import load_dataset
from unlearning.methods.base import TrainRecipe
from unlearning.models import build_model, fit
from unlearning.models.zoo import arch_kwargs


@dataclass
class DigitsProblem:
    X: torch.Tensor          # [n, 64] float32, every sample
    y: torch.Tensor          # [n] int64
    y_np: np.ndarray         # [n] int64
    train_rows: np.ndarray   # indices of the training split
    val_rows: np.ndarray     # indices of the validation split
    spec: dict               # the model spec params.yaml builds
    recipe: TrainRecipe      # the training recipe params.yaml declares


def digits_problem(params: Params) -> DigitsProblem:
    ds = load_dataset("digits", seed=params.base.seed, val_fraction=params.prepare.val_fraction)
    y_np = np.asarray(ds.label).astype(np.int64)
    m, t = params.train.model, params.train
    spec = {"arch": m.arch, "in_shape": [int(s) for s in ds.in_shape], "n_classes": int(ds.n_classes),
            "kwargs": arch_kwargs(m.model_dump()), "factory": m.factory, "feature_layer": m.feature_layer}
    recipe = TrainRecipe(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                         optimizer=t.optimizer, momentum=t.momentum, schedule=t.schedule,
                         label_smoothing=t.label_smoothing)
    split = np.asarray(ds.split)
    return DigitsProblem(X=torch.as_tensor(np.asarray(ds.X), dtype=torch.float32), y=torch.as_tensor(y_np), y_np=y_np,
                         train_rows=np.flatnonzero(split == "train"), val_rows=np.flatnonzero(split == "val"),
                         spec=spec, recipe=recipe)


def train_members(spec: dict, seeds, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe):
    """An ensemble with one member per seed, trained on (X, y) with the recipe."""
    model = build_model(spec, seeds)
    fit(model, X, y, recipe)
    return model
