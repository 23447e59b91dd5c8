"""The team deployment (`make team-up`, i.e. deploy/team.py): one deletion batch through a Prefect server and an
MLflow server, both on a project-local PostgreSQL cluster, with the MLflow server serving the artifacts, and both
asking for a login (docs/operations.md, "Accounts and threat model").

Everything runs in a temporary folder on free loopback ports (a developer's `make server`/`make team-up` is left
alone) and is stopped in a `finally`: both servers by their process groups, then the cluster. The checks go
through the servers' REST APIs over plain HTTP, as another team member's machine would see them: anonymously, as
the `reviewer` account (made here with `team.py user`), and as the `pipeline` account that runs the batch."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
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


def http_json(method: str, url: str, expect: int = 200, **kw):
    import httpx

    res = httpx.request(method, url, timeout=30, **kw)
    assert res.status_code == expect, f"{method} {url}: {res.status_code} {res.text[:2000]}"
    return res.json() if expect == 200 else res


def client_env(env_out: str) -> dict:
    """`team.py env`'s lines as a client's variables, each `"$(cat FILE)"` read from its file, as the shell does
    in `eval "$(make -s team-env)"`."""
    out = {}
    for line in env_out.splitlines():
        if line.startswith("export "):
            key, value = line.removeprefix("export ").split("=", 1)
            ref = re.fullmatch(r'"\$\(cat (.+)\)"', value)
            out[key] = Path(ref.group(1)).read_text().strip() if ref else value
    return out


def secrets_of(folder: Path) -> dict:
    """Every secret the deployment generated, by file (the Prefect string without its fixed user part)."""
    files = [folder / n for n in ("pg.password", "prefect.auth", "mlflow-admin.password", "mlflow-flask.key")]
    files += sorted((folder / "users").glob("*.password"))
    return {f: f.read_text().strip().split(":", 1)[-1] for f in files}


@contextmanager
def deployment(*extra: str):
    """`team.py up` in a temporary folder on free ports (with `extra` arguments), stopped in a `finally`.
    Yields (folder, ports, env, the `up` result)."""
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
        up = subprocess.run([*TEAM, "--dir", str(folder), *args, *extra, "up"], env=env, capture_output=True,
                            text=True, timeout=420)
        assert up.returncode == 0, f"team up failed:\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}"
        print(f"team up: {time.monotonic() - t0:.1f} s")
        yield base, folder, ports, env, up
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
def team():
    with deployment() as (base, folder, ports, env, up):
        client = client_env(up.stdout)
        assert set(client) == {"PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_AUTH_STRING",
                               "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
        assert client["MLFLOW_TRACKING_USERNAME"] == "pipeline"
        # `make -s team-env` prints the same variables, by reference to the files
        env_out = subprocess.run([*TEAM, "--dir", str(folder), "env"], env=env, capture_output=True, text=True,
                                 timeout=60).stdout
        assert client_env(env_out) == client
        user = subprocess.run([*TEAM, "--dir", str(folder), "user", "--name", "reviewer", "--role", "reviewer"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert user.returncode == 0, f"team user failed:\n{user.stdout[-4000:]}\n{user.stderr[-4000:]}"
        reviewer = ("reviewer", (folder / "users" / "reviewer.password").read_text().strip())
        outputs = {"team up": up.stdout + up.stderr, "team env": env_out, "team user": user.stdout + user.stderr}
        yield {"base": base, "dir": folder, "env": env, "client": client, "ports": ports, "reviewer": reviewer,
               "outputs": outputs}


def tracking_cost(timings: Path, requests: Path) -> dict:
    """The deletion stage's tracking seconds (adapters/clock.py's records) and its MLflow requests (adapters/tracking.py
    `count_request`: HTTP requests to the server, store calls of the tracker). Measured, not asserted: the target
    (at most 10 s) is the bench's (bench/session_overhead.py)."""
    records = [json.loads(line) for line in timings.read_text().splitlines() if line.strip()]
    from collections import Counter

    lines = [line.split("\t") for line in requests.read_text().splitlines()]
    http = Counter(what for label, kind, what in lines if label == "deletion" and kind == "http")
    calls = Counter(what for label, kind, what in lines if label == "deletion" and kind == "call")
    return {"tracking_s": round(sum(r["tracking_s"] for r in records if r["label"] == "deletion"), 2),
            "http_requests": sum(http.values()), "most": http.most_common(8),
            "tracker_calls": sum(calls.values()), "calls": calls.most_common(10),
            "largest": [x for r in records if r["label"] == "deletion" for x in r.get("largest", [])]}


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
    timings, requests = base / "timings.jsonl", base / "mlflow-requests.tsv"
    t0 = time.monotonic()
    out = sh([sys.executable, "-m", "dvc", "repro", "deletion"], proj,
             {**env, "UNLEARN_TIMINGS": str(timings), "UNLEARN_MLFLOW_REQUESTS": str(requests)})
    print(f"dvc repro deletion through the team servers: {time.monotonic() - t0:.1f} s")
    assert "promoted" in out
    team["outputs"]["tracking"] = tracking_cost(timings, requests)
    print(f"the team batch's tracking (deletion stage): {team['outputs']['tracking']}")
    team["outputs"]["dvc repro"] = out
    ledger = [json.loads(l) for l in (proj / "state" / "ledger.jsonl").read_text().splitlines()]
    mlflow = team["client"]["MLFLOW_TRACKING_URI"]
    # Read as the reviewer: the account that may only look sees the batch
    exp = http_json("GET", f"{mlflow}/api/2.0/mlflow/experiments/get-by-name", auth=team["reviewer"],
                    params={"experiment_name": params["tracking"]["experiment"]})["experiment"]
    runs = http_json("POST", f"{mlflow}/api/2.0/mlflow/runs/search", auth=team["reviewer"],
                     json={"experiment_ids": [exp["experiment_id"]],
                           "filter": "tags.stage = 'deletion_batch'"}).get("runs", [])
    prefect_auth = tuple(team["client"]["PREFECT_API_AUTH_STRING"].split(":", 1))
    return {"proj": proj, "env": env, "params": params, "ledger": ledger, "mlflow": mlflow, "experiment": exp,
            "runs": runs, "prefect": team["client"]["PREFECT_API_URL"], "reviewer": team["reviewer"],
            "prefect_auth": prefect_auth}


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
    listed = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/artifacts/list", auth=batch["reviewer"],
                       params={"run_id": run["info"]["run_id"]}).get("files", [])
    names = {f["path"] for f in listed}
    assert names, "the batch run has no artifacts on the server"
    one = next(f["path"] for f in listed if not f["is_dir"])
    import httpx

    got = httpx.get(f"{batch['mlflow']}/get-artifact", params={"run_id": run["info"]["run_id"], "path": one},
                    auth=batch["reviewer"], timeout=30)
    assert got.status_code == 200 and got.content
    # The bytes live in the server's artifact destination; the client wrote no artifact folder.
    stored = [p for p in (team["dir"] / "artifacts").rglob("*") if p.is_file()]
    assert any(p.name == Path(one).name for p in stored), one
    assert not (batch["proj"] / "mlartifacts").exists() or not any((batch["proj"] / "mlartifacts").rglob("*.*"))


def test_champion_alias_points_at_the_new_version(batch):
    name, alias = batch["params"]["tracking"]["registered_model"], batch["params"]["tracking"]["alias"]
    version = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/registered-models/alias", auth=batch["reviewer"],
                        params={"name": name, "alias": alias})["model_version"]
    versions = http_json("GET", f"{batch['mlflow']}/api/2.0/mlflow/model-versions/search", auth=batch["reviewer"],
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
    runs = http_json("POST", f"{prefect}/flow_runs/filter", auth=batch["prefect_auth"],
                     json={"flows": {"name": {"any_": ["prepare", "train", "deletion_batch"]}}, "limit": 50})
    flows = {f["id"]: f["name"] for f in http_json("POST", f"{prefect}/flows/filter", auth=batch["prefect_auth"],
                                                   json={"limit": 50})}
    states = {}
    for r in runs:
        states.setdefault(flows[r["flow_id"]], []).append(r["state_type"])
    assert states.get("deletion_batch") == ["COMPLETED"], states
    assert states.get("prepare") == ["COMPLETED"] and states.get("train") == ["COMPLETED"], states


def test_anonymous_requests_get_401(batch):
    import httpx

    (run,) = batch["runs"]
    run_id, mlflow, prefect = run["info"]["run_id"], batch["mlflow"], batch["prefect"]
    name, alias = batch["params"]["tracking"]["registered_model"], batch["params"]["tracking"]["alias"]
    asks = [("GET", f"{mlflow}/", {}),  # the UI
            ("GET", f"{mlflow}/api/2.0/mlflow/experiments/search", {"params": {"max_results": 1}}),
            ("GET", f"{mlflow}/api/2.0/mlflow/runs/get", {"params": {"run_id": run_id}}),
            ("GET", f"{mlflow}/api/2.0/mlflow/registered-models/alias", {"params": {"name": name, "alias": alias}}),
            ("GET", f"{mlflow}/get-artifact", {"params": {"run_id": run_id, "path": "description.md"}}),
            ("POST", f"{mlflow}/api/2.0/mlflow/runs/delete", {"json": {"run_id": run_id}}),
            ("POST", f"{prefect}/flow_runs/filter", {"json": {"limit": 1}}),
            ("GET", f"{prefect}/admin/version", {})]
    for n, (method, url, kw) in enumerate(asks):
        # no login, and a wrong one (an account of its own each time: the fifth failure of one account is slowed)
        for auth in (None, (f"probe-{n}", "not-the-password")):
            got = httpx.request(method, url, timeout=30, auth=auth, **kw)
            assert got.status_code == 401, f"{method} {url} (auth {auth and auth[0]}): {got.status_code}"
    assert httpx.get(f"{prefect}/flows/filter", auth=("team", "wrong"), timeout=30).status_code == 401


def test_reviewer_reads_but_cannot_promote_or_delete(batch):
    (run,) = batch["runs"]
    run_id, mlflow, rev = run["info"]["run_id"], batch["mlflow"], batch["reviewer"]
    name, alias = batch["params"]["tracking"]["registered_model"], batch["params"]["tracking"]["alias"]
    assert http_json("GET", f"{mlflow}/api/2.0/mlflow/runs/get", auth=rev,
                     params={"run_id": run_id})["run"]["info"]["run_id"] == run_id
    version = http_json("GET", f"{mlflow}/api/2.0/mlflow/registered-models/alias", auth=rev,
                        params={"name": name, "alias": alias})["model_version"]["version"]
    got = http_json("GET", f"{mlflow}/api/2.0/mlflow/model-versions/get", auth=rev,
                    params={"name": name, "version": version})["model_version"]
    assert got["name"] == name and got["version"] == version
    # promote (move the alias), delete the run, delete the version: refused
    http_json("POST", f"{mlflow}/api/2.0/mlflow/registered-models/alias", expect=403, auth=rev,
              json={"name": name, "alias": alias, "version": version})
    http_json("POST", f"{mlflow}/api/2.0/mlflow/registered-models/alias", expect=403, auth=rev,
              json={"name": name, "alias": "reviewed", "version": version})
    http_json("POST", f"{mlflow}/api/2.0/mlflow/runs/delete", expect=403, auth=rev, json={"run_id": run_id})
    http_json("DELETE", f"{mlflow}/api/2.0/mlflow/model-versions/delete", expect=403, auth=rev,
              json={"name": name, "version": version})
    # and nothing changed
    assert http_json("GET", f"{mlflow}/api/2.0/mlflow/runs/get", auth=rev,
                     params={"run_id": run_id})["run"]["info"]["lifecycle_stage"] == "active"
    model = http_json("GET", f"{mlflow}/api/2.0/mlflow/registered-models/get", auth=rev,
                      params={"name": name})["registered_model"]
    assert {a["alias"]: a["version"] for a in model.get("aliases", [])} == {alias: version}


def test_a_client_without_login_gets_one_line(batch):
    """Each server's first contact: one `error:` line naming the server and the variable, no traceback, and no
    state changed."""
    proj, env = batch["proj"], batch["env"]
    ledger_before = (proj / "state" / "ledger.jsonl").read_bytes()
    cases = [(["MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"], ["-m", "flows.cli", "erase"],
              f"MLflow tracking server {batch['mlflow']} requires a login: set MLFLOW_TRACKING_USERNAME"),
             (["PREFECT_API_AUTH_STRING"], ["-m", "flows.prepare"],
              f"Prefect server {batch['prefect']} requires a login and PREFECT_API_AUTH_STRING is not set")]
    for drop, args, expected in cases:
        res = subprocess.run([sys.executable, *args], cwd=proj, capture_output=True, text=True, timeout=300,
                             env={k: v for k, v in env.items() if k not in drop})
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert res.returncode != 0 and len(errors) == 1 and expected in errors[0], (args, res.stderr[-3000:])
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert (proj / "state" / "ledger.jsonl").read_bytes() == ledger_before


def test_no_secret_in_logs_ps_or_team_json(batch, team):
    folder = team["dir"]
    found = secrets_of(folder)
    assert len(found) >= 6 and all(found.values()), sorted(f.name for f in found)  # 4 + pipeline, reviewer
    for f in [*found, folder / "mlflow-auth.ini"]:
        assert f.stat().st_mode & 0o777 == 0o600, f"{f} is mode {oct(f.stat().st_mode & 0o777)}"
    cmdlines = []  # what `ps` shows every user: each process's command line (read while both servers run)
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdlines.append(p.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    assert any("basic-auth" in c for c in cmdlines), "the MLflow server does not run its auth app"
    texts = {"ps": "\n".join(cmdlines), "team.json": (folder / "team.json").read_text(), **team["outputs"]}
    for log in [*folder.glob("*.log"), folder / "pg" / "postgres.log"]:
        texts[log.name] = log.read_text(errors="replace")
    for where, text in texts.items():
        for f, value in found.items():
            assert value not in text, f"the secret of {f.name} appears in {where}"
    # The auth app's users and permissions live on the team's PostgreSQL, not in a SQLite file
    assert not [p for p in folder.rglob("*.db")], sorted(folder.rglob("*.db"))
    users = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(team["ports"]["--pg-port"]), "-U", "team", "-d",
                            "mlflow_auth", "-tAc", "SELECT username FROM users ORDER BY username"],
                           env={**team["env"], "PGPASSWORD": (folder / "pg.password").read_text().strip()},
                           capture_output=True, text=True, timeout=60)
    assert {"admin", "pipeline", "reviewer"} <= set(users.stdout.split()), users.stdout + users.stderr


def test_binding_beyond_loopback_needs_tls(tmp_path):
    folder = tmp_path / "team"
    res = subprocess.run([*TEAM, "--dir", str(folder), "--host", "0.0.0.0", "up"], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("TEAM_")})
    assert res.returncode == 1 and "refusing to bind to 0.0.0.0 without TLS" in res.stderr, res.stderr
    assert not folder.exists()  # nothing started, nothing written


def test_tls_deployment_serves_https_with_logins(tmp_path, monkeypatch):
    """With a certificate both servers speak HTTPS only (the way `team-up` allows binding beyond loopback), the
    logins still hold, and the project's login checks trust the certificate from the clients' variables."""
    import httpx

    if shutil.which("openssl") is None:  # Debian's ca-certificates brings it
        pytest.skip("the openssl command is not installed (`apt-get install -y openssl`)")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=120)
    with deployment("--tls-cert", str(cert), "--tls-key", str(key)) as (base, folder, ports, env, up):
        client = client_env(up.stdout)
        mlflow, prefect = client["MLFLOW_TRACKING_URI"], client["PREFECT_API_URL"]
        assert mlflow.startswith("https://") and prefect.startswith("https://"), client
        assert client["MLFLOW_TRACKING_SERVER_CERT_PATH"] == client["PREFECT_API_SSL_CERT_FILE"] == str(cert)
        search = f"{mlflow}/api/2.0/mlflow/experiments/search"
        login = (client["MLFLOW_TRACKING_USERNAME"], client["MLFLOW_TRACKING_PASSWORD"])
        assert httpx.get(search, params={"max_results": 1}, verify=str(cert), timeout=30).status_code == 401
        assert httpx.get(search, params={"max_results": 1}, auth=login, verify=str(cert), timeout=30).status_code == 200
        prefect_login = tuple(client["PREFECT_API_AUTH_STRING"].split(":", 1))
        assert httpx.get(f"{prefect}/admin/version", verify=str(cert), timeout=30).status_code == 401
        assert httpx.get(f"{prefect}/admin/version", auth=prefect_login, verify=str(cert),
                         timeout=30).status_code == 200
        for url in (search.replace("https://", "http://"), f"{prefect}/admin/version".replace("https://", "http://")):
            with pytest.raises(httpx.HTTPError):  # no plain HTTP on either port
                httpx.get(url, timeout=10).raise_for_status()
        from adapters.server_auth import prefect_login_problem
        from adapters.store_check import tracking_store_problem

        for var in ("MLFLOW_TRACKING_SERVER_CERT_PATH", "PREFECT_API_SSL_CERT_FILE"):
            monkeypatch.setenv(var, client[var])
        for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING"):
            monkeypatch.delenv(var, raising=False)
        assert "requires a login: set MLFLOW_TRACKING_USERNAME" in (tracking_store_problem(mlflow) or "")
        assert "PREFECT_API_AUTH_STRING is not set" in (prefect_login_problem(prefect) or "")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
        monkeypatch.setenv("PREFECT_API_AUTH_STRING", client["PREFECT_API_AUTH_STRING"])
        assert tracking_store_problem(mlflow) is None and prefect_login_problem(prefect) is None


def test_rotation_changes_a_password_on_the_server_and_in_its_file(team):
    """`team.py rotate` for the admin, then for an account of its own (the other tests' accounts stay as they are):
    the old password gets 401, the new one (only in its mode-600 file, never printed) works."""
    import httpx

    folder, env = team["dir"], team["env"]
    search = f"{team['client']['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search"

    def status(user, password):
        return httpx.get(search, params={"max_results": 1}, auth=(user, password), timeout=30).status_code

    def team_py(*args):
        res = subprocess.run([*TEAM, "--dir", str(folder), *args], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, f"{args}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        return res.stdout + res.stderr

    admin_file = folder / "mlflow-admin.password"
    old_admin = admin_file.read_text().strip()
    out = team_py("rotate", "--name", "admin")
    new_admin = admin_file.read_text().strip()
    assert new_admin != old_admin and new_admin not in out and admin_file.stat().st_mode & 0o777 == 0o600
    assert status("admin", old_admin) == 401 and status("admin", new_admin) == 200
    team_py("user", "--name", "rotated", "--role", "reviewer")  # the admin's calls use its new password
    account = folder / "users" / "rotated.password"
    old = account.read_text().strip()
    out = team_py("rotate", "--name", "rotated")
    new = account.read_text().strip()
    assert new != old and new not in out and account.stat().st_mode & 0o777 == 0o600
    assert status("rotated", old) == 401 and status("rotated", new) == 200


def test_only_the_admin_changes_accounts_roles_and_permissions_on_every_endpoint(batch, team):
    """Both API generations and the UI's ajax twins (tests/unit/test_team_login_policy.py lists the routes of MLflow
    3.17's auth app): `pipeline` (MANAGE on the project's experiment and model) and `reviewer` get 403 on every one;
    nothing changed (the reviewer still cannot move the alias)."""
    import httpx

    from tests.unit.test_team_login_policy import ADMIN_ROUTES

    mlflow, name = batch["mlflow"], batch["params"]["tracking"]["registered_model"]
    accounts = {"pipeline": (batch["env"]["MLFLOW_TRACKING_USERNAME"], batch["env"]["MLFLOW_TRACKING_PASSWORD"]),
                "reviewer": batch["reviewer"]}
    grant = {"username": "reviewer", "resource_type": "registered_model", "resource_id": name,
             "permission": "MANAGE", "experiment_id": batch["experiment"]["experiment_id"], "name": name,
             "password": "x" * 24, "is_admin": True, "role_name": "owners"}
    answers = {}
    for path, method in ADMIN_ROUTES:
        for who, login in accounts.items():
            got = httpx.request(method, f"{mlflow}{path}", auth=login, timeout=30,
                                **({"params": grant} if method == "GET" else {"json": grant}))
            answers[(who, method, path)] = got.status_code
    assert {k: v for k, v in answers.items() if v != 403} == {}, "not refused"
    http_json("POST", f"{mlflow}/api/2.0/mlflow/registered-models/alias", expect=403, auth=batch["reviewer"],
              json={"name": name, "alias": "promoted-by-reviewer", "version": "1"})
    admin = ("admin", (team["dir"] / "mlflow-admin.password").read_text().strip())
    users = http_json("GET", f"{mlflow}/api/2.0/mlflow/users/get", auth=admin, params={"username": "reviewer"})
    assert not users["user"].get("is_admin"), users  # the admin still can, and nobody made the reviewer one


def test_the_team_folder_and_the_artifacts_are_the_owners_alone(batch, team):
    """umask 077 for everything the deployment and its servers create: folders 0700 (the team folder 0711 when
    PostgreSQL runs as its own user), files 0600, the champion's weights in the artifact store included."""
    folder = team["dir"]
    top = stat.S_IMODE(folder.stat().st_mode)
    assert top in (0o700, 0o711), oct(top)
    wide = [f"{p.relative_to(folder)} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in folder.rglob("*")
            if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert wide == []
    artifacts = [p for p in (folder / "artifacts").rglob("*") if p.is_file()]
    assert len(artifacts) > 20 and any(p.name == "ensemble.pt" for p in artifacts)


def test_failed_logins_are_throttled_and_an_unknown_account_costs_a_check(batch):
    """Per account: the sixth wrong login within the window gets 429 with Retry-After (the right password too while
    it waits: tests/unit/test_team_login_policy.py). The seconds of a wrong login for a real account and for an unknown one are printed (measured: a test
    asserts no duration; tests/unit/test_team_login_policy.py checks that an unknown account's check is made)."""
    import httpx

    search = f"{batch['mlflow']}/api/2.0/mlflow/experiments/search"

    def ask(user, password):
        t0 = time.perf_counter()
        got = httpx.get(search, params={"max_results": 1}, auth=(user, password), timeout=60)
        return got, time.perf_counter() - t0

    ask("nobody-at-all", "wrong-password")  # the server's first check of an unknown name makes its dummy hash
    known = sorted(ask("reviewer", "wrong-password")[1] for _ in range(3))
    unknown = sorted(ask("nobody-at-all", "wrong-password")[1] for _ in range(3))
    print(f"a wrong login (median of 3): {known[1] * 1000:.0f} ms for an account, {unknown[1] * 1000:.0f} ms for an "
          f"unknown name")
    answers = [ask("mallory", "guess")[0] for _ in range(6)]
    assert [a.status_code for a in answers] == [401] * 5 + [429]
    assert int(answers[-1].headers["Retry-After"]) >= 1  # the wait doubles with each failure after it
    assert ask(*batch["reviewer"])[0].status_code == 200  # another account, the same client: not slowed
