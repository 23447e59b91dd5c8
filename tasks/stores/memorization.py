"""The memorization map (tasks/memorization_map.py; docs/certificate.md, "The map"): each training row's epsilon
under its ledger key. An erased row's entry is dropped (the map holds no model, only per-row numbers, and none of
a row that is gone); the map counts the rows dropped, which is what refreshes it (its retraining debt)."""

from __future__ import annotations

from tasks.memorization_map import load_map, map_path, save_map
from tasks.stores.base import Scope, StoreBase, register_store
from unlearning.privacy.erasure import Finding, Purged


@register_store
class MemorizationMapStore(StoreBase):
    """<cache_dir>/memorization/map.json: no entry under a forgotten key."""

    name = "memorization map"

    def _held(self, scope: Scope) -> tuple[object, int]:
        record = load_map(scope.settings.paths)
        if record is None:
            return None, 0
        return record, sum(1 for k in record.ids if k in scope.forgotten)

    def purge(self, scope: Scope) -> list[Purged]:
        record, held = self._held(scope)
        if held:
            save_map(scope.settings.paths, record.without(set(scope.forgotten)))
        return [Purged(self.name, str(map_path(scope.settings.paths)), {"purged_rows": held})]

    def verify(self, scope: Scope) -> list[Finding]:
        record, held = self._held(scope)
        if record is None:
            return []
        problems = (f"memorization map ({map_path(scope.settings.paths)}): {held} entr(ies) of forgotten rows "
                    f"remain",) if held else ()
        return [Finding(self.name, str(map_path(scope.settings.paths)), {"forgotten_entries": held}, problems)]
