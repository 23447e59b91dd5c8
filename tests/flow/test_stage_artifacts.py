"""The deletion flow reads like the pipeline diagram (docs/design.md §1): one Prefect task run per stage, each with
the artifact a reviewer reads in the Prefect UI (selection, the gate verdict, the per-split table, ...)."""

from __future__ import annotations

import inspect
import time

import pytest

from tests.helpers import make_project

pytestmark = pytest.mark.flow

STAGES = ["validate", "diagnose", "partition", "select", "plan", "promote", "erase"]


def test_one_task_run_and_artifact_per_stage(tmp_path, prefect_harness):
    import os

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    from flows.deletion_batch import run
    from flows.prepare import prepare
    from flows.train import train
    from tasks.reporting import artifact_key

    params_path = make_project(tmp_path)
    prepare(str(params_path))
    train(str(params_path))
    [result] = run(None, str(params_path))
    assert result["status"] == "applied"
    method, batch = result["method"], result["batch_id"]

    with get_client(sync_client=True) as client:
        # The batch id hashes the request ids, and other flow tests on this session's server ran the same sample
        # file: this test's run is the newest verdict, and every other artifact is read from that flow run.
        [newest] = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=[artifact_key(f"{batch}-{method}-verdict")])), sort=ArtifactSort.CREATED_DESC, limit=1)
        this_run = FlowRunFilter(id=FlowRunFilterId(any_=[newest.flow_run_id]))

        def artifacts(what: str):
            return client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key(f"{batch}-{what}")])), flow_run_filter=this_run)

        verdict = artifacts(f"{method}-verdict")
        assert verdict and verdict[0].type == "markdown" and "Gate verdict" in verdict[0].data
        assert ("**passed**" in verdict[0].data) or ("**failed**" in verdict[0].data)
        splits = artifacts(f"{method}-splits")
        assert splits and splits[0].type == "table"
        assert {"forget", "adjacent", "remote", "validation"} <= {row["split"] for row in _rows(splits[0].data)}
        selection = artifacts("selection")
        assert selection and f"`{method}`" in selection[0].data
        plan = artifacts("plan")
        assert plan and "models it trains at most: 1 retrain, 0 oracles, 0 shadows" in plan[0].data
        for what in ("validation", "diagnostics", "partition", "promotion", "erasure"):
            assert artifacts(what), f"no {what} artifact"
        # One task run per stage, in the batch's flow run (the verdict artifact belongs to a task run of it).
        flow_run_id = verdict[0].flow_run_id
        assert client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        # Task runs are written by the server's task-run recorder from the client's events, a moment after the
        # flow returned: wait for them (a few seconds at most) instead of reading once.
        deadline = time.monotonic() + 30
        while True:
            names = {t.name for t in client.read_task_runs(task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id])))}
            if all(any(n.startswith(s) for n in names) for s in STAGES) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    for stage in STAGES:
        assert any(n.startswith(stage) for n in names), (stage, sorted(names))
    assert any(n.startswith(f"unlearn-and-certify-{method}") for n in names), sorted(names)
    # the sample batch is an exact retrain: one model, trained inside its candidate's task, no reference chunk
    assert not any(n.startswith("train-ensemble-chunk") for n in names), sorted(names)


def _rows(data):
    import json

    return json.loads(data) if isinstance(data, str) else data


def test_flow_and_stage_functions_fit_on_one_screen():
    """The flow function and each stage stay short (the diagram, not the details)."""
    from flows import deletion_batch as flow_module
    from tasks import stages

    def lines(fn) -> int:
        return len(inspect.getsource(getattr(fn, "fn", fn)).splitlines())

    assert lines(flow_module.deletion_batch) <= 45
    assert lines(flow_module.process_request_file) <= 50
    assert lines(flow_module.plan_and_run) <= 45
    for name in ["validate", "diagnose", "partition", "plan", "select", "unlearn_and_certify", "promote",
                 "erase", "finish"]:
        assert lines(getattr(stages, name)) <= 60, name
