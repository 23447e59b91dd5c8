"""`unlearn serve`: unattended operation on a real Prefect server.

Two deployments of `deletion_batch`:
- `scheduled`: a cron schedule from params.yaml (operations.cron, in operations.timezone) processes every pending
  request file;
- `on-request-file`: a DeploymentEventTrigger starts a run for each `deletion.request.created` event.
A watcher thread emits that event for every inbox entry that appears or changes, once it has stopped
changing for `operations.inbox_settle_seconds`, and at its start for every entry already waiting there (left
by a stopped serve, a crashed run or a file that changed while it was processed). Entries that are no
request files are announced too: their run moves them to requests/rejected/ with the reason, at once rather
than at the next schedule. Both deployments run with concurrency limit 1 and the batch lock, so batches
never overlap, triggered runs are taken in arrival order, and the ledger makes sure nothing is processed
twice.

The watcher refuses to start without a reachable server: without PREFECT_API_URL, events would go to a
temporary server where no trigger listens (STACK_NOTES: Prefect).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from flows.common import base_parser, task_runner_for
from unlearning.config import Params, load_params

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


def is_announced(path: Path) -> bool:
    """Every inbox entry but dot-files (the temporary names of atomic drops, .gitkeep): a request file is
    processed, anything else is moved to requests/rejected/ with its reason by the run it triggers."""
    return not path.name.startswith(".")


def emit_request_event(path: Path) -> None:
    from prefect.events import emit_event

    emit_event(event=EVENT, resource={"prefect.resource.id": f"deletion.request.{path.name}",
                                      # the inbox path as given, not resolved: a symlink stays a symlink
                                      "path": str(path.parent.resolve() / path.name)})


def _signature(path: Path) -> tuple | None:
    """What tells a changing entry: (size, mtime), None once it is gone (moved out by a run)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


class SettledEntries:
    """Inbox entries waiting to be announced: an entry is ready once its size and mtime have not changed for
    `settle_seconds`, so a file written in pieces is announced after its last write, not at its first."""

    def __init__(self, settle_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.settle, self.clock = settle_seconds, clock
        self.waiting: dict[Path, tuple[float, tuple | None]] = {}

    def touch(self, path: Path) -> None:
        if is_announced(path):
            self.waiting[path] = (self.clock(), _signature(path))

    def ready(self) -> list[Path]:
        """The settled entries, in name order (arrival order), removed from the waiting set."""
        now, out = self.clock(), []
        for path, (since, sig) in sorted(self.waiting.items()):
            current = _signature(path)
            if current is None:
                del self.waiting[path]  # gone: moved out by a run, or deleted
            elif current != sig:
                self.waiting[path] = (now, current)  # still changing: the clock starts again
            elif now - since >= self.settle:
                del self.waiting[path]
                out.append(path)
        return out


def watch_inbox(inbox: Path, stop: threading.Event, settle_seconds: float = 2.0,
                announce: Callable[[Path], None] = emit_request_event,
                ready_to_announce: Callable[[], bool] = lambda: True) -> None:
    """Announce every inbox entry that is already there at the start, and every one that appears or changes,
    once it has settled; in name order. `ready_to_announce` holds the announcements back until the trigger
    deployment exists (an event sent before it reaches no trigger). Wakes every 0.5 s to check the settle
    times. Dropping files atomically (write a dot-file, then rename) is still the way to drop them: a writer
    that pauses longer than the settle time gets its file processed in parts (each part applied once: the
    flow leaves a file that changed while it was processed in the inbox, and this announces it again)."""
    from watchfiles import watch

    entries = SettledEntries(settle_seconds)
    for path in sorted(inbox.iterdir()):
        entries.touch(path)
    deployed = False
    for changes in watch(inbox, stop_event=stop, recursive=False, yield_on_timeout=True, rust_timeout=500):
        for _, p in changes:
            entries.touch(Path(p))
        deployed = deployed or ready_to_announce()
        if not deployed:
            continue
        for path in entries.ready():
            print(f"watcher: {path.name} -> {EVENT}", flush=True)
            announce(path)


def trigger_deployment_exists(url: str) -> Callable[[], bool]:
    """True once the server has the `on-request-file` deployment (`serve` registers it after the watcher
    started). Checked at most once a second."""
    import httpx

    last = [0.0]

    def check() -> bool:
        if time.monotonic() - last[0] < 1.0:
            return False
        last[0] = time.monotonic()
        try:
            return httpx.get(f"{url}/deployments/name/deletion_batch/on-request-file", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def cron_schedule(params: Params):
    """operations.cron read in operations.timezone (an IANA name such as Europe/Berlin): "0 2 * * *" is 02:00
    local time there, daylight saving included. A bare `cron=` would read it in UTC. Both are checked when
    params.yaml loads (unlearning/config.py)."""
    from prefect.schedules import Cron

    return Cron(params.operations.cron, timezone=params.operations.timezone)


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
    watcher = threading.Thread(target=watch_inbox, daemon=True, name="inbox-watcher",
                               args=(inbox, stop, params.operations.inbox_settle_seconds, emit_request_event,
                                     trigger_deployment_exists(url)))
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
