"""Shared flow plumbing: params loading, device, tracker, task runner choice."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from adapters.tracker import tracker_for  # noqa: F401  (below tasks/: the stages open the same tracker)
from unlearning.config import Params, is_tracking_server, resolve_device

log = logging.getLogger("unlearning")


def use_project_path(params: Params) -> None:
    """Put the project folder (the one holding params.yaml) first on sys.path, once, so a custom model
    factory module there (`train.model.factory: mymodels:build`) imports whatever the working directory.
    Every flow calls it right after load_params (and `unlearn` for the commands that load models), so it also
    applies the process-wide progress switch: `base.progress` turns the bars of the unlearning candidates
    (contexts built with progress=None) on or off, and re-keys an older project's salted ids first
    (tasks/rekey.py `ensure_current_key`: before any of them is compared)."""
    from tasks.rekey import ensure_current_key
    from unlearning.progress import set_default

    ensure_current_key(params)  # an older project's salted ids re-keyed once, before any id is compared
    set_default(params.base.progress)
    root = str(params.root)
    if root not in sys.path:
        sys.path.insert(0, root)
        importlib.invalidate_caches()


def params_or_exit(params_path: str) -> str:
    """Stage entry points (`python -m flows.<stage>`, as `dvc repro` runs them) check params.yaml before a
    Prefect server starts: a config error ends the stage at once with one `error:` line and exit code 2."""
    from flows.errors import one_line_errors
    from unlearning.config import load_params

    with one_line_errors():  # a ConfigError: exit 2
        load_params(params_path)
    return params_path


@contextmanager
def prefect_api():
    """The Prefect API for the flows of this process: `PREFECT_API_URL` when one is set (a real server, or
    `make run`'s shared one); otherwise a temporary server that dies with this process. Prefect's own
    temporary server outlives a `kill -9` of the process that started it; this one gets the parent-death
    signal (flows/session.py), so a killed batch leaves no server behind.

    Against a temporary server (this process's, or the one `make run`'s session started) the flows send no
    heartbeats: a heartbeat only serves an automation that marks a silent run crashed, on a server that
    outlives the run; here the server stops with the session. Prefect's heartbeat thread sleeps in 1 s steps
    and each flow waits for it at its end (0.5 s a flow on average). Runs on a started server keep them."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.errors import quiet_known_errors_on_console
    from flows.warm import ENV_TEMPORARY_SERVER, api_ready

    quiet_known_errors_on_console()  # a known error is printed once, as `error:`, not with Prefect's tracebacks
    no_heartbeats = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    url = PREFECT_API_URL.value()
    if url:
        if not api_ready():  # `make run`'s session: its server may still be starting (checked after the params)
            raise SystemExit(1)
        if os.environ.get(ENV_TEMPORARY_SERVER) != url:  # a team server asks for a login: one line without it
            from adapters.server_auth import prefect_login_problem

            problem = prefect_login_problem(url)
            if problem:
                print(f"error: {problem}", file=sys.stderr, flush=True)
                raise SystemExit(1)
        with temporary_settings(updates=no_heartbeats if os.environ.get(ENV_TEMPORARY_SERVER) == url else {}):
            yield url
        return
    from flows.session import start_temporary_server

    # Not stopped when the block ends: at interpreter exit Prefect's log and event services first drain to
    # this server (threading's exit hooks), then the atexit hook Prefect registered stops it. Stopping it here
    # would leave those services retrying against a closed port.
    server = start_temporary_server()
    with temporary_settings(updates={PREFECT_API_URL: server.api_url, **no_heartbeats}):
        yield server.api_url


def device_of(params: Params) -> str:
    return resolve_device(params.base.device)


def task_runner_for(params: Params):
    """Threads (default) or Dask (local cluster, or an existing scheduler address) from params.yaml."""
    v = params.validation
    if v.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if v.dask_address:
            return DaskTaskRunner(address=v.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": v.dask_workers, "processes": True,
                                              "threads_per_worker": 1, "dashboard_address": None})
    from prefect.task_runners import ThreadPoolTaskRunner

    from tasks.planning import THREAD_WORKERS  # the planner sizes chunks to the same pool

    return ThreadPoolTaskRunner(max_workers=THREAD_WORKERS)


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="path of params.yaml (default: ./params.yaml)")
    return p


def ui_hint(params: Params, page: str = "") -> str:
    """How to review a batch in the MLflow UI; `page`: a `#/...` route to open there."""
    return f"Review it in the MLflow UI: {ui_route(params, page)}"


def ui_route(params: Params, page: str = "") -> str:
    """How to open the MLflow UI on this project's store at `page`: a tracking server (the team setup) serves it
    itself; a local store: `unlearn ui` (the page that opens an experiment on its batch runs, adapters/mlflow_ui.py;
    `make ui` calls it), from the project's folder or with its params file."""
    uri = params.mlflow_tracking_uri()
    if is_tracking_server(uri):
        return f"open {uri.rstrip('/')}/{page}"
    here = Path.cwd().resolve() == Path(params.root).resolve()
    command = "unlearn ui" if here else f"unlearn --params {Path(params.root) / 'params.yaml'} ui"
    return f"`{command}`, then open http://127.0.0.1:5000/{page}"


def deletion_run_name() -> str:
    """The Prefect flow run's name of a deletion batch: `deletion <request file>` (`deletion
    2026-11-30T0900_erasure`), so the flow runs read as the requests. A run over the whole inbox is named after
    its first file and how many follow (`deletion 2026-11-30T0900_erasure +2`). Never raises: a name it cannot
    read falls back to `deletion inbox` (a failing name would fail the run before it starts)."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters or {}
    if parameters.get("request_path"):
        return f"deletion {Path(str(parameters['request_path'])).stem}"
    try:
        from unlearning.config import load_params
        from unlearning.requests import scan_inbox

        params = load_params(parameters.get("params_path", "params.yaml"), parameters.get("overrides"))
        pending = scan_inbox(params.path("inbox"))[0]
    except Exception:
        return "deletion inbox"
    if not pending:
        return "deletion inbox (empty)"
    return f"deletion {pending[0].stem}" + (f" +{len(pending) - 1}" if len(pending) > 1 else "")
