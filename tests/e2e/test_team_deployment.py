"""The team deployment (`make team-up`, i.e. deploy/team.py): one deletion batch through a Prefect server and an
MLflow server, both on a project-local PostgreSQL cluster, with the MLflow server serving the artifacts.

Everything runs in a temporary folder on free loopback ports (a developer's `make server`/`make team-up` is left
alone) and is stopped in a `finally`: both servers by their process groups, then the cluster. The checks go
through the servers' REST APIs over plain HTTP, as another team member's machine would see them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_dvc_repro import copy_project, sh
from tests.e2e.test_operations import free_port
from tests.helpers import FAST, ROOT

# Skipped only off CI: .ci/run installs PostgreSQL, so there a missing server fails the test instead.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("CI") and shutil.which("initdb") is None
    and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")),
    reason="PostgreSQL server binaries not installed (`apt-get install -y postgresql`; .ci/run does)")]

TEAM = [sys.executable, str(ROOT / "deploy" / "team.py")]


def team_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("team", ROOT / "deploy" / "team.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def http_json(method: str, url: str, **kw):
    import httpx

    res = httpx.request(method, url, timeout=30, **kw)
    assert res.status_code == 200, f"{method} {url}: {res.status_code} {res.text[:2000]}"
    return res.json()


@pytest.fixture(scope="module")
def team():
    # Not pytest's tmp_path: its parents are mode 700, and PostgreSQL runs as the `postgres` user under root.
    base = Path(tempfile.mkdtemp(prefix="team-e2e-"))
    base.chmod(0o755)
    folder = base / "team"
    ports = {"--pg-port": free_port(), "--prefect-port": free_port(), "--mlflow-port": free_port()}
    args = [a for k, v in ports.items() for a in (k, str(v))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING", "TEAM_"))}
    env.update({"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"})
    t0 = time.monotonic()
    try:
        up = subprocess.run([*TEAM, "--dir", str(folder), *args, "up"], env=env, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, f"team up failed:\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}"
        print(f"team up: {time.monotonic() - t0:.1f} s")
        client = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
                      if line.startswith("export "))
        assert set(client) == {"PREFECT_API_URL", "MLFLOW_TRACKING_URI"}
        yield {"base": base, "dir": folder, "env": env, "client": client, "ports": ports}
    finally:
        down = subprocess.run([*TEAM, "--dir", str(folder), "down"], env=env, capture_output=True, text=True,
                              timeout=120)
        for name in ("prefect", "mlflow"):  # `down` failed half way: stop what it started, by its own pid files
            pid_file = folder / f"{name}.pid"
            if pid_file.exists():
                try:
                    os.killpg(int(pid_file.read_text()), 9)
                except (ProcessLookupError, ValueError):
                    pass
        if (folder / "pg" / "data" / "postmaster.pid").exists():
            mod = team_module()
            subprocess.run(mod.as_pg([mod.pg_bin("pg_ctl"), "-D", str(folder / "pg" / "data"), "-m", "immediate",
                                      "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        assert down.returncode == 0, f"team down failed:\n{down.stdout}\n{down.stderr}"


@pytest.fixture(scope="module")
def batch(team, tmp_path_factory):
    """prepare -> train -> one deletion batch (the sample inbox file) with both servers as the only stores."""
    base = tmp_path_factory.mktemp("team-client")
    proj = base / "proj"
    copy_project(proj)
    from unlearning.config import deep_merge

    params = deep_merge(yaml.safe_load((proj / "params.yaml").read_text()), FAST)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**team["env"], **team["client"], "PREFECT_HOME": str(base / "prefect-client"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "copy"]):
        sh(["git", "-c", "user.email=t@localhost", "-c", "user.name=t", *args], proj, env)
    t0 = time.monotonic()
    out = sh([sys.executable, "-m", "dvc", "repro", "deletion"], proj, env)
    print(f"dvc repro deletion through the team servers: {time.monotonic() - t0:.1f} s")
    assert "promoted" in out
    ledger = [json.loads(l) for l in (proj / "state" / "ledger.jsonl").read_text().splitlines()]
    mlflow = team["client"]["MLFLOW_TRACKING_URI"]
    exp = http_json("GET", f"{mlflow}/api/2.0/mlflow/experiments/get-by-name",
                    params={"experiment_name": params["tracking"]["experiment"]})["experiment"]
    runs = http_json("POST", f"{mlflow}/api/2.0/mlflow/runs/search",
                     json={"experiment_ids": [exp["experiment_id"]],
                           "filter": "tags.stage = 'deletion_batch'"}).get("runs", [])
    return {"proj": proj, "env": env, "params": params, "ledger": ledger, "mlflow": mlflow, "experiment": exp,
            "runs": runs, "prefect": team["client"]["PREFECT_API_URL"]}


def test_batch_run_with_metrics_on_the_server(batch):
    assert len(batch["ledger"]) == 12 and {e["verdict"] for e in batch["ledger"]} == {"passed"}
    (run,) = batch["runs"]
    assert run["info"]["status"] == "FINISHED"
    metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
    assert metrics.get("n_forgotten") == 12 and metrics.get("wall_seconds", 0) > 0, sorted(metrics)
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    assert tags.get("gate") == "passed" and tags.get("method")
    # The client kept no store of its own: no SQLite database beside the project.
    assert not (batch["proj"] / "mlflow.db").exists()


def test_artifacts_are_served_by_the_mlflow_server(batch, team):
    (run,) = batch["runs"]
    # Proxied artifact access: the experiment and run point at mlflow-artifacts:/, not at a path on a client.
    assert batch["experiment"]["artifact_location"].startswith("mlflow-artifacts:"), batch["experiment"]
    assert run["info"]["artifact_uri"].startswith("mlflow-artifacts:"), run["info"]["artifact_uri"]
    listed = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/artifacts/list",
                       params={"run_id": run["info"]["run_id"]}).get("files", [])
    names = {f["path"] for f in listed}
    assert names, "the batch run has no artifacts on the server"
    one = next(f["path"] for f in listed if not f["is_dir"])
    import httpx

    got = httpx.get(f"{batch['mlflow']}/get-artifact", params={"run_id": run["info"]["run_id"], "path": one},
                    timeout=30)
    assert got.status_code == 200 and got.content
    # The bytes live in the server's artifact destination; the client wrote no artifact folder.
    stored = [p for p in (team["dir"] / "artifacts").rglob("*") if p.is_file()]
    assert any(p.name == Path(one).name for p in stored), one
    assert not (batch["proj"] / "mlartifacts").exists() or not any((batch["proj"] / "mlartifacts").rglob("*.*"))


def test_champion_alias_points_at_the_new_version(batch):
    name, alias = batch["params"]["tracking"]["registered_model"], batch["params"]["tracking"]["alias"]
    version = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/registered-models/alias",
                        params={"name": name, "alias": alias})["model_version"]
    versions = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/model-versions/search",
                         params={"filter": f"name = '{name}'"})["model_versions"]
    assert version["version"] == str(max(int(v["version"]) for v in versions))
    assert str(batch["ledger"][0]["model_version_after"]) == version["version"]
    (run,) = batch["runs"]
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    assert tags.get("model_version") == version["version"]
    # The model's files are on the server too (its source is a proxied or registry URI, not a client path).
    assert version["source"].startswith(("mlflow-artifacts:", "models:/", "runs:/")), version["source"]
    # Erasure purged the original's version (erasure.keep_versions = 0) together with its files on the server.
    assert [v["version"] for v in versions] == [version["version"]]
    [report] = [json.loads(f.read_text()) for f in (batch["proj"] / "state" / "erasure").glob("*.json")]
    [registry] = [s for s in report["stores"] if s["store"] == "MLflow registry"]
    assert registry["purged_versions"] and all(v["artifacts_removed"] for v in registry["purged_versions"]), registry


def test_flow_runs_completed_on_the_prefect_server(batch):
    prefect = batch["prefect"]
    runs = http_json("POST", f"{prefect}/flow_runs/filter",
                     json={"flows": {"name": {"any_": ["prepare", "train", "deletion_batch"]}}, "limit": 50})
    flows = {f["id"]: f["name"] for f in http_json("POST", f"{prefect}/flows/filter", json={"limit": 50})}
    states = {}
    for r in runs:
        states.setdefault(flows[r["flow_id"]], []).append(r["state_type"])
    assert states.get("deletion_batch") == ["COMPLETED"], states
    assert states.get("prepare") == ["COMPLETED"] and states.get("train") == ["COMPLETED"], states
