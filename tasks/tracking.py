"""MLflow tracking: the ONLY module of the project that imports mlflow.

Runs are addressed by id through `MlflowClient`, never through the thread-local "active run", because
Prefect tasks run in worker threads where the flow's active run is invisible (STACK_NOTES: MLflow).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import tempfile
from pathlib import Path

import mlflow
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

PIP_REQUIREMENTS = ["torch==2.13.0"]  # given explicitly: inferring them costs ~10 s per model


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, artifact_root: str | Path | None = None):
        self.tracking_uri = tracking_uri
        mlflow.set_tracking_uri(tracking_uri)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            location = Path(artifact_root).resolve().as_uri() if artifact_root else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id

    # runs -------------------------------------------------------------------------------------
    def start_run(self, name: str, parent_id: str | None = None, tags: dict | None = None) -> str:
        tags = dict(tags or {})
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def end_run(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED))

    def set_tags(self, run_id: str, tags: dict) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    # values -----------------------------------------------------------------------------------
    def log_params(self, run_id: str, params: dict) -> None:
        for k, v in _flatten(params).items():
            self.client.log_param(run_id, k, json.dumps(v) if isinstance(v, (list, tuple)) else str(v)[:6000])

    def log_metrics(self, run_id: str, metrics: dict, step: int | None = None) -> None:
        for k, v in _flatten(metrics).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                self.client.log_metric(run_id, k.replace("/", "."), float(v), step=step or 0)

    # artifacts --------------------------------------------------------------------------------
    def log_json(self, run_id: str, obj, artifact_file: str) -> None:
        self.client.log_text(run_id, json.dumps(obj, indent=2, sort_keys=True, default=str), artifact_file)

    def log_table(self, run_id: str, df, artifact_file: str) -> None:
        buf = io.StringIO()
        df.to_csv(buf, index=False)
        self.client.log_text(run_id, buf.getvalue(), artifact_file)

    def log_figure(self, run_id: str, fig, artifact_file: str) -> None:
        self.client.log_figure(run_id, fig, artifact_file)

    def log_file(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    # models -----------------------------------------------------------------------------------
    def log_model(self, run_id: str, model, registered_name: str) -> str:
        """Log the torch module to the run, register it, return the new registry version."""
        import mlflow.pytorch

        with mlflow.start_run(run_id=run_id, nested=True):
            info = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle",
                                            pip_requirements=PIP_REQUIREMENTS, registered_model_name=registered_name)
        logging.getLogger().setLevel(logging.WARNING)  # importing mlflow.pytorch set the root level to ERROR
        return str(info.registered_model_version)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def set_version_tags(self, name: str, version: str, tags: dict) -> None:
        for k, v in tags.items():
            self.client.set_model_version_tag(name, version, k, str(v))

    def alias_version(self, name: str, alias: str) -> str | None:
        try:
            return str(self.client.get_model_version_by_alias(name, alias).version)
        except Exception:  # no such model or alias yet
            return None

    def run_url_hint(self, run_id: str) -> str:
        return f"#/experiments/{self.experiment_id}/runs/{run_id}"


def reset_alias(tracking_uri: str, name: str, alias: str, version: str | None = None) -> tuple[str | None, str | None]:
    """Point `name@alias` at `version`, or remove the alias when `version` is None (`unlearn reset`).
    Returns (version before, version after); creates no experiment and no registered model."""
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        before = str(client.get_model_version_by_alias(name, alias).version)
    except Exception:  # no such model or alias
        before = None
    if version is not None:
        client.set_registered_model_alias(name, alias, str(version))
        return before, str(version)
    if before is not None:
        client.delete_registered_model_alias(name, alias)
    return before, None


def load_registered_model(tracking_uri: str, name: str, alias: str):
    import mlflow.pytorch

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.pytorch.load_model(f"models:/{name}@{alias}")
