"""Scale-out: a deletion batch whose ensemble chunks run on an EXISTING Dask scheduler (separate scheduler
and worker processes on loopback), selected by validation.task_runner = dask + validation.dask_address."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.e2e.test_operations import free_port, start, stop, wait_for
from tests.helpers import make_project

pytestmark = pytest.mark.slow


def test_batch_through_existing_dask_scheduler(tmp_path):
    import subprocess

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    bindir = Path(sys.executable).parent
    procs = []
    try:
        procs.append(start([str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                            "--no-dashboard"], tmp_path, env, tmp_path / "scheduler.log"))
        wait_for(lambda: "Scheduler at" in (tmp_path / "scheduler.log").read_text(), 60, "the Dask scheduler")
        procs.append(start([str(bindir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "2",
                            "--nthreads", "1", "--no-dashboard"], Path(__file__).resolve().parents[2], env,
                           tmp_path / "worker.log"))
        wait_for(lambda: (tmp_path / "worker.log").read_text().count("Registered to") >= 2, 90, "two Dask workers")
        # do_nothing named explicitly is certified against reference models, whose chunks go to the cluster
        # (the default plan, an exact retrain, trains one model in the flow and no chunk at all)
        params = make_project(tmp_path / "proj", {"validation": {"task_runner": "dask",
                                                                 "dask_address": f"tcp://127.0.0.1:{port}"},
                                                  "diagnostics": {"enabled": False},
                                                  "deletion": {"method": "do_nothing"}})
        code = ("import sys; from flows.prepare import prepare; from flows.train import train; "
                "from flows.deletion_batch import run; p=sys.argv[1]; prepare(p); train(p); "
                "r=run(None, p); print('RESULT', [x['status'] for x in r])")
        res = subprocess.run([sys.executable, "-c", code, str(params)], cwd=Path(__file__).resolve().parents[2],
                             env=env, capture_output=True, text=True, timeout=600)
        assert "RESULT ['applied']" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
        # The task runner connected to the external scheduler (not a local cluster of its own).
        assert f"Connecting to an existing Dask cluster at tcp://127.0.0.1:{port}" in res.stdout + res.stderr
        # the reference chunks ran on the cluster's workers (its scheduler counts the tasks it ran, by prefix)
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout=30) as client:
            ran = client.run_on_scheduler(lambda dask_scheduler: {
                name: sum(p.state_counts.values()) for name, p in dask_scheduler.task_prefixes.items()})
        print("dask task prefixes:", ran)
        assert ran.get("train_ensemble_chunk", 0) >= 2, ran
        assert sum(ran.values()) - ran["train_ensemble_chunk"] <= 12, ran  # the data: a few scattered objects
    finally:
        for p in reversed(procs):
            stop(p)
