"""Logins to the team's servers (`make team-up`, docs/operations.md "Accounts and threat model"), from the
client's environment: MLflow's basic-auth app (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD) and Prefect's
shared auth string (PREFECT_API_AUTH_STRING, "user:password"). Stdlib only: asked before MLflow or Prefect is
imported, so a missing login is one line naming the server and the variable, not an HTTP 401 traceback from
inside a flow. Both servers answer their health checks without a login, so the checks here ask an endpoint that
needs one."""

from __future__ import annotations

import base64
import os
import ssl
import urllib.error
import urllib.request

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
