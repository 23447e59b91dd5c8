"""Tasks of the prepare and train stages, and ensemble training in chunks (one task per chunk)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from prefect import task

from adapters.clock import computes
from tasks.id_key import IdKey
from tasks.reporting import run_logger
from tasks.retry import transient_io_only

from unlearning.batch.rows import validation_rows
from unlearning.config import ModelCfg, Params, Prepare, ProjectPaths
from unlearning.data import load_dataset, write_prepared
from unlearning.data.store import Prepared
from unlearning.ensembles import cached_ensemble
from unlearning.privacy.fingerprint import StateMismatch
from unlearning.io import atomic_save
from unlearning.models import Ensemble, TrainRecipe, accuracy, build_model, fit, load_module_state, save_model
from unlearning.models.training import TrainingDiverged, nonfinite_members
from unlearning.models.training import recipe_from
from unlearning.models.zoo import spec_from


def model_spec(model: ModelCfg, prepared: Prepared) -> dict:
    """The architecture for this data: train.model plus the data's in_shape and class count."""
    return spec_from(model, prepared.in_shape, prepared.n_classes)


def build(model: ModelCfg, root: Path, prepared: Prepared, seeds: list[int]) -> Ensemble:
    """A fresh ensemble of the declared architecture (train.model; a custom factory is imported from the project
    folder `root`)."""
    return build_model(model_spec(model, prepared), seeds, search_paths=[root])


def load_source(p: Prepare, root: Path, seed: int):
    """The dataset as prepare reads it from the source (`p`: the prepare section; `root`: the project folder its
    path is relative to; `seed`: base.seed), erased rows included (prepare leaves them out; the erasure's
    id-trace search recovers the erased ids from it, as anyone holding the source could)."""
    section = p.section()
    source = {**section.model_dump(), "path": str(p.source_path(root))} if section is not None else {}
    return load_dataset(p.dataset, seed=seed, val_fraction=p.val_fraction,
                        fashion_mnist_dir=p.fashion_mnist_dir, max_train=p.max_train, max_val=p.max_val,
                        targets=p.targets, **source)


# The prepare flow's one task, called with the whole params (an entry): it reads the source (prepare, base.seed,
# the project folder) and the tombstones under base.paths, keyed with the project's id key.
@task(name="prepare-dataset", retries=0)  # deterministic: a missing or malformed dataset fails the same way again
@computes
def prepare_dataset(params: Params) -> dict:
    section = params.prepare.section()
    ds = load_source(params.prepare, params.root, params.base.seed)
    if section is not None:  # record the path as params.yaml writes it: the output must not depend on the checkout
        ds.meta["source"]["path"] = section.path
    if ds.meta.get("n_dropped_missing"):  # say which: the rows missing a value are dropped, not filled in
        run_logger().warning(f"prepare: dropped {ds.meta['n_dropped_missing']} row(s) missing a value (cells per "
                             f"column: {ds.meta.get('missing_by_column', {})}; markers read as missing: "
                             f"{ds.meta.get('missing_markers_found', {})}) as prepare.table.missing: drop says")
    # Erased rows stay out: the tombstone list lies outside every DVC out (docs/design.md §3, "Erasure vs the DVC DAG").
    from unlearning.privacy.erasure import is_erased, read_tombstones

    tombstones = read_tombstones(params.path("tombstones"))
    from unlearning.privacy.salt import id_salt

    erased = is_erased(tombstones, params.deletion.hash_sample_ids, id_salt(params)) if tombstones else None
    return write_prepared(ds, params.path("prepared_dir"), erased=erased)


def clean_of_erased(paths: ProjectPaths, ids: IdKey, init_checkpoint: str | None, prepared: Prepared) -> dict:
    """What models/original.pt records about the tombstones: {"clean_of": digest} (tasks/state.py starts a
    state only from an original clean of every tombstoned row), {} when nothing is tombstoned. Refuses to train
    on a prepared store that still holds tombstoned rows (an erasure left pending by `dvc repro`): the original,
    registered as @champion, would hold rows the pipeline certified as forgotten. `init_checkpoint`:
    train.init_checkpoint (warned about: the pipeline cannot tell what it was trained on)."""
    # the core's is_erased, not tasks.erasure's tombstoned_rows: tasks/erasure imports the state, which imports
    # this module, so importing it back would close a cycle
    from unlearning.privacy.erasure import is_erased, read_tombstones, tombstones_digest

    tombstones = read_tombstones(paths.path("tombstones"))
    if not tombstones:
        return {}
    erased = is_erased(tombstones, ids.hashed, ids.salt())
    n = int(prepared.manifest["sample_id"].map(erased).sum())
    if n:
        raise StateMismatch(f"{paths.path('prepared_dir')} still holds {n} erased row(s) (their erasure is pending: "
                            f"`dvc repro` leaves the rewrite of the prepared store to `unlearn erase`); an original "
                            f"trained on it would hold them. To go on: `unlearn erase`, then run the train stage again")
    if init_checkpoint:
        run_logger().warning(f"train.init_checkpoint = {init_checkpoint}: {len(tombstones)} row(s) of "
                             f"this dataset are erased (tombstoned); the pipeline cannot tell whether your checkpoint "
                             f"was trained on them and takes it as clean of them: load a checkpoint trained without "
                             f"them")
    return {"clean_of": tombstones_digest(tombstones)}


# The train flow's top-level task, called with the whole params: the recipe, the model, sharding, the seed, the
# project folder and (for a sharded original) the id key the shard plan is keyed with.
@task(name="train-original")
@computes
def train_original(params: Params, prepared: Prepared, device: str) -> tuple[Ensemble, dict]:
    """The production model: one member, seed = base.seed, trained on every training row with the recipe,
    or (with `train.init_checkpoint`) the team's own trained module, loaded as it is."""
    train_rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    val_rows = validation_rows(prepared.manifest)
    X_train = torch.as_tensor(np.asarray(prepared.X[train_rows]), dtype=torch.float32)
    y_train = torch.as_tensor(np.asarray(prepared.label[train_rows]), dtype=torch.long)
    model = build(params.train.model, params.root, prepared, [params.base.seed]).to(device)
    seconds, source, sharding = 0.0, "trained", None
    if params.train.init_checkpoint:
        path = Path(params.train.init_checkpoint)
        path = path if path.is_absolute() else params.root / path
        if not path.exists():
            raise FileNotFoundError(f"train.init_checkpoint = {params.train.init_checkpoint}: {path} not found")
        model, source = load_module_state(model, path, device), f"init_checkpoint {path.name}"
    elif params.train.sharding.on:  # SISA: S constituents in slices, checkpointed in models/shards/ (docs/sharding.md)
        from tasks.sharding import ShardTraining, train_sharded

        start = time.perf_counter()
        shards = ShardTraining(params.train.sharding, params.prepare, params.base.seed, params.base.progress,
                               params.project_paths, IdKey.of(params))
        model, sharding = train_sharded(shards, prepared, train_rows, recipe_from(params.train),
                                        model_spec(params.train.model, prepared), device)
        seconds, source = time.perf_counter() - start, "trained"
    else:
        cost = fit(model, X_train, y_train, recipe_from(params.train),
                   progress="train original" if params.base.progress else False)
        seconds = cost.seconds
    if not params.train.sharding.on:  # models/shards/ is a DVC output of train either way: a plan saying "one model"
        from tasks.sharding import write_unsharded

        write_unsharded(params.project_paths)
    # fit and load_module_state stop on inf/NaN themselves; this guard keeps a NaN original from ever reaching
    # the registry as @champion (flows/train.py registers what this returns) whatever produced it.
    if nonfinite_members(model):
        raise TrainingDiverged(f"the original ({source}) holds inf/NaN weights; lower train.lr (now "
                               f"{params.train.lr:g}) or check the model for operations that overflow")
    X_val = torch.as_tensor(np.asarray(prepared.X[val_rows]), dtype=torch.float32)
    y_val = torch.as_tensor(np.asarray(prepared.label[val_rows]), dtype=torch.long)
    metrics = {"train_accuracy": float(accuracy(model, X_train, y_train)[0]),
               "val_accuracy": float(accuracy(model, X_val, y_val)[0]),
               "train_seconds": seconds, "n_train": int(len(train_rows)), "n_val": int(len(val_rows))}
    if sharding:
        from tasks.sharding import sharded_accuracy_lines

        metrics.update({"shards": sharding["shards"], "slices": sharding["slices"],
                        "min_shard_rows": min(sharding["shard_rows"]), "max_shard_rows": max(sharding["shard_rows"])})
        lines, more = sharded_accuracy_lines(model, X_val, y_val, sharding)
        metrics.update(more)
        for line in lines:
            (run_logger().warning if line is sharding.get("skew_warning") else run_logger().info)(line)
    model.origin = source  # "trained" or "init_checkpoint <file>": the train flow reports it
    return model, metrics


@task(name="save-checkpoint", retries=2, retry_delay_seconds=[1, 3], retry_condition_fn=transient_io_only)
@computes
def save_checkpoint(model: Ensemble, path, extra: dict) -> None:
    atomic_save(path, lambda tmp: save_model(model, tmp, extra))


@task(name="train-ensemble-chunk")
@computes
def train_ensemble_chunk(spec: dict, X: torch.Tensor, y: torch.Tensor, sample_ids: list[str], recipe: TrainRecipe,
                         seeds: list[int], cache_dir: str | None, device: str, label: str,
                         search_paths: list[str] | None = None, progress: bool = True,
                         salt: str = "") -> tuple[Ensemble, bool, float]:
    """One chunk of an oracle/shadow ensemble; content-hash cached so re-runs and later batches reuse it.
    `search_paths`: the project folder, so a custom model factory imports in a Dask worker process too;
    `label`: the chunk's progress label (tasks.stages.chunk_labels); `progress`: base.progress (its lines, or
    nothing); `salt`: the project's (unlearning/privacy/salt.py id_salt), which keys the cache's ids."""
    start = time.perf_counter()
    model, cached = cached_ensemble(cache_dir, spec, X, y, sample_ids, recipe, seeds, device,
                                    progress=label if progress else False,
                                    search_paths=search_paths or (), salt=salt)
    return model.cpu(), cached, time.perf_counter() - start
