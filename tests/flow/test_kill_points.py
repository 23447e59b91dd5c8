"""kill -9 at each step of the promotion path (UNLEARN_FAULT=<point>, os._exit(137) in a subprocess), then
the next run converges to one consistent state: ledger, manifest, registry alias, erasure agree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers import ROOT, make_project

pytestmark = [pytest.mark.flow, pytest.mark.slow]

POINTS = ["before_register", "after_register", "before_commit", "after_commit", "after_alias", "after_erasure"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, prefect_harness):
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from flows.prepare import prepare
    from flows.train import train

    root = tmp_path_factory.mktemp("killed")
    params_path = make_project(root, {"diagnostics": {"enabled": False}})
    prepare(str(params_path))
    train(str(params_path))
    return root


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def run_in_subprocess(params_path, fault: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_API_URL": _api_url(), "OMP_NUM_THREADS": "1"}
    env.pop("UNLEARN_FAULT", None)
    if fault:
        env["UNLEARN_FAULT"] = fault
    code = (f"import sys, torch; torch.set_num_threads(1); sys.path.insert(0, {str(ROOT)!r}); "
            f"from flows.deletion_batch import run; run(None, {str(params_path)!r})")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("point", POINTS)
def test_kill_point_recovers(trained, tmp_path, point):
    from flows.common import tracker_for
    from flows.deletion_batch import run
    from tasks.erasure import verify_erasure
    from unlearning.config import load_params

    root = tmp_path / "p"
    shutil.copytree(trained, root)
    params_path = root / "params.yaml"
    request = next((root / "requests" / "inbox").glob("*.csv"))
    ids = pd.read_csv(request, dtype=str)

    killed = run_in_subprocess(params_path, point)
    assert killed.returncode == 137, killed.stdout[-2000:] + killed.stderr[-3000:]

    results = run(None, str(params_path))  # the next run converges
    assert [r["status"] for r in results] in (["applied"], ["already_processed"])
    params = load_params(params_path)
    tracker = tracker_for(params)
    ledger = [json.loads(l) for l in (root / "state" / "ledger.jsonl").read_text().splitlines()]
    assert sorted(e["request_id"] for e in ledger) == sorted(ids["request_id"])  # exactly once
    champion = json.loads((root / "state" / "champion.json").read_text())
    assert tracker.alias_version(params.tracking.registered_model, params.tracking.alias) == champion["model_version"]
    assert {e["model_version_after"] for e in ledger} == {champion["model_version"]}
    manifest = pd.read_csv(root / "state" / "manifest.csv", dtype=str)
    assert not set(manifest["sample_id"]) & set(ids["sample_id"])
    problems, _ = verify_erasure(params, None, tracker)
    assert problems == []
    running = tracker.client.search_runs([tracker.experiment_id], filter_string="attributes.status = 'RUNNING'")
    assert running == []
    assert not request.exists() and (root / "requests" / "processed" / request.name).exists()
    # and it stays converged
    assert run(None, str(params_path)) == []
