import torch

from unlearning.ensembles import cached_ensemble, chunks, ensemble_key, ids_digest
from unlearning.methods.base import TrainRecipe
from unlearning.models import flat_params

SPEC = {"arch": "mlp", "in_dim": 4, "hidden": [3], "n_classes": 2}
RECIPE = TrainRecipe(epochs=2, batch_size=8, lr=0.05)


def test_oracles_of_one_batch_are_the_shadows_of_the_next(tmp_path):
    """The cache key is (set of training ids, spec, recipe, seeds): the oracles trained on R_t are found
    again as the shadow originals of batch t+1 (trained on D_{t+1} = R_t), whatever the row order."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(20, 4, generator=g), torch.randint(0, 2, (20,), generator=g)
    ids = [f"s{i}" for i in range(20)]
    oracles, cached = cached_ensemble(tmp_path, SPEC, X, y, ids, RECIPE, [5, 6])
    assert not cached
    shadows, cached = cached_ensemble(tmp_path, SPEC, X, y, list(reversed(ids)), RECIPE, [5, 6])
    assert cached and torch.equal(flat_params(shadows), flat_params(oracles))
    other, cached = cached_ensemble(tmp_path, SPEC, X[1:], y[1:], ids[1:], RECIPE, [5, 6])  # one id fewer
    assert not cached


def test_key_depends_on_every_input():
    base = ensemble_key(ids_digest(["a", "b"]), SPEC, RECIPE, [1, 2])
    assert base == ensemble_key(ids_digest(["b", "a"]), SPEC, RECIPE, [1, 2])
    assert base != ensemble_key(ids_digest(["a"]), SPEC, RECIPE, [1, 2])
    assert base != ensemble_key(ids_digest(["a", "b"]), {**SPEC, "hidden": [4]}, RECIPE, [1, 2])
    assert base != ensemble_key(ids_digest(["a", "b"]), SPEC, TrainRecipe(3, 8, 0.05), [1, 2])
    assert base != ensemble_key(ids_digest(["a", "b"]), SPEC, RECIPE, [2, 1])


def test_chunks():
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
