"""The MLflow stores: the model registry's versions and the runs' artifacts (docs/erasure.md). Both are reached
through the tracking adapter (adapters/tracking.py, the one module that imports mlflow)."""

from __future__ import annotations

from tasks.stores.base import (
    Scope, StoreBase, files_naming, raw_rows_finding, register_store, unreadable_finding,
)
from unlearning.config import Erasure, Tracking
from unlearning.privacy.erasure import Finding, Purged
from unlearning.io import read_json_file


def versions_to_keep(tracking: Tracking, erasure: Erasure, tracker, champion_version) -> set[str]:
    """The registered versions an erasure keeps: the champion and the `erasure.keep_versions` newest others."""
    others = [v for v in tracker.versions(tracking.registered_model) if v != str(champion_version)]
    kept = others[len(others) - erasure.keep_versions:] if erasure.keep_versions else []
    return {str(champion_version), *kept}


@register_store
class RegistryVersions(StoreBase):
    """The registered model's versions: every one but the champion and the `erasure.keep_versions` newest others
    is deleted with its model artifacts (an older version was trained on the forgotten rows)."""

    name = "MLflow registry"

    def purge(self, scope: Scope) -> list[Purged]:
        if scope.tracker is None:
            return []
        name = scope.settings.tracking.registered_model
        keep = versions_to_keep(scope.settings.tracking, scope.settings.erasure, scope.tracker, scope.champion_version)
        sources = scope.tracker.version_sources(name, [v for v in scope.tracker.versions(name) if v not in keep])
        purged = scope.tracker.purge_versions(name, keep)
        # the batch runs' pages linked these versions (404 now): they drop the link and say it was erased
        scope.tracker.unlink_deleted_versions(name, {p["version"]: sources.get(p["version"], {}) for p in purged},
                                              "deleted by an erasure: trained on rows erased since")
        return [Purged(self.name, scope.tracker.tracking_uri, {"purged_versions": purged, "kept": sorted(keep)},
                       where_key="uri")]

    def verify(self, scope: Scope) -> list[Finding]:
        if scope.tracker is None or not scope.forgotten:
            return []
        settings, tracker = scope.settings, scope.tracker
        champion = read_json_file(settings.paths.path("state_dir") / "champion.json").get("model_version")
        versions = tracker.versions(settings.tracking.registered_model)
        extra = [v for v in versions if v != str(champion)]
        problems = (f"MLflow registry: {len(extra)} version(s) besides the champion v{champion} remain "
                    f"(erasure.keep_versions = {settings.erasure.keep_versions}): {extra[:10]}",) \
            if len(extra) > settings.erasure.keep_versions else ()
        return [Finding(self.name, tracker.tracking_uri, {"versions": versions}, problems, where_key="uri")]


@register_store
class MLflowArtifacts(StoreBase):
    """The runs' artifacts (base.paths.mlflow_artifacts): searched for the forgotten rows' bytes (.npy files). The
    model artifacts of purged versions go with the registry's purge; a batch's tables (per-sample KLoM, leverage,
    partition) name ids, hashed with deletion.hash_sample_ids, plain otherwise: then they are counted as
    references (the review's and the audit's), not problems."""

    name = "MLflow artifacts"

    def purge(self, scope: Scope) -> list[Purged]:
        return []  # nothing of its own: the versions' artifacts are deleted by the registry's purge

    def verify(self, scope: Scope) -> list[Finding]:
        root = scope.settings.paths.path("mlflow_artifacts")
        out, unreadable = raw_rows_finding(self.name, root, scope), []
        n = files_naming(root, scope.forgotten, unreadable=unreadable) if not scope.hash_ids and scope.forgotten \
            else None
        if n is not None:
            out.append(Finding(self.name, str(root), {"files_naming_forgotten_ids": n}))
        return out + ([] if any(f.counts.get("unreadable") for f in out) else
                      unreadable_finding(self.name, root, unreadable))


def batch_page_after_erasure(tracker, report: dict) -> None:
    """The batch run's page says what the erasure did, once it did: its description's erasure line (written by
    the batch, "pending" inside `dvc repro`) is replaced by the report's (done, with the stores), and the run is
    tagged `erasure` = done or pending. A run without a description (an older batch's) gets the tag only."""
    from unlearning.batch.summary import ERASURE_LINE, erasure_line

    run_id = report["run_id"]
    text = tracker.description(run_id)
    if ERASURE_LINE in text:
        head, _, rest = text.partition(ERASURE_LINE)
        tail = rest.split("\n", 1)[1] if "\n" in rest else ""
        tracker.set_description(run_id, head + erasure_line(report) + ("\n" + tail if tail else "\n"))
    tracker.set_tags(run_id, {"erasure": "pending" if report.get("pending") else "done"})
