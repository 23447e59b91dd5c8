"""The team MLflow server's login policy (adapters/server_auth.py) and check (adapters/tracking.py
`team_authenticate`): only the admin changes accounts, roles and permissions, on every route MLflow 3.17's auth app
serves for them; failed logins are throttled per account and per client; an unknown account costs a password
check like a known one. tests/e2e/test_team_deployment.py tries the same against the real servers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from adapters.server_auth import LoginThrottle, admin_only, retry_after_header

# Every route MLflow 3.17.2's auth app adds for accounts, roles, permissions and workspaces (its url_map, read
# after `create_app`), with the legacy 2.0 permission paths older clients call. Each must be the admin's alone.
ADMIN_ROUTES = [(f"/{api}/{v}/mlflow/{path}", method) for api in ("api", "ajax-api") for v, path, method in [
    ("2.0", "users/create", "POST"), ("2.0", "users/get", "GET"), ("2.0", "users/list", "GET"),
    ("2.0", "users/update-password", "PATCH"), ("2.0", "users/update-admin", "PATCH"), ("2.0", "users/delete", "DELETE"),
    ("3.0", "users/permissions/grant", "POST"), ("3.0", "users/permissions/revoke", "POST"),
    ("3.0", "users/permissions/get", "GET"), ("3.0", "users/permissions/list", "GET"),
    ("3.0", "users/roles/list", "GET"), ("3.0", "roles/create", "POST"), ("3.0", "roles/get", "GET"),
    ("3.0", "roles/list", "GET"), ("3.0", "roles/update", "PATCH"), ("3.0", "roles/delete", "DELETE"),
    ("3.0", "roles/permissions/add", "POST"), ("3.0", "roles/permissions/remove", "DELETE"),
    ("3.0", "roles/permissions/update", "PATCH"), ("3.0", "roles/permissions/list", "GET"),
    ("3.0", "roles/assign", "POST"), ("3.0", "roles/unassign", "DELETE"), ("3.0", "roles/users/list", "GET"),
    ("3.0", "workspaces", "POST"), ("3.0", "workspaces/team", "PATCH"), ("3.0", "workspaces/team", "DELETE"),
    ("2.0", "experiments/permissions/create", "POST"), ("2.0", "experiments/permissions/update", "PATCH"),
    ("2.0", "experiments/permissions/delete", "DELETE"), ("2.0", "registered-models/permissions/create", "POST"),
    ("2.0", "registered-models/permissions/update", "PATCH"), ("2.0", "registered-models/permissions/delete", "DELETE"),
]] + [("/api/2.0/mlflow/users/create-ui", "POST"), ("/signup", "GET")]
# What an account does on its own (the UI's header asks who is logged in) and the pipeline's work
OWN_ROUTES = [("/api/2.0/mlflow/users/current", "GET"), ("/ajax-api/3.0/mlflow/users/current/permissions", "GET"),
              ("/api/3.0/mlflow/workspaces", "GET"), ("/api/2.0/mlflow/runs/search", "POST"),
              ("/api/2.0/mlflow/registered-models/alias", "POST"), ("/api/2.0/mlflow-artifacts/artifacts/x", "PUT"),
              ("/api/2.0/mlflow/runs/log-batch", "POST")]


@pytest.mark.parametrize("path, method", ADMIN_ROUTES)
def test_changing_accounts_roles_or_permissions_is_the_admins_alone(path, method):
    assert admin_only(path, method)


@pytest.mark.parametrize("path, method", OWN_ROUTES)
def test_an_account_keeps_its_own_requests(path, method):
    assert not admin_only(path, method)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_failed_logins_wait_longer_and_longer_per_account_and_per_client():
    clock = Clock()
    t = LoginThrottle(free=3, client_free=5, base=1.0, cap=8.0, window=60.0, clock=clock)
    for _ in range(3):
        assert t.retry_after("pipeline", "10.0.0.9") == 0
        t.failed("pipeline", "10.0.0.9")
    assert t.retry_after("pipeline", "10.0.0.9") == 1.0  # the 4th try waits 1 s after the 3rd failure
    assert t.retry_after("pipeline", "10.0.0.1") == 1.0  # from any client: the account is throttled
    assert t.retry_after("reviewer", "10.0.0.9") == 0  # another account from that client: not yet
    clock.now += 1.0
    t.failed("pipeline", "10.0.0.9")
    assert t.retry_after("pipeline", "10.0.0.2") == 2.0  # doubled
    t.failed("reviewer", "10.0.0.9")
    assert t.retry_after("admin", "10.0.0.9") == 1.0  # the client's 5th failure, over any accounts
    for _ in range(10):
        t.failed("pipeline", "10.0.0.3")
    assert t.retry_after("pipeline", "10.0.0.4") == 8.0  # never more than `cap`
    clock.now += 61.0
    assert t.retry_after("pipeline", "10.0.0.9") == 0  # failures age out of the window
    assert retry_after_header(0.2) == "1" and retry_after_header(7.01) == "8"


def test_made_up_names_cannot_fill_the_memory():
    t = LoginThrottle(max_keys=50, clock=Clock())
    for i in range(1000):
        t.failed(f"guess-{i}", "10.0.0.9")
    assert len(t._failures) == 50


# --- adapters/tracking.py team_authenticate, around a fake auth app ----------------------------------------------
class FakeStore:
    def __init__(self):
        self.users = {"admin": True, "pipeline": False, "reviewer": False}

    def has_user(self, name):
        return name in self.users

    def get_user(self, name):
        return SimpleNamespace(username=name, is_admin=self.users[name])


@pytest.fixture()
def server(monkeypatch):
    """team_authenticate inside a Flask request, its auth app faked: passwords are `<name>-pw`; the dummy hash's
    checks are counted."""
    from flask import Flask, Response
    import werkzeug.security

    from adapters import tracking

    checks = []
    real_check = werkzeug.security.check_password_hash
    monkeypatch.setattr(werkzeug.security, "check_password_hash",
                        lambda h, pw: checks.append(h) or real_check(h, pw))
    fake = SimpleNamespace(store=FakeStore(), make_basic_auth_response=lambda: Response("login", status=401),
                           _authenticate_cached=lambda u, pw: object() if pw == f"{u}-pw" else None)
    monkeypatch.setattr(tracking, "_auth_app", lambda: fake)
    monkeypatch.setattr(tracking, "_LOGINS", {})
    app = Flask("test")

    def ask(path, method, user, password, client="10.0.0.9"):
        import base64

        header = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
        with app.test_request_context(path, method=method, headers=header, environ_base={"REMOTE_ADDR": client}):
            got = tracking.team_authenticate()
        return got.status_code if isinstance(got, Response) else 200  # the Authorization: let through

    return SimpleNamespace(ask=ask, checks=checks, tracking=tracking)


def test_only_the_admin_passes_on_a_permission_route(server):
    grant = "/api/3.0/mlflow/users/permissions/grant"
    assert server.ask(grant, "POST", "pipeline", "pipeline-pw") == 403
    assert server.ask(grant, "POST", "reviewer", "reviewer-pw") == 403
    assert server.ask(grant, "POST", "admin", "admin-pw") == 200
    assert server.ask("/api/2.0/mlflow/runs/search", "POST", "pipeline", "pipeline-pw") == 200
    assert server.ask(grant, "POST", "pipeline", "wrong") == 401  # a wrong login is a 401 first


def test_an_unknown_account_costs_a_password_check_like_a_known_one(server):
    assert server.ask("/api/2.0/mlflow/runs/search", "POST", "nobody", "guess") == 401
    dummy = server.tracking._LOGINS["dummy"]
    assert server.checks == [dummy]  # the dummy hash was checked: the same slow hash a real account's costs
    assert dummy.startswith(("scrypt:", "pbkdf2:"))  # werkzeug's default method, as MLflow's store hashes


def test_too_many_failed_logins_get_429_even_with_the_right_password(server):
    for _ in range(5):
        assert server.ask("/api/2.0/mlflow/runs/search", "POST", "pipeline", "guess") == 401
    assert server.ask("/api/2.0/mlflow/runs/search", "POST", "pipeline", "guess") == 429
    assert server.ask("/api/2.0/mlflow/runs/search", "POST", "pipeline", "pipeline-pw") == 429  # unchecked
    assert server.ask("/api/2.0/mlflow/runs/search", "POST", "reviewer", "reviewer-pw") == 200  # others unaffected


def test_a_request_is_checked_once_and_a_cached_login_needs_no_query(server, monkeypatch):
    """MLflow asks the login function several times per request: the check runs once (the request's flask.g); a
    login its credential cache holds as checked needs no database query."""
    import base64
    import threading

    from flask import Flask

    tracking = server.tracking
    fake = tracking._auth_app()
    asked = []
    has_user = fake.store.has_user
    monkeypatch.setattr(fake.store, "has_user", lambda name: asked.append(name) or has_user(name))
    header = {"Authorization": "Basic " + base64.b64encode(b"pipeline:pipeline-pw").decode()}
    with Flask("t").test_request_context("/api/2.0/mlflow/runs/search", method="POST", headers=header):
        first, second = tracking.team_authenticate(), tracking.team_authenticate()
    assert first is second and asked == ["pipeline"]
    fake._USER_AUTH_CACHE, fake._USER_AUTH_CACHE_LOCK = {("pipeline", "k"): object()}, threading.Lock()
    fake._auth_cache_key = lambda user, password: (user, "k" if password == "pipeline-pw" else "other")
    assert tracking.team_password_ok("pipeline", "pipeline-pw") and asked == ["pipeline"]  # no query
    assert not tracking.team_password_ok("pipeline", "wrong") and asked == ["pipeline", "pipeline"]


def test_the_tracker_counts_its_requests_and_still_pickles(tmp_path, monkeypatch):
    """UNLEARN_MLFLOW_REQUESTS: one line per store call (bench/session_overhead.py sums them per stage); a run's
    tags are one call; the counting client crosses a Dask task graph (pickled) like MLflow's own."""
    import pickle

    from adapters.tracking import REQUESTS_ENV, Tracker

    log = tmp_path / "requests.tsv"
    monkeypatch.setenv(REQUESTS_ENV, str(log))
    monkeypatch.setenv("UNLEARN_TIMING_LABEL", "deletion")
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "count", tmp_path / "art")
    run = tracker.start_run("x")
    before = len(log.read_text().splitlines())
    tracker.set_tags(run, {f"t{i}": i for i in range(30)})
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    assert lines[before:] == [["deletion", "call", "log_batch"]]  # 30 tags, one call
    assert all(kind == "call" for _, kind, _ in lines)  # a local store: no HTTP request
    copy = pickle.loads(pickle.dumps(tracker.client))
    assert copy.get_run(run).data.tags["t29"] == "29"
