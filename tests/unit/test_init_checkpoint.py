"""train.init_checkpoint: a team's own trained module becomes the original, as it is."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import make_project
from unlearning.config import load_params


def _project(tmp_path, overrides=None):
    from tasks.training import prepare_dataset
    from unlearning.data import load_prepared

    params = load_params(make_project(tmp_path, {"train": {"model": {"hidden": [7]}}, **(overrides or {})},
                                      inbox_files=False))
    prepare_dataset.fn(params)
    return params, load_prepared(params.path("prepared_dir"))


def test_the_checkpoint_is_the_original_unchanged(tmp_path):
    from tasks.training import train_original
    from unlearning.models.zoo import MLP

    torch.manual_seed(123)
    mine = MLP(in_shape=(1, 8, 8), n_classes=10, hidden=[7])  # "trained" elsewhere by the team
    torch.save(mine.state_dict(), tmp_path / "mine.pt")
    params, prepared = _project(tmp_path, {"train": {"model": {"hidden": [7]}, "init_checkpoint": "mine.pt"}})
    model, metrics = train_original.fn(params, prepared, "cpu")
    X = prepared.tensor()[:20]
    assert torch.allclose(model(X)[0], mine(X.view(-1, 1, 8, 8)), atol=1e-6)
    assert metrics["train_seconds"] == 0.0 and model.origin == "init_checkpoint mine.pt"


def test_a_checkpoint_that_does_not_fit_the_architecture_is_a_clear_error(tmp_path):
    from tasks.training import train_original
    from unlearning.models.zoo import MLP

    torch.save(MLP(in_shape=(64,), n_classes=10, hidden=[9]).state_dict(), tmp_path / "other.pt")
    params, prepared = _project(tmp_path, {"train": {"model": {"hidden": [7]}, "init_checkpoint": "other.pt"}})
    with pytest.raises(ValueError, match=r"init_checkpoint.*does not fit MLP|size mismatch"):
        train_original.fn(params, prepared, "cpu")
    params2 = params.model_copy(update={"train": params.train.model_copy(update={"init_checkpoint": "nope.pt"})})
    with pytest.raises(FileNotFoundError, match="train.init_checkpoint = nope.pt"):
        train_original.fn(params2, prepared, "cpu")
