"""The model stores: the ensemble cache (oracles and shadows) and the checkpoints (models/*.pt, the state's model)
(docs/erasure.md)."""

from __future__ import annotations

from pathlib import Path

from tasks.stores.base import Scope, StoreBase, register_store
from unlearning.config import ProjectPaths
from unlearning.ensembles import trained_on
from unlearning.privacy.erasure import Finding, Purged, clean_of_tombstones, state_is_clean, tombstones_digest
from unlearning.io import atomic_save, load_checkpoint, read_json_file


@register_store
class EnsembleCache(StoreBase):
    """<cache_dir>/ensembles/*.pt: a cached ensemble trained on a forgotten row is deleted with its `.ids.json`;
    one whose training rows are not recorded cannot be proven clean and is deleted too."""

    name = "ensemble cache"

    def _folder(self, paths: ProjectPaths) -> Path:
        return paths.path("cache_dir") / "ensembles"

    def _trained_on_forgotten(self, scope: Scope) -> list[Path]:
        folder = self._folder(scope.settings.paths)
        out = []
        for f in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
            ids = trained_on(f)
            if ids is None or ids & scope.cache_hashes:
                out.append(f)
        return out

    def purge(self, scope: Scope) -> list[Purged]:
        removed = []
        for f in self._trained_on_forgotten(scope):
            f.unlink(missing_ok=True)
            f.with_suffix(".ids.json").unlink(missing_ok=True)
            removed.append(f.name)
        return [Purged(self.name, str(self._folder(scope.settings.paths)), {"purged_files": removed})]

    def verify(self, scope: Scope) -> list[Finding]:
        folder, bad = self._folder(scope.settings.paths), [f.name for f in self._trained_on_forgotten(scope)]
        problems = (f"ensemble cache ({folder}): {len(bad)} file(s) trained on forgotten rows (or on unknown rows): "
                    f"{bad[:5]}",) if bad else ()
        return [Finding(self.name, str(folder), {"trained_on_forgotten": len(bad)}, problems)]


STATE_HOLDS_ERASED = ("the state's champion holds erased rows (a state started, before this check existed, from an "
                      "original trained before them): it does not replace models/original.pt; `unlearn reset`, then "
                      "`dvc repro -f prepare` retrains the original without them")


def state_clean(paths: ProjectPaths, tombstones: set[str]) -> bool:
    """Whether state/'s champion holds none of the tombstoned rows (unlearning/privacy/erasure.py, state_is_clean)."""
    from unlearning.privacy.ledger import read_ledger

    state_dir = paths.path("state_dir")
    if not (state_dir / "champion.json").exists():
        return True
    ledger_keys = {str(e["sample_id"]) for e in read_ledger(state_dir / "ledger.jsonl")}
    return state_is_clean(read_json_file(state_dir / "champion.json"), ledger_keys, tombstones)


def replace_original(paths: ProjectPaths, digest: str) -> str | None:
    """models/original.pt := the champion (state/model.pt), marked with the tombstones it is clean of."""
    import torch

    from tasks.state import original_path

    path, champion = original_path(paths), paths.path("state_dir") / "model.pt"
    if not champion.exists():
        return None
    if path.exists():
        extra = load_checkpoint(path).get("extra", {})
        if extra.get("erased_through") == digest:
            return None
    ckpt = load_checkpoint(champion)
    ckpt["extra"] = {**ckpt.get("extra", {}), "erased_through": digest, "origin": "champion after erasure"}
    atomic_save(path, lambda tmp: torch.save(ckpt, tmp))
    return str(path)


@register_store
class Checkpoints(StoreBase):
    """models/*.pt (the original model) and the state's champion: models/original.pt is replaced by the champion
    (which the gate certified as unlearned), so the pipeline keeps a starting model and no checkpoint trained on
    a forgotten row remains. Inside `dvc repro` models/ is train's output: pending for `unlearn erase`."""

    name = "models"

    def purge(self, scope: Scope) -> list[Purged]:
        folder = str(scope.settings.paths.path("models_dir"))
        if scope.dvc_locked:
            return [Purged(self.name, folder, {"replaced": None}, pending="models/original.pt")]
        if not state_clean(scope.settings.paths, scope.tombstones):
            return [Purged(self.name, folder, {"replaced": None, "refused": STATE_HOLDS_ERASED})]
        replaced = replace_original(scope.settings.paths, tombstones_digest(scope.tombstones))
        return [Purged(self.name, folder, {"replaced": replaced})]

    def verify(self, scope: Scope) -> list[Finding]:
        """models/*.pt and the state's champion: none trained on a tombstoned row (whole-list digests)."""
        paths, tomb = scope.settings.paths, scope.tombstones
        models, state_dir = paths.path("models_dir"), paths.path("state_dir")
        out = []
        if scope.forgotten:
            for f in sorted(models.glob("*.pt")) if models.is_dir() else []:
                clean = clean_of_tombstones(load_checkpoint(f).get("extra", {}), tomb)
                out.append(Finding(self.name, str(f), {"trained_on_forgotten": not clean}, () if clean else (
                    f"models ({f}): a checkpoint trained before the last erasure remains",)))
        if tomb and (state_dir / "champion.json").exists():
            clean = state_clean(scope.settings.paths, tomb)
            out.append(Finding("state model", str(state_dir / "model.pt"), {"trained_on_forgotten": not clean},
                               () if clean else (f"state model ({state_dir / 'model.pt'}): {STATE_HOLDS_ERASED}",)))
        return out
