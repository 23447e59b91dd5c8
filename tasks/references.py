"""The batch's reference models, trained only as far as the plan's looks need them (unlearning/planning/plan.py).

`ReferencePool.ensure(n_shadows, n_oracles)` trains the members still missing, in chunks sized by the plan
(memory budget, workers) and submitted as Prefect tasks to the flow's task runner (threads or Dask), each
chunk content-hash cached (unlearning/ensembles.py). Seeds come from the batch's own streams
(unlearning/seeds.py reference_seeds): batch t+1's shadows are batch t's oracles, found again in the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from adapters import clock
from adapters.clock import elsewhere
from tasks.id_key import IdKey
from tasks.reporting import run_logger
from tasks.training import model_spec, train_ensemble_chunk
from unlearning.batch.rows import BatchRows
from unlearning.config import ModelCfg, ProjectPaths, Validation
from unlearning.models import Ensemble, TrainRecipe
from unlearning.planning.plan import balanced_chunks
from unlearning.seeds import reference_seeds


def dask_client():
    """The Dask client of the flow's task runner, or None (threads, or no flow run)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    return runner.client if type(runner).__name__ == "DaskTaskRunner" else None


def chunk_labels(label: str, sizes: list[int], start: int = 0, total: int | None = None) -> list[str]:
    """One progress label per chunk: chunks run side by side, so each says which members it trains
    ("oracles 17-24 of 32"); a single chunk of every member is "oracles x80"."""
    ends = (start + np.cumsum(sizes)).tolist()
    total = total if total is not None else (ends[-1] if ends else 0)
    if len(sizes) == 1 and start == 0 and sizes[0] == total:
        return [f"{label} x{sizes[0]}"]
    return [f"{label} {end - size + 1}-{end} of {total}" for size, end in zip(sizes, ends)]


@dataclass(frozen=True)
class ReferenceTraining:
    """What training a batch's reference models (and its exact retrain) reads of the params: the model
    (train.model) and the recipe, base.seed (the seed streams), the sizes and the runner (validation: n_shadows,
    n_oracles, task_runner, certificate_rows, ...), base.progress, the project's folders (the ensemble cache, a
    custom model's factory) and the id key the cache's ids are keyed with."""

    model: ModelCfg
    recipe: TrainRecipe
    validation: Validation
    seed: int
    progress: bool
    paths: ProjectPaths
    ids: IdKey

    def submit_chunk(self, prepared, X, y, ids, seeds: list[int], device: str, label: str):
        """One chunk of members as a Prefect task on the flow's runner (tasks/training.py train_ensemble_chunk)."""
        return train_ensemble_chunk.submit(*self.chunk_args(prepared, X, y, ids, seeds, device, label),
                                           progress=self.progress, salt=self.ids.salt())

    def train_chunk(self, prepared, X, y, ids, seeds: list[int], device: str, label: str):
        """One chunk of members trained here (an exact retrain): (model, cached, seconds)."""
        return train_ensemble_chunk.fn(*self.chunk_args(prepared, X, y, ids, seeds, device, label),
                                       progress=self.progress, salt=self.ids.salt())

    def chunk_args(self, prepared, X, y, ids, seeds: list[int], device: str, label: str) -> tuple:
        return (model_spec(self.model, prepared), X, y, ids, self.recipe, seeds, str(self.paths.path("cache_dir")),
                device, label, [str(self.paths.root)])


@dataclass
class RoleModels:
    """The members of one role trained so far, in seed order."""

    rows: np.ndarray
    seeds: list[int]
    models: list[Ensemble] = field(default_factory=list)
    trained: int = 0
    cached_chunks: int = 0
    chunks: int = 0
    seconds: float = 0.0

    def ensemble(self, n: int | None = None) -> Ensemble | None:
        """The first `n` members (all: None); None when none is asked for and none was trained (an audited
        retrain trains oracles alone)."""
        if not self.models and n == 0:
            return None
        whole = Ensemble.concat(self.models)
        return whole if n is None or n >= whole.n_models else whole.select(list(range(n)))


class ReferencePool:
    """Oracles (retrains on R) and shadow originals (trained on D) for one batch, grown look by look."""

    def __init__(self, training: ReferenceTraining, state, rows: BatchRows, device: str, batch_index: int,
                 chunk_cap: int, workers: int):
        v = training.validation
        shadow_seeds, oracle_seeds = reference_seeds(training.seed, batch_index, v.n_shadows, v.n_oracles)
        self.training, self.state, self.device = training, state, device
        self.chunk_cap, self.workers = max(1, chunk_cap), max(1, workers)
        self.roles = {"shadows": RoleModels(rows.before, shadow_seeds), "oracles": RoleModels(rows.retain, oracle_seeds)}
        self._inputs: dict[str, tuple] = {}

    @clock.phase("references")  # the batch's references phase: wall time, parallel chunks counted once
    def ensure(self, n_shadows: int, n_oracles: int) -> tuple[Ensemble, Ensemble]:
        """(shadows[:n_shadows], oracles[:n_oracles]), training only the members not trained yet; both roles'
        chunks are submitted together, so the workers share them."""
        started = time.perf_counter()
        futures = {name: self._submit(name, n) for name, n in (("shadows", n_shadows), ("oracles", n_oracles))}
        for name, submitted in futures.items():
            role = self.roles[name]
            for future, size in submitted:
                model, cached, seconds = future.result()
                if self.training.validation.task_runner == "dask":  # a worker's compute is compute (adapters/clock.py)
                    elsewhere("compute", "train_ensemble_chunk (worker)", seconds)
                role.models.append(model)
                role.trained += size
                role.cached_chunks += int(cached)
                role.chunks += 1
                role.seconds += seconds
        new = sum(len(f) for f in futures.values())
        if new:
            run_logger().info(f"references: {n_shadows} shadows and {n_oracles} oracles ready "
                              f"({time.perf_counter() - started:.1f} s)")
        return self.roles["shadows"].ensemble(n_shadows), self.roles["oracles"].ensemble(n_oracles)

    def _submit(self, name: str, n: int) -> list[tuple[object, int]]:
        role = self.roles[name]
        missing = n - role.trained
        if missing <= 0:
            return []
        X, y, ids = self._data(name)
        sizes = balanced_chunks(missing, self.chunk_cap, self.workers)
        labels = chunk_labels(name, sizes, role.trained, len(role.seeds) if n == len(role.seeds) else n)
        out, start = [], role.trained
        for size, text in zip(sizes, labels):
            seeds = role.seeds[start:start + size]
            out.append((self.training.submit_chunk(self.state.prepared, X, y, ids, seeds, self.device, text), size))
            start += size
        return out

    def _data(self, name: str) -> tuple:
        """(X, y, ids) of a role's rows; on a Dask cluster scattered to the workers once per role (the chunks'
        tasks then carry futures, not 24 MiB of training data each, and each look reuses them)."""
        if name not in self._inputs:
            prepared, rows = self.state.prepared, self.roles[name].rows
            data = (torch.as_tensor(prepared.X[rows], dtype=torch.float32),
                    torch.as_tensor(prepared.label[rows], dtype=torch.long),
                    prepared.manifest["sample_id"].to_numpy()[rows].tolist())
            client = dask_client()
            # one future per object: scatter() of a bare list would scatter each id on its own
            self._inputs[name] = tuple(client.scatter([d])[0] for d in data) if client is not None else data
        return self._inputs[name]

    def summary(self) -> dict[str, float]:
        out = {}
        for name, role in self.roles.items():
            out.update({f"n_{name}": role.trained, f"{name}_seconds": role.seconds,
                        f"{name}_chunks": role.chunks, f"{name}_cached_chunks": role.cached_chunks})
        return out
