"""Tasks of the prepare and train stages, and ensemble training in chunks (one task per chunk)."""

from __future__ import annotations

import time

import numpy as np
import torch
from prefect import task

from unlearning.batch import validation_rows
from unlearning.config import Params
from unlearning.data import load_dataset, write_prepared
from unlearning.data.store import Prepared
from unlearning.ensembles import cached_ensemble
from unlearning.io import atomic_save
from unlearning.methods.base import TrainRecipe
from unlearning.models import StackedModel, accuracy, build_model, save_model, train_ensemble


def model_spec(params: Params, prepared: Prepared) -> dict:
    m = params.train.model
    common = {"arch": m.arch, "in_dim": int(prepared.X.shape[1]), "n_classes": prepared.n_classes,
              "image_shape": prepared.info["image_shape"]}
    return {**common, "hidden": list(m.hidden)} if m.arch == "mlp" else {**common, "channels": list(m.channels)}


def recipe(params: Params) -> TrainRecipe:
    t = params.train
    return TrainRecipe(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay)


@task(name="prepare-dataset", retries=1)
def prepare_dataset(params: Params) -> dict:
    p = params.prepare
    ds = load_dataset(p.dataset, seed=params.base.seed, val_fraction=p.val_fraction,
                      fashion_mnist_dir=p.fashion_mnist_dir, max_train=p.max_train, max_val=p.max_val,
                      targets=p.targets)
    return write_prepared(ds, params.path("prepared_dir"))


@task(name="train-original")
def train_original(params: Params, prepared: Prepared, device: str) -> tuple[StackedModel, dict]:
    """The production model: one member, seed = base.seed, trained on every training row."""
    train_rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    val_rows = validation_rows(prepared.manifest)
    X = torch.as_tensor(prepared.X, dtype=torch.float32)
    y = torch.as_tensor(prepared.label, dtype=torch.long)
    model = build_model(model_spec(params, prepared), [params.base.seed]).to(device)
    r = recipe(params)
    cost = train_ensemble(model, X[train_rows], y[train_rows], epochs=r.epochs, batch_size=r.batch_size, lr=r.lr,
                          weight_decay=r.weight_decay, progress="train original" if params.base.progress else False)
    metrics = {"train_accuracy": float(accuracy(model, X[train_rows], y[train_rows])[0]),
               "val_accuracy": float(accuracy(model, X[val_rows], y[val_rows])[0]),
               "train_seconds": cost.seconds, "n_train": int(len(train_rows)), "n_val": int(len(val_rows))}
    return model, metrics


@task(name="save-checkpoint", retries=2, retry_delay_seconds=[1, 3])
def save_checkpoint(model: StackedModel, path, extra: dict) -> None:
    atomic_save(path, lambda tmp: save_model(model, tmp, extra))


@task(name="train-ensemble-chunk")
def train_ensemble_chunk(spec: dict, X: torch.Tensor, y: torch.Tensor, sample_ids: list[str], recipe: TrainRecipe,
                         seeds: list[int], cache_dir: str | None, device: str, label: str) -> tuple[StackedModel, bool, float]:
    """One chunk of an oracle/shadow ensemble; content-hash cached so re-runs and later batches reuse it."""
    start = time.perf_counter()
    model, cached = cached_ensemble(cache_dir, spec, X, y, sample_ids, recipe, seeds, device,
                                    progress=f"{label} x{len(seeds)}")
    return model.cpu(), cached, time.perf_counter() - start
