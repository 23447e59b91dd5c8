"""The MLflow stores: the model registry's versions and the runs' artifacts (docs/erasure.md). Both are reached
through the tracking adapter (adapters/tracking.py, the one module that imports mlflow)."""

from __future__ import annotations

from tasks.stores.base import Scope, StoreBase, files_naming, raw_rows_finding, register_store
from unlearning.config import Params
from unlearning.erasure import Finding, Purged
from unlearning.io import read_json_file


def versions_to_keep(params: Params, tracker, champion_version) -> set[str]:
    """The registered versions an erasure keeps: the champion and the `erasure.keep_versions` newest others."""
    others = [v for v in tracker.versions(params.tracking.registered_model) if v != str(champion_version)]
    kept = others[len(others) - params.erasure.keep_versions:] if params.erasure.keep_versions else []
    return {str(champion_version), *kept}


@register_store
class RegistryVersions(StoreBase):
    """The registered model's versions: every one but the champion and the `erasure.keep_versions` newest others
    is deleted with its model artifacts (an older version was trained on the forgotten rows)."""

    name = "MLflow registry"

    def purge(self, scope: Scope) -> list[Purged]:
        if scope.tracker is None:
            return []
        keep = versions_to_keep(scope.params, scope.tracker, scope.champion_version)
        purged = scope.tracker.purge_versions(scope.params.tracking.registered_model, keep)
        return [Purged(self.name, scope.tracker.tracking_uri, {"purged_versions": purged, "kept": sorted(keep)},
                       where_key="uri")]

    def verify(self, scope: Scope) -> list[Finding]:
        if scope.tracker is None or not scope.forgotten:
            return []
        params, tracker = scope.params, scope.tracker
        champion = read_json_file(params.path("state_dir") / "champion.json").get("model_version")
        versions = tracker.versions(params.tracking.registered_model)
        extra = [v for v in versions if v != str(champion)]
        problems = (f"MLflow registry: {len(extra)} version(s) besides the champion v{champion} remain "
                    f"(erasure.keep_versions = {params.erasure.keep_versions}): {extra[:10]}",) \
            if len(extra) > params.erasure.keep_versions else ()
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
        root = scope.params.path("mlflow_artifacts")
        out = raw_rows_finding(self.name, root, scope)
        n = files_naming(root, scope.forgotten) if not scope.hash_ids and scope.forgotten else None
        if n is not None:
            out.append(Finding(self.name, str(root), {"files_naming_forgotten_ids": n}))
        return out
