"""`unlearn serve` at its start marks runs a dead serve left Running as Crashed (flows/serve.py,
crash_orphaned_runs), on the shared Prefect test server.

Found by a fault sweep: after serve and its flow-run process were both killed (kill -9: a host crash, the OOM
killer), the dead run stayed Running for good and held the deployment's concurrency slot for its 300 s lease,
so the next triggered run waited ~5 minutes, 12 times "Aborted submission"."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import make_project
from unlearning.config import load_params

pytestmark = pytest.mark.flow


async def _running_run(deployment_name: str):
    """A flow run of `deletion_batch`'s deployment, forced to Running as a serve's run would be."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from flows.deletion_batch import deletion_batch

    async with get_client() as client:
        flow_id = await client.create_flow_from_name(deletion_batch.name)
        deployment_id = await client.create_deployment(flow_id=flow_id, name=deployment_name)
        run = await client.create_flow_run_from_deployment(deployment_id)
        await client.set_flow_run_state(run.id, Running(), force=True)
        return run.id


async def _state_of(run_id):
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return (await client.read_flow_run(run_id)).state


def test_runs_left_running_are_crashed_at_start_unless_a_batch_holds_the_lock(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    from flows.serve import CRASHED_MESSAGE, crash_orphaned_runs
    from tasks.state import batch_lock

    params = load_params(make_project(tmp_path, inbox_files=False))
    url = PREFECT_API_URL.value()
    run_id = asyncio.run(_running_run("on-request-file"))
    other_id = asyncio.run(_running_run("someone-elses-deployment"))
    with batch_lock(params.project_paths, 5):  # a batch is running (another serve, `unlearn run`): its runs are alive
        assert crash_orphaned_runs(url, params) == []
    assert asyncio.run(_state_of(run_id)).type.value == "RUNNING"
    names = crash_orphaned_runs(url, params)
    state = asyncio.run(_state_of(run_id))
    assert len(names) == 1 and state.type.value == "CRASHED" and state.message == CRASHED_MESSAGE
    assert asyncio.run(_state_of(other_id)).type.value == "RUNNING"  # not one of this project's deployments
    assert crash_orphaned_runs(url, params) == []  # nothing left to mark
