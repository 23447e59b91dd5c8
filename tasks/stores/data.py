"""The data stores: the erasure's own record (reports, tombstones), the prepared store, the state manifest, and the
team's own sources (a table, an image folder), which are checked and never rewritten (docs/erasure.md)."""

from __future__ import annotations

from pathlib import Path

from tasks.stores.base import CountedOnly, Scope, StoreBase, prepared_rows, register_store, unreadable_finding
from unlearning.config import ProjectPaths
from unlearning.data import read_state_manifest
from unlearning.data.store import manifest_csv_bytes, rewrite_without
from unlearning.privacy.erasure import Finding, Purged, shown
from unlearning.io import atomic_write_bytes, commit_dir, discard_dir, staging_dir
from unlearning.privacy.ledger import HASH_PREFIX


from tasks.pending import reports_dir  # noqa: E402,F401  (one definition: unlearn status reads it too)


LEGACY_KEYS = ("row_ids_by_digest", "cache_id_hashes")  # an older version's: which id each row was, unsalted ids


def legacy_report(report: dict, hash_ids: bool) -> bool:
    """Whether an erasure report is an older version's: an id map, unsalted id hashes, or (under hashing)
    unsalted row digests, each a way back from a row or a hash to who was erased."""
    return any(k in report for k in LEGACY_KEYS) or (
        hash_ids and any(not d.startswith(HASH_PREFIX) for d in report.get("row_digests", [])))


@register_store
class ErasureReports(StoreBase):
    """state/erasure/<batch>.json: what each pass purged and the fingerprints of the rows (written by `erase`
    itself). Verified: a batch in scope has a report, and no report waits with a pending purge."""

    name = "erasure reports"

    def purge(self, scope: Scope) -> list[Purged]:
        return []  # the report is the erasure's record: `erase` writes it after the stores' purges

    def verify(self, scope: Scope) -> list[Finding]:
        from unlearning.privacy.erasure_journal import unfinished

        journals = unfinished(scope.settings.paths.path("state_dir"))
        started = [f"unfinished erase: {j.describe()}: `unlearn erase` finishes it (so do `unlearn run`, `unlearn "
                   f"repro` and `make run`, before anything else)" for j in journals]
        problems = ["no erasure report in state/erasure/: the erasure never ran (run `unlearn erase`)"] \
            if scope.ledger and not scope.reports and not journals else []
        pending = [f"batch {r['batch_id']}: erasure pending ({p})" for r in scope.reports for p in r.get("pending", [])
                   if r.get("batch_id") not in {j.batch_id for j in journals}]
        older = [f"batch {r.get('batch_id')}: its erasure report maps rows to ids or holds unsalted hashes (an older "
                 f"version); `unlearn erase` rewrites it" for r in scope.reports if legacy_report(r, scope.hash_ids)]
        folder = reports_dir(scope.settings.paths)
        return [Finding(self.name, str(folder), {"reports": len(scope.reports), "unfinished": len(started),
                                                 "pending": len(pending), "older": len(older)},
                        tuple(started + problems + pending + older))] + \
            unreadable_finding(self.name, folder, scope.unreadable_reports)


@register_store
class Tombstones(StoreBase):
    """base.paths.tombstones: every erased id (keyed), outside every DVC out; prepare leaves these rows out.
    `erase` adds the batch's ids first (every other store's purge reads them); verified: every forgotten id is
    tombstoned, else a re-prepare would bring it back."""

    name = "tombstones"

    def purge(self, scope: Scope) -> list[Purged]:
        return [Purged(self.name, str(scope.settings.paths.path("tombstones")), {"entries": len(scope.tombstones)})]

    def verify(self, scope: Scope) -> list[Finding]:
        path = scope.settings.paths.path("tombstones")
        missing = sorted(scope.forgotten - scope.tombstones)
        problems = (f"tombstones ({path}): {len(missing)} forgotten id(s) are not tombstoned: a re-prepare would "
                    f"bring them back: {shown(list(map(repr, missing)))}",) if missing else ()
        found = Finding.left(self.name, path, not_tombstoned=len(missing))
        return [Finding(found.store, found.where, found.counts, problems)]


@register_store
class PreparedStore(StoreBase):
    """base.paths.prepared_dir: rewritten without the forgotten rows (a staging folder, then a swap). Inside
    `dvc repro` it is prepare's output, held by the repro: pending for `unlearn erase`."""

    name = "prepared store"

    def purge(self, scope: Scope) -> list[Purged]:
        folder = scope.settings.paths.path("prepared_dir")
        if scope.dvc_locked:
            return [Purged("prepared", str(folder), {"purged_rows": 0}, pending=self.name)]
        stage = staging_dir(folder)
        try:
            n = rewrite_without(folder, stage, scope.is_forgotten)
            if n:
                commit_dir(stage, folder)
            else:
                discard_dir(stage)
        except BaseException:
            discard_dir(stage)
            raise
        return [Purged("prepared", str(folder), {"purged_rows": n})]

    def verify(self, scope: Scope) -> list[Finding]:
        """Forgotten ids left, and forgotten rows by identity: a row with a forgotten row's bytes fails only when
        its own id is forgotten; under a retained id it is that person's row (a twin, listed, not a problem)."""
        if scope.prepared is None:
            return []
        digests, keys, _ = prepared_rows(scope)
        hit = [k in scope.forgotten for k in keys]
        ids = [repr(k) for k, h in zip(keys, hit) if h]
        rows = [repr(k) for k, h, d in zip(keys, hit, digests) if h and d in scope.digest_ids]
        twins = [{"forgotten": scope.row_name(d), "retained": ids[:5], "n_retained": len(ids)}
                 for d, ids in sorted(scope.kept.items())]
        return [Finding.left(self.name, scope.settings.paths.path("prepared_dir"), ids, rows,
                             **({"identical_to_retained": twins} if twins else {}))]


@register_store
class StateManifest(StoreBase):
    """state/manifest.csv: its rows stay aligned with the prepared store (the ledger keeps the record), so it is
    rewritten with it, and waits with it inside `dvc repro`."""

    name = "state manifest"

    def _path(self, paths: ProjectPaths) -> Path:
        return paths.path("state_dir") / "manifest.csv"

    def purge(self, scope: Scope) -> list[Purged]:
        path = self._path(scope.settings.paths)
        if scope.dvc_locked:
            return [Purged(self.name, str(path), {"purged_rows": 0}, pending=self.name)]
        n = 0
        if path.exists():
            m = read_state_manifest(path)
            hit = m["sample_id"].map(scope.is_forgotten).to_numpy(dtype=bool)
            if hit.any():
                atomic_write_bytes(path, manifest_csv_bytes(m[~hit].reset_index(drop=True)))
            n = int(hit.sum())
        return [Purged(self.name, str(path), {"purged_rows": n})]

    def verify(self, scope: Scope) -> list[Finding]:
        path = self._path(scope.settings.paths)
        if not path.exists():
            return []
        keys = read_state_manifest(path)["sample_id"].map(scope.key)
        return [Finding.left(self.name, path, [repr(k) for k in keys if k in scope.forgotten])]


def source_table_checks(prepared, key, forgotten: set[str]) -> list[dict]:
    """The team's own table (prepare.table.path): the pipeline never rewrites a team's source data, and the
    tombstones keep its forgotten rows out of every prepared store; the check says how many are still there,
    so that they can be deleted at the source too (`unlearn verify-erasure` prints it as a note)."""
    from unlearning.data.registry import DataError
    from unlearning.data.sources import read_table

    source = (prepared.info.get("source") or {}) if prepared is not None else {}
    if source.get("type") != "table" or not forgotten or not Path(source.get("path", "")).is_file():
        return []
    path, column = Path(source["path"]), source.get("id_column")
    try:
        ids = read_table(path, [column])[column]  # as prepare read it (ids as text)
    except (DataError, KeyError) as e:
        return [{"store": "source table", "path": str(path), "unreadable": str(e)}]
    n = int(ids.dropna().astype(str).map(lambda s: key(s) in forgotten).sum())
    return [{"store": "source table", "path": str(path), "forgotten_rows_at_the_source": n}]


def source_folder_checks(prepared, key, forgotten: set[str]) -> list[dict]:
    """The team's own image folder (prepare.image_folder.path), like `source_table_checks`: the pipeline never
    deletes a team's source images; the check counts the forgotten ones still there and names the first files."""
    from unlearning.data.registry import DataError
    from unlearning.data.sources import image_id, scan_image_folder

    source = (prepared.info.get("source") or {}) if prepared is not None else {}
    if source.get("type") != "image_folder" or not forgotten or not Path(source.get("path", "")).is_dir():
        return []
    root = Path(source["path"])
    try:
        _, entries = scan_image_folder(root)
    except DataError as e:
        return [{"store": "source image folder", "path": str(root), "unreadable": str(e)}]
    left = [f.relative_to(root).as_posix() for f, _, _ in entries if key(image_id(root, f)) in forgotten]
    return [{"store": "source image folder", "path": str(root), "forgotten_rows_at_the_source": len(left),
             "first_files": left[:5]}]


def as_findings(checks: list[dict]) -> list[Finding]:
    return [Finding(c["store"], c["path"], {k: v for k, v in c.items() if k not in ("store", "path")}) for c in checks]


@register_store
class SourceTable(CountedOnly):
    """The team's table (prepare.table.path): never rewritten by the pipeline; the forgotten rows still there are
    counted (a note of `unlearn verify-erasure`, not a problem: deleting them is the team's decision)."""

    name = "source table"

    def verify(self, scope: Scope) -> list[Finding]:
        return as_findings(source_table_checks(scope.prepared, scope.key, scope.forgotten))


@register_store
class SourceImageFolder(CountedOnly):
    """The team's image folder (prepare.image_folder.path), like the source table: counted, never deleted."""

    name = "source image folder"

    def verify(self, scope: Scope) -> list[Finding]:
        return as_findings(source_folder_checks(scope.prepared, scope.key, scope.forgotten))
