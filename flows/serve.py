"""`unlearn serve`: unattended operation on a real Prefect server.

Two deployments of `deletion_batch`:
- `scheduled`: a cron schedule from params.yaml (operations.cron, in operations.timezone) processes every pending
  request file;
- `on-request-file`: a DeploymentEventTrigger starts a run for each `deletion.request.created` event.
A watcher thread emits that event for every request file that appears in the inbox. Both deployments run
with concurrency limit 1 and the batch lock, so batches never overlap, triggered runs are taken in
arrival order, and the ledger makes sure nothing is processed twice.

The watcher refuses to start without a reachable server: without PREFECT_API_URL, events would go to a
temporary server where no trigger listens (STACK_NOTES: Prefect).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from flows.common import base_parser, task_runner_for
from unlearning.config import Params, load_params
from unlearning.requests import REQUEST_SUFFIXES

EVENT = "deletion.request.created"


class ServerUnavailable(RuntimeError):
    pass


def require_server() -> str:
    """The Prefect API URL, checked reachable; raises ServerUnavailable with what to do otherwise."""
    import httpx

    url = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not url:
        raise ServerUnavailable("PREFECT_API_URL is not set. Start a server (`make server`) and export "
                                "PREFECT_API_URL=http://127.0.0.1:4200/api; events sent without it reach no trigger.")
    try:
        ok = httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError as e:
        ok, why = False, str(e)
    else:
        why = "health check failed"
    if not ok:
        raise ServerUnavailable(f"Prefect server at {url} is not reachable ({why}); start it with `make server`.")
    return url


def is_request_file(path: Path) -> bool:
    return path.suffix in REQUEST_SUFFIXES and not path.name.startswith(".")


def emit_request_event(path: Path) -> None:
    from prefect.events import emit_event

    emit_event(event=EVENT, resource={"prefect.resource.id": f"deletion.request.{path.name}",
                                      "path": str(path.resolve())})


def watch_inbox(inbox: Path, stop: threading.Event) -> None:
    """Emit one event per request file added to the inbox, in file-name order within a change batch.
    Drop files atomically (write a dot-file, then rename) so a half-written file is never announced."""
    from watchfiles import Change, watch

    for changes in watch(inbox, stop_event=stop, recursive=False):
        added = sorted(Path(p) for c, p in changes if c == Change.added and is_request_file(Path(p)))
        for path in added:
            print(f"watcher: {path.name} -> {EVENT}", flush=True)
            emit_request_event(path)


def cron_schedule(params: Params):
    """operations.cron read in operations.timezone (an IANA name such as Europe/Berlin): "0 2 * * *" is 02:00
    local time there, daylight saving included. A bare `cron=` would read it in UTC."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from prefect.schedules import Cron

    tz = params.operations.timezone
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"operations.timezone: {tz!r} is not an IANA time zone name (UTC, Europe/Berlin, "
                         f"America/New_York, ...)") from None
    return Cron(params.operations.cron, timezone=tz)


def deployments(params: Params, params_path: str):
    from prefect.events import DeploymentEventTrigger

    from flows.deletion_batch import deletion_batch

    flow_ = deletion_batch.with_options(task_runner=task_runner_for(params))
    params_path = str(Path(params_path).resolve())
    scheduled = flow_.to_deployment(
        name="scheduled", schedule=cron_schedule(params), concurrency_limit=1,
        parameters={"params_path": params_path, "dvc_commit": True},
        description="Process every pending request file in the inbox on a schedule.")
    triggered = flow_.to_deployment(
        name="on-request-file", concurrency_limit=1,
        triggers=[DeploymentEventTrigger(expect={EVENT}, match={"prefect.resource.id": "deletion.request.*"},
                                         parameters={"request_path": "{{ event.resource.path }}",
                                                     "params_path": params_path, "dvc_commit": True})],
        description="Process one request file when it lands in the inbox.")
    return scheduled, triggered


def main(params_path: str = "params.yaml") -> int:
    params = load_params(params_path)
    url = require_server()
    from prefect import serve

    inbox = params.path("inbox")
    inbox.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    watcher = threading.Thread(target=watch_inbox, args=(inbox, stop), daemon=True, name="inbox-watcher")
    watcher.start()
    print(f"serving deletion_batch on {url}: schedule '{params.operations.cron}' ({params.operations.timezone}) and inbox trigger on {inbox}", flush=True)
    try:
        # pause_on_shutdown=False: the schedule stays active on the server across serve restarts.
        serve(*deployments(params, params_path), pause_on_shutdown=False)
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(base_parser(__doc__).parse_args().params))
