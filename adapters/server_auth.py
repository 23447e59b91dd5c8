"""Logins to the team's servers (`make team-up`, docs/operations.md "Accounts and threat model").

The client side, from the client's environment: MLflow's basic-auth app (MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD) and Prefect's shared auth string (PREFECT_API_AUTH_STRING, "user:password"). Asked
before MLflow or Prefect is imported, so a missing login is one line naming the server and the variable, not an
HTTP 401 traceback from inside a flow. Both servers answer their health checks without a login, so the checks
here ask an endpoint that needs one.

The server side's policy, which deploy/mlflow_auth.py applies inside the team's MLflow server: which requests only
the admin may make (`admin_only`: every change to accounts, roles, permissions or workspaces, on the 2.0 and 3.0
APIs and the UI's ajax twins), and how failed logins are slowed down (`LoginThrottle`, per account and per
client). Stdlib only, like the rest of this module."""

from __future__ import annotations

import base64
import math
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict, deque

MLFLOW_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
PREFECT_VAR = "PREFECT_API_AUTH_STRING"
HOW = "`eval \"$(make -s team-env)\"` sets the pipeline account's"


def _basic(user_pass: str) -> str:
    return "Basic " + base64.b64encode(user_pass.encode()).decode()


def mlflow_headers() -> dict:
    """The Authorization header MLflow's own client sends from the environment (none without a username)."""
    user, password = (os.environ.get(v) for v in MLFLOW_VARS)
    return {"Authorization": _basic(f"{user}:{password or ''}")} if user else {}


def prefect_headers() -> dict:
    """The Authorization header Prefect's client sends from PREFECT_API_AUTH_STRING (none without it)."""
    auth = os.environ.get(PREFECT_VAR)
    return {"Authorization": _basic(auth)} if auth else {}


def tls_context(cert_var: str) -> ssl.SSLContext | None:
    """The context that trusts the certificate file in `cert_var` (the clients' own variables for a team server
    with a self-signed certificate: MLFLOW_TRACKING_SERVER_CERT_PATH, PREFECT_API_SSL_CERT_FILE), as MLflow's and
    Prefect's clients do; None (the system's CAs) without it."""
    cert = os.environ.get(cert_var)
    return ssl.create_default_context(cafile=cert) if cert else None


def mlflow_tls() -> ssl.SSLContext | None:
    return tls_context("MLFLOW_TRACKING_SERVER_CERT_PATH")


def prefect_tls() -> ssl.SSLContext | None:
    return tls_context("PREFECT_API_SSL_CERT_FILE")


def _status(url: str, headers: dict, timeout: float, context: ssl.SSLContext | None) -> int | None:
    """The HTTP status of a GET, or None when the server does not answer (the health check says why)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout,
                                    context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def mlflow_login_problem(tracking_uri: str, timeout: float = 5.0) -> str | None:
    """Why the MLflow server at `tracking_uri` refuses this client (one line: the server, the variables), or
    None (no login needed, or it is accepted)."""
    url = tracking_uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    if _status(url, mlflow_headers(), timeout, mlflow_tls()) != 401:
        return None
    user = os.environ.get(MLFLOW_VARS[0])
    if not user:
        return (f"MLflow tracking server {tracking_uri} requires a login: set MLFLOW_TRACKING_USERNAME and "
                f"MLFLOW_TRACKING_PASSWORD ({HOW}); nothing was changed")
    return (f"MLflow tracking server {tracking_uri} rejected the login of MLFLOW_TRACKING_USERNAME={user}: check "
            f"MLFLOW_TRACKING_PASSWORD ({HOW}); nothing was changed")


def prefect_login_problem(api_url: str, timeout: float = 5.0) -> str | None:
    """Why the Prefect server at `api_url` refuses this client (one line: the server, the variable), or None."""
    if _status(api_url.rstrip("/") + "/admin/version", prefect_headers(), timeout, prefect_tls()) != 401:
        return None
    state = "is not set" if not os.environ.get(PREFECT_VAR) else "was rejected"
    return (f"Prefect server {api_url} requires a login and {PREFECT_VAR} {state}: set it to the server's "
            f"\"user:password\" ({HOW}); nothing was changed")


# --- the team MLflow server's policy (deploy/mlflow_auth.py applies it) -----------------------------------------------
# MLflow 3.17's auth app lets an account holding MANAGE on a resource grant it (POST /api/3.0/mlflow/users/
# permissions/grant): measured, the pipeline account handed the reviewer MANAGE on the registered model. Accounts,
# roles and permissions are the admin's alone: every path under users/ (but the caller's own `current`), roles/ and
# any `<resource>/permissions`, whatever the method, and every change to workspaces.
_API = r"^/(?:ajax-)?api/[23]\.0/mlflow/"
_ADMIN_ANY_METHOD = re.compile(_API + r"(?:users|roles)(?:/|$)|" + _API + r"(?:[\w-]+/)*permissions(?:/|$)|^/signup/?$")
_ADMIN_CHANGES = re.compile(_API + r"workspaces(?:/|$)")
_SELF_SERVICE = re.compile(_API + r"users/current(?:/permissions)?/?$")


def admin_only(path: str, method: str) -> bool:
    """Whether only the admin may make this request: a change to (or a listing of) accounts, roles or
    permissions, the sign-up page, or a change to workspaces. An account's own `users/current` stays its own."""
    if _SELF_SERVICE.match(path):
        return False
    return bool(_ADMIN_ANY_METHOD.match(path)) or (bool(_ADMIN_CHANGES.match(path)) and method.upper() != "GET")


class LoginThrottle:
    """Failed logins slowed down per account and per client (its address): after `free` failures within `window`
    seconds (`client_free` for a client, which may try many accounts), each further login must wait
    `base` * 2^(failures - free) seconds after the last failure, at most `cap`; a success does not reset the
    count (an attacker guessing the pipeline's password while the pipeline logs in would otherwise never wait):
    failures age out of the window. Thread-safe; at most `max_keys` accounts and clients are remembered (the
    oldest go first), so made-up names cannot fill the memory. During a wait every login of that account or
    client is refused unchecked, the right password too: a check would tell a guess that is right."""

    def __init__(self, free: int = 5, client_free: int = 50, base: float = 1.0, cap: float = 300.0,
                 window: float = 900.0, max_keys: int = 10_000, clock=time.monotonic):
        self.free, self.client_free, self.base, self.cap, self.window = free, client_free, base, cap, window
        self.max_keys, self.clock = max_keys, clock
        self._failures: OrderedDict[tuple[str, str], deque] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, key: tuple[str, str], now: float) -> deque:
        times = self._failures.get(key) or deque()
        while times and now - times[0] > self.window:
            times.popleft()
        return times

    def _wait(self, key: tuple[str, str], free: int, now: float) -> float:
        times = self._recent(key, now)
        if len(times) < free:
            return 0.0
        delay = min(self.cap, self.base * 2 ** (len(times) - free))
        return max(0.0, times[-1] + delay - now)

    def retry_after(self, account: str, client: str) -> float:
        """Seconds this login must wait (0: check it now)."""
        now = self.clock()
        with self._lock:
            return max(self._wait(("account", account), self.free, now),
                       self._wait(("client", client), self.client_free, now))

    def failed(self, account: str, client: str) -> None:
        now = self.clock()
        with self._lock:
            for key in (("account", account), ("client", client)):
                times = self._recent(key, now)
                times.append(now)
                self._failures[key] = times
                self._failures.move_to_end(key)
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)


def retry_after_header(seconds: float) -> str:
    """The Retry-After header's value: whole seconds, rounded up."""
    return str(max(1, math.ceil(seconds)))
