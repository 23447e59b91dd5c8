"""Oracle and shadow ensembles with a content-addressed cache (docs/design.md §4.2, §4.5).

An ensemble is identified by what determines it: the ids of its training rows, the model spec, the
training recipe and the member seeds. The oracles are found again, by key, when the method is `retrain`
(member 0 is promoted) and when the same batch is processed again. Shadows and oracles draw their seeds from
separate role streams (unlearning/seeds.py), so batch t's oracles are no longer batch t+1's shadow
originals (that reuse made the two roles share seeds).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from unlearning.io import StateCorrupt, atomic_save
from unlearning.privacy.ledger import HASH_PREFIX, hash_sample_id
from unlearning.models import Ensemble, TrainRecipe, build_model, fit, load_model, save_model


def ids_digest(sample_ids: Sequence[str], salt: str = "") -> str:
    """Order-independent digest of a set of sample ids (the dataset version of a training set), keyed with the
    project's salt (unlearning/privacy/salt.py): unsalted, the digests of the training set less each one id would tell,
    by hashing every candidate, which id an oracle ensemble left out."""
    h = hashlib.sha256()
    if salt:
        h.update(f"salt:{salt}\n".encode())
    for s in sorted(map(str, sample_ids)):
        h.update(s.encode() + b"\n")
    return h.hexdigest()


def id_hashes(sample_ids: Sequence[str], salt: str) -> list[str]:
    """The training ids keyed with the project's salt (`hash_sample_id`, the ledger's form), stored beside each
    cache file (`<key>.ids.json`): the cache key does not reveal which rows an ensemble saw, the erasure needs
    to (tasks/erasure.py). Never unsalted: hashing every id of the dataset would undo those."""
    return sorted(hash_sample_id(str(s), salt) for s in sample_ids)


def trained_on(cache_file: str | Path) -> set[str] | None:
    """The keyed ids an ensemble cache file was trained on; None when not recorded, or recorded by an older
    version as unsalted hashes (unknown rows: the erasure deletes such a file)."""
    side = Path(cache_file).with_suffix(".ids.json")
    if not side.exists():
        return None
    hashes = set(json.loads(side.read_text())["id_hashes"])
    return hashes if all(h.startswith(HASH_PREFIX) for h in hashes) else None


def ensemble_key(ids_hash: str, spec: dict, recipe: TrainRecipe, seeds: Sequence[int]) -> str:
    payload = json.dumps({"ids": ids_hash, "spec": spec, "recipe": asdict(recipe), "seeds": list(map(int, seeds))},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def train_fresh(spec: dict, X: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe, seeds: Sequence[int],
                device: str = "cpu", progress: bool | str = False, search_paths: Sequence[str] = ()) -> Ensemble:
    """From-scratch training of one member per seed, in one vectorized pass (`search_paths`: where a
    custom factory's module lives, for worker processes that did not import it yet)."""
    model = build_model(spec, seeds, search_paths=search_paths).to(device)
    fit(model, X, y, recipe, progress=progress)
    return model


def cached_ensemble(cache_dir: str | Path | None, spec: dict, X: torch.Tensor, y: torch.Tensor,
                    sample_ids: Sequence[str], recipe: TrainRecipe, seeds: Sequence[int], device: str = "cpu",
                    progress: bool | str = False, search_paths: Sequence[str] = (),
                    salt: str = "") -> tuple[Ensemble, bool]:
    """Load the ensemble for (ids, spec, recipe, seeds) from the cache or train and store it; `salt`: the
    project's (unlearning/privacy/salt.py id_salt) that keys the ids. Returns (model, came_from_cache)."""
    key = ensemble_key(ids_digest(sample_ids, salt), spec, recipe, seeds)
    path = Path(cache_dir) / "ensembles" / f"{key}.pt" if cache_dir else None
    if path is not None and not path.exists() and salt:
        _move_unsalted(path, ensemble_key(ids_digest(sample_ids), spec, recipe, seeds), sample_ids, salt)
    if path is not None and path.exists():
        try:
            model, _ = load_model(path, device, search_paths=search_paths)
            return model, True
        except StateCorrupt as e:  # a cache is derived data: a truncated or damaged file is trained again
            warnings.warn(f"ensemble cache: {e}; training it again", stacklevel=2)
    model = train_fresh(spec, X, y, recipe, seeds, device, progress, search_paths)
    if path is not None:
        from unlearning.io import atomic_write_json

        atomic_write_json(path.with_suffix(".ids.json"), {"ids_digest": ids_digest(sample_ids, salt),
                                                          "id_hashes": id_hashes(sample_ids, salt)})
        atomic_save(path, lambda tmp: save_model(model, tmp, {"key": key, "n_rows": int(len(sample_ids))}))
    return model, False


def _move_unsalted(path: Path, old_key: str, sample_ids: Sequence[str], salt: str) -> None:
    """A cache file an older version wrote under its unsalted key moves to its salted key `path`, its `.ids.json`
    rewritten with salted ids (one warning line says so): the cache keeps working across the change."""
    import os

    old = path.with_name(f"{old_key}.pt")
    if not old.exists():
        return
    from unlearning.io import atomic_write_json

    atomic_write_json(path.with_suffix(".ids.json"), {"ids_digest": ids_digest(sample_ids, salt),
                                                      "id_hashes": id_hashes(sample_ids, salt)})
    os.replace(old, path)
    old.with_suffix(".ids.json").unlink(missing_ok=True)
    warnings.warn(f"ensemble cache: {old.name} moved to its salted key {path.name} (an older version keyed "
                  f"the cache by unsalted id hashes)", stacklevel=3)


def chunks(seeds: Sequence[int], size: int) -> list[list[int]]:
    return [list(seeds[i : i + size]) for i in range(0, len(seeds), size)]
