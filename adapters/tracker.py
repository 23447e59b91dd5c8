"""The project's MLflow tracker from its params (adapters/tracking.py's `Tracker`): the tracking URI, the
experiment and where a local store keeps its artifacts. Here, below tasks/ and flows/, so a stage opens the
tracker the flows open (tests/unit/test_import_rules.py: core <- adapters <- tasks <- flows). MLflow is imported
only when a tracker is made: importing this module stays cheap for the read-only commands."""

from __future__ import annotations

from pathlib import Path

from unlearning.config import Params, is_tracking_server


def tracker_for(params: Params):
    return tracker_at(params.mlflow_tracking_uri(), params.tracking.experiment, params.path("mlflow_artifacts"))


def tracker_at(uri: str, experiment: str, artifacts: Path):
    """The tracker of the store at `uri` (params.mlflow_tracking_uri()), the runs in `experiment`; a local store
    keeps its artifacts in `artifacts` (base.paths.mlflow_artifacts). What a stage holding the slices, not the
    params, opens (tasks/stores/base.py ErasureSettings.tracker)."""
    from adapters.tracking import Tracker

    # Against a tracking server the server stores the artifacts (mlflow-artifacts:/): a local folder here would
    # make each client write to its own disk.
    local = None if is_tracking_server(uri) else artifacts
    if local is None:  # the first call of a flow to the server: a missing login is one line, not a 401 traceback
        from adapters.server_auth import mlflow_login_problem
        from adapters.tracking import TrackingUnavailable

        problem = mlflow_login_problem(uri)
        if problem:
            raise TrackingUnavailable(problem)
    return Tracker(uri, experiment, local)
