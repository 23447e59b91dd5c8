"""A damaged checkpoint (state/model.pt, models/original.pt) or prepared store (data/prepared) is one line
naming the file and the fix, not a torch, numpy or pandera traceback; a damaged ensemble cache file is derived data: it is trained again, with a warning."""

from __future__ import annotations

import pytest
import torch

from unlearning.ensembles import cached_ensemble
from unlearning.io import StateCorrupt
from unlearning.methods.base import TrainRecipe
from unlearning.models import flat_params, load_model

SPEC = {"arch": "mlp", "in_dim": 4, "hidden": [3], "n_classes": 2}
RECIPE = TrainRecipe(epochs=2, batch_size=8, lr=0.05)


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(20, 4, generator=g), torch.randint(0, 2, (20,), generator=g), [f"s{i}" for i in range(20)]


def cache_file(tmp_path):
    (path,) = (tmp_path / "ensembles").glob("*[0-9a-f].pt")
    return path


@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
def test_a_damaged_checkpoint_names_the_file_and_the_fix(tmp_path, damage):
    X, y, ids = data()
    cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1])
    path = cache_file(tmp_path)
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[: len(raw) // 3], "empty": b"", "text": b"not a checkpoint\n"}[damage])
    with pytest.raises(StateCorrupt) as e:
        load_model(path)
    message = str(e.value)
    assert str(path) in message and "dvc checkout" in message and "\n" not in message


def test_a_damaged_cache_file_is_trained_again(tmp_path):
    X, y, ids = data()
    first, _ = cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1, 2])
    path = cache_file(tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(UserWarning, match="training it again"):
        again, cached = cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1, 2])
    assert not cached and torch.equal(flat_params(again), flat_params(first))  # same seeds, same members
    third, cached = cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [1, 2])
    assert cached and torch.equal(flat_params(third), flat_params(first))  # the file was written again


def _damage_prepared(folder, damage):
    import json

    import numpy as np

    if damage == "truncated_features":
        raw = (folder / "features.npy").read_bytes()
        (folder / "features.npy").write_bytes(raw[: len(raw) // 2])
    elif damage == "short_labels":
        np.save(folder / "labels.npy", np.load(folder / "labels.npy")[:-2])
    elif damage == "dataset_json":
        (folder / "dataset.json").write_text('{"name": ')
    elif damage == "manifest_truncated":
        text = (folder / "manifest.csv").read_text()
        (folder / "manifest.csv").write_text(text[: len(text) // 2])
    elif damage == "manifest_bad_split":
        text = (folder / "manifest.csv").read_text()
        (folder / "manifest.csv").write_text(text.replace(",train,", ",trian,"))
    else:
        json.loads("unknown damage")


@pytest.mark.parametrize("damage", ["truncated_features", "short_labels", "dataset_json", "manifest_truncated",
                                    "manifest_bad_split"])
def test_a_damaged_prepared_store_is_one_line_with_the_fix(tmp_path, damage):
    from unlearning.data import load_dataset, load_prepared, write_prepared

    write_prepared(load_dataset("digits", max_train=40, max_val=10), tmp_path / "p")
    load_prepared(tmp_path / "p")  # intact: loads
    _damage_prepared(tmp_path / "p", damage)
    with pytest.raises(StateCorrupt) as e:
        load_prepared(tmp_path / "p")
    message = str(e.value)
    assert str(tmp_path / "p") in message and "dvc checkout data/prepared" in message and "\n" not in message
    assert len(message) < 700
