"""Logins to the team's servers from the client's side (adapters/server_auth.py) and the secrets of deploy/team.py,
against a tiny local HTTP server that answers 401 like both servers do (the real servers: the slow
tests/e2e/test_team_deployment.py)."""

from __future__ import annotations

import base64
import importlib.util
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adapters.server_auth import mlflow_login_problem, prefect_login_problem
from tests.helpers import ROOT


def serve(expected: str | None):
    """A server answering 200 with the right Basic login `expected` ("user:password"; None: no login needed), 401
    otherwise. Returns (base URL, server)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            sent = self.headers.get("Authorization", "")
            ok = expected is None or sent == "Basic " + base64.b64encode(expected.encode()).decode()
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


@pytest.fixture
def locked():
    url, server = serve("pipeline:s3cret")
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_login_vars(monkeypatch):
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING",
                "MLFLOW_TRACKING_SERVER_CERT_PATH", "PREFECT_API_SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)


def test_mlflow_without_login_names_the_server_and_the_variables(locked, monkeypatch):
    problem = mlflow_login_problem(locked)
    assert problem.startswith(f"MLflow tracking server {locked} requires a login: set MLFLOW_TRACKING_USERNAME "
                              "and MLFLOW_TRACKING_PASSWORD") and "\n" not in problem
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "pipeline")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    problem = mlflow_login_problem(locked)
    assert "rejected the login of MLFLOW_TRACKING_USERNAME=pipeline: check MLFLOW_TRACKING_PASSWORD" in problem
    assert "wrong" not in problem  # the password is never echoed
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
    assert mlflow_login_problem(locked) is None


def test_prefect_without_login_names_the_server_and_the_variable(locked, monkeypatch):
    api = f"{locked}/api"
    assert f"Prefect server {api} requires a login and PREFECT_API_AUTH_STRING is not set" in prefect_login_problem(api)
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "pipeline:wrong")
    problem = prefect_login_problem(api)
    assert "PREFECT_API_AUTH_STRING was rejected" in problem and "wrong" not in problem
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "pipeline:s3cret")
    assert prefect_login_problem(api) is None


def test_a_server_without_logins_or_not_answering_is_no_login_problem():
    url, server = serve(None)
    try:
        assert mlflow_login_problem(url) is None and prefect_login_problem(f"{url}/api") is None
    finally:
        server.shutdown()
        server.server_close()
    assert mlflow_login_problem(url, timeout=2) is None  # gone: the health check reports that, not this


def team_module():
    spec = importlib.util.spec_from_file_location("team", ROOT / "deploy" / "team.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_team_secrets_are_mode_600_and_env_prints_them_by_reference(tmp_path):
    team = team_module()
    t = team.Team(tmp_path / "team", "127.0.0.1", 1, 2, 3)
    first = team.secret(t.prefect_auth_file)
    assert team.secret(t.prefect_auth_file) == first  # made once, then read
    team.write_secret(t.user_file("pipeline"), "pw-" + first)
    for f in (t.prefect_auth_file, t.user_file("pipeline")):
        assert f.stat().st_mode & 0o777 == 0o600
    out = t.env_lines()
    assert first not in out
    assert f'export PREFECT_API_AUTH_STRING="$(cat {t.prefect_auth_file})"' in out.splitlines()
    assert f'export MLFLOW_TRACKING_PASSWORD="$(cat {t.user_file("pipeline")})"' in out.splitlines()
    assert "export MLFLOW_TRACKING_USERNAME=pipeline" in out.splitlines()


def test_team_refuses_to_listen_beyond_loopback_without_tls(tmp_path):
    team = team_module()
    with pytest.raises(team.TeamError, match="refusing to bind to 0.0.0.0 without TLS"):
        team.Team(tmp_path, "0.0.0.0", 1, 2, 3).check_exposure()
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    team.Team(tmp_path, "0.0.0.0", 1, 2, 3, tls_cert=str(cert), tls_key=str(key)).check_exposure()
    team.Team(tmp_path, "127.0.0.1", 1, 2, 3).check_exposure()
    with pytest.raises(team.TeamError, match="go together"):
        team.Team(tmp_path, "127.0.0.1", 1, 2, 3, tls_cert=str(cert)).check_exposure()
