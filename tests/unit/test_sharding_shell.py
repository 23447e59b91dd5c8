"""tasks/sharding.py: which shard folder a loaded champion reads (the original's when a state starts from it, the
state's after a sisa batch), and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.id_key import IdKey
from tasks.sharding import attach_state, original_shards, state_shards, write_folder
from tests.unit.test_erasure_stores import table_project
from unlearning.data import load_prepared
from unlearning.models import TrainRecipe
from unlearning.sharding import ShardState, id_hash, make_plan, train_from_scratch

RECIPE = TrainRecipe(epochs=1, batch_size=4, lr=0.01)


def sharded(params):
    prepared = load_prepared(params.path("prepared_dir"))
    rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    ids = prepared.manifest["sample_id"].to_numpy()[rows]
    X = torch.as_tensor(np.asarray(prepared.X)[rows], dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label)[rows], dtype=torch.long)
    plan = make_plan([id_hash(i) for i in ids], ids, 2, 1, 0, RECIPE.epochs, [5, 6])
    spec = {"arch": "mlp", "in_shape": [X.shape[1]], "n_classes": 2, "kwargs": {"hidden": [3]}}
    stored = {}
    constituents, _ = train_from_scratch(spec, plan, X, y, RECIPE,
                                         checkpoint=lambda k, r, m: stored.__setitem__((k, r), m.select(0)))
    return prepared, ShardState(plan, X, y, stored), constituents


def test_a_state_starting_from_the_original_reads_the_originals_checkpoints(tmp_path):
    params = table_project(tmp_path)
    prepared, state, constituents = sharded(params)
    write_folder(original_shards(params.project_paths), state)
    smaller = ShardState(state.plan.without(np.array([0])), state.X[1:], state.y[1:], state.checkpoints)
    # a former state's, e.g. before the original was trained again
    write_folder(state_shards(params.project_paths), smaller)
    fresh = attach_state(params.project_paths, IdKey.of(params), prepared, state.model(constituents),
                         from_original=True)
    assert len(fresh.shard_state.plan.sample_ids) == len(state.plan.sample_ids)
    batched = attach_state(params.project_paths, IdKey.of(params), prepared, state.model(constituents))
    assert len(batched.shard_state.plan.sample_ids) == len(state.plan.sample_ids) - 1


def test_a_sharded_champion_without_its_plan_is_refused_with_the_fix(tmp_path):
    params = table_project(tmp_path)
    prepared, state, constituents = sharded(params)
    with pytest.raises(FileNotFoundError, match="run the train stage again"):
        attach_state(params.project_paths, IdKey.of(params), prepared, state.model(constituents))


def test_a_champion_trained_as_one_leaves_no_shard_folder_in_the_state(tmp_path):
    from tasks.state import write_state
    from unlearning.models import build_model

    params = table_project(tmp_path)
    prepared, state, constituents = sharded(params)
    folder = tmp_path / "stage"
    manifest = prepared.manifest.assign(status="retained", deleted_by="")
    write_state(folder, state.model(constituents), manifest, [], {}, {"digest": "x"})
    assert (folder / "shards" / "plan.json").exists()
    write_state(folder, build_model(state.checkpoints[(0, 0)].spec(), [1]), manifest, [], {}, {"digest": "x"})
    assert not (folder / "shards").exists()  # the staging copy of a former sharded state: removed
