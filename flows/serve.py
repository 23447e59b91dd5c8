"""`unlearn serve`: unattended operation on a real Prefect server.

Two deployments of `deletion_batch`:
- `scheduled`: a cron schedule from params.yaml (operations.cron, in operations.timezone) processes every pending
  request file;
- `on-request-file`: a DeploymentEventTrigger starts a run for each `deletion.request.created` event.
A watcher thread emits that event for every inbox entry that appears or changes, once it has stopped
changing for `operations.inbox_settle_seconds`, and at its start for every entry already waiting there (left
by a stopped serve, a crashed run or a file that changed while it was processed). Entries that are no
request files are announced too: their run moves them to requests/rejected/ with the reason, at once rather
than at the next schedule. An announced entry still in the inbox once no run of the deployments is live (its
event was lost while the server was down, its run failed: a store outage, a kill) is announced again after
`operations.inbox_retry_seconds`, then after twice as long each time, up to an hour; while the server does not
answer, entries wait and the watcher says so once. Both deployments run with concurrency limit 1 and the
batch lock, so batches never overlap, triggered runs are taken in arrival order, and the ledger makes sure
nothing is processed twice (a repeated announcement is a no-op).

At its start serve marks runs of its deployments that are still Running or Pending as Crashed when no batch
holds the batch lock: their process died with a previous serve (a host crash, the OOM killer, kill -9), and
each held the deployment's concurrency slot for its 300 s lease.

The watcher refuses to start without a reachable server: without PREFECT_API_URL, events would go to a
temporary server where no trigger listens (STACK_NOTES: Prefect).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from pathlib import Path
from typing import Callable

from adapters.server_auth import prefect_headers, prefect_login_problem, prefect_tls
from flows.common import base_parser, task_runner_for
from unlearning.config import Params, load_params

EVENT = "deletion.request.created"


class ServerUnavailable(RuntimeError):
    pass


def _login() -> dict:
    """httpx's arguments for a team server: its login (PREFECT_API_AUTH_STRING) and certificate, as Prefect's
    client sends them (adapters/server_auth.py)."""
    return {"headers": prefect_headers(), "verify": prefect_tls() or True}


def require_server() -> str:
    """The Prefect API URL, checked reachable; raises ServerUnavailable with what to do otherwise."""
    import httpx

    url = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not url:
        raise ServerUnavailable("PREFECT_API_URL is not set. Start a server (`make server`) and export "
                                "PREFECT_API_URL=http://127.0.0.1:4200/api; events sent without it reach no trigger.")
    try:
        ok = httpx.get(f"{url}/health", **_login(), timeout=5).status_code == 200
    except httpx.HTTPError as e:
        ok, why = False, str(e)
    else:
        why = "health check failed"
    if not ok:
        raise ServerUnavailable(f"Prefect server at {url} is not reachable ({why}); start it with `make server`.")
    problem = prefect_login_problem(url)
    if problem:
        raise ServerUnavailable(problem)
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


MAX_RETRY_SECONDS = 3600.0  # the longest wait between two announcements of an entry that stays in the inbox


class Retries:
    """Announced entries that may need announcing again: due `first_s` after their announcement, then after
    twice as long each time (at most an hour, or `first_s` if that is longer), while they stay in the inbox
    unchanged. An entry that leaves (applied, rejected) is forgotten; one that changes is announced afresh
    by the settle path, and its wait starts again at `first_s`."""

    def __init__(self, first_s: float, clock: Callable[[], float] = time.monotonic):
        self.first, self.cap, self.clock = first_s, max(MAX_RETRY_SECONDS, first_s), clock
        self.pending: dict[Path, tuple[float, float, tuple | None]] = {}  # path -> (due at, wait, signature)

    def announced(self, path: Path, fresh: bool) -> None:
        previous = None if fresh else self.pending.get(path)
        wait = self.first if previous is None else min(previous[1] * 2, self.cap)
        self.pending[path] = (self.clock() + wait, wait, _signature(path))

    def due(self) -> list[Path]:
        now, out = self.clock(), []
        for path, (at, _wait, sig) in sorted(self.pending.items()):
            if _signature(path) != sig:  # gone, or changed: nothing to retry here
                del self.pending[path]
            elif now >= at:
                out.append(path)
        return out


def watch_inbox(inbox: Path, stop: threading.Event, settle_seconds: float = 2.0,
                announce: Callable[[Path], None] = emit_request_event,
                ready_to_announce: Callable[[], bool] = lambda: True, retry_seconds: float = 60.0,
                runs_live: Callable[[], bool | None] = lambda: False) -> None:
    """Announce every inbox entry that is already there at the start, and every one that appears or changes,
    once it has settled; in name order. `ready_to_announce` holds the announcements back until the trigger
    deployment exists (an event sent before it reaches no trigger) and while the server does not answer (an
    event sent then is lost: Prefect drops what it cannot deliver); the watcher says once that entries wait,
    and once that the server answers again. An entry still in the inbox `retry_seconds` after its
    announcement (`Retries`) is announced again when `runs_live()` is False: no run of the deployments is
    scheduled, pending or running that could still take it (None: unknown, try later). Wakes every 0.5 s.
    Dropping files atomically (write a dot-file, then rename) is still the way to drop them: a writer that
    pauses longer than the settle time gets its file processed in parts (each part applied once: the flow
    leaves a file that changed while it was processed in the inbox, and this announces it again)."""
    from watchfiles import watch

    entries, retries = SettledEntries(settle_seconds), Retries(retry_seconds)
    for path in sorted(inbox.iterdir()):
        entries.touch(path)
    fresh: set[Path] = set()  # settled entries not announced yet
    deployed = waiting_said = False
    for changes in watch(inbox, stop_event=stop, recursive=False, yield_on_timeout=True, rust_timeout=500):
        for _, p in changes:
            entries.touch(Path(p))
        deployed = deployed or ready_to_announce()  # from here on a failed check is an outage, not the start
        fresh.update(entries.ready())
        due = retries.due()
        again = set(due) - fresh if due and runs_live() is False else set()
        fresh = {p for p in fresh if _signature(p) is not None}  # moved out before it was announced
        if not (fresh or again):
            continue
        if not ready_to_announce():
            if deployed and not waiting_said:  # before the first deployment check passes: serve is starting
                waiting_said = True
                print(f"watcher: the Prefect server does not answer: {len(fresh | again)} inbox entr(ies) wait, "
                      f"announced once it answers again", flush=True)
            continue
        if waiting_said:
            waiting_said = False
            print("watcher: the Prefect server answers again", flush=True)
        for path in sorted(fresh | again):
            print(f"watcher: {path.name} -> {EVENT}" + ("" if path in fresh else
                  " (again: still in the inbox and no run is live: its event was lost or its run failed)"), flush=True)
            announce(path)
            retries.announced(path, fresh=path in fresh)
        fresh.clear()


def trigger_deployment_exists(url: str) -> Callable[[], bool]:
    """Whether the server answers and has the `on-request-file` deployment (`serve` registers it after the
    watcher started). Asked at most once a second; in between, the last answer."""
    import httpx

    last = [0.0, False]

    def check() -> bool:
        if time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            try:
                last[1] = httpx.get(f"{url}/deployments/name/deletion_batch/on-request-file",
                                    **_login(), timeout=5).status_code == 200
            except httpx.HTTPError:
                last[1] = False
        return last[1]

    return check


DEPLOYMENTS = ("scheduled", "on-request-file")
LIVE_STATES = ("SCHEDULED", "PENDING", "RUNNING", "CANCELLING", "PAUSED")


def _deployment_runs(url: str, state_types: tuple[str, ...]) -> list[dict]:
    """The flow runs of this project's deployments of `deletion_batch` in those state types (the REST API)."""
    import httpx

    body = {"flows": {"name": {"any_": ["deletion_batch"]}}, "deployments": {"name": {"any_": list(DEPLOYMENTS)}},
            "flow_runs": {"state": {"type": {"any_": list(state_types)}}}, "limit": 200}
    r = httpx.post(f"{url}/flow_runs/filter", json=body, **_login(), timeout=10)
    r.raise_for_status()
    return r.json()


def _is_live(run: dict, now: dt.datetime) -> bool:
    """A run that may still take an inbox file: pending, running, or scheduled to start by now (a triggered run,
    one awaiting the concurrency slot); not the schedule's future runs."""
    state = run.get("state") or {}
    if state.get("type") != "SCHEDULED":
        return True
    if state.get("name") in ("AwaitingConcurrencySlot", "Late", "AwaitingRetry"):
        return True
    when = (state.get("state_details") or {}).get("scheduled_time") or run.get("expected_start_time")
    try:
        return when is None or dt.datetime.fromisoformat(when.replace("Z", "+00:00")) <= now
    except ValueError:
        return True


def deployment_runs_live(url: str, every_s: float = 5.0) -> Callable[[], bool | None]:
    """For the watcher's retries: whether a run of the deployments is live (None when the server does not
    answer). Asked at most every `every_s` (a due entry waits through a long batch); in between, the last
    answer."""
    last: list = [float("-inf"), None]

    def check() -> bool | None:
        import httpx

        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            try:
                runs = _deployment_runs(url, LIVE_STATES)
            except httpx.HTTPError:
                last[1] = None
            else:
                now = dt.datetime.now(dt.timezone.utc)
                last[1] = any(_is_live(r, now) for r in runs)
        return last[1]

    return check


CRASHED_MESSAGE = ("its process ended without a final state (a previous `unlearn serve` stopped: kill -9, the OOM "
                   "killer, a host crash); marked Crashed by the next `unlearn serve` at its start. Nothing of it "
                   "was applied unless the ledger says so; its request file stays in the inbox and is processed "
                   "again")


def crash_orphaned_runs(url: str, params: Params) -> list[str]:
    """Mark the deployments' Running, Pending and Cancelling runs Crashed when no batch holds the batch lock (so
    none of them is alive: their process died with a previous serve). Prefect kept them Running for good, and
    each held its deployment's concurrency slot until its 300 s lease ran out, so the next triggered run
    waited. Forcing the state frees the slot (Prefect's minimal flow policy releases it). Returns the run
    names."""
    import httpx

    from tasks.state import batch_lock
    from unlearning.io import LockTimeout

    try:
        with batch_lock(params.project_paths, 0, say_waiting=False):
            runs = _deployment_runs(url, ("RUNNING", "PENDING", "CANCELLING"))
            for run in runs:
                httpx.post(f"{url}/flow_runs/{run['id']}/set_state", **_login(), timeout=10, json={
                    "state": {"type": "CRASHED", "name": "Crashed", "message": CRASHED_MESSAGE},
                    "force": True}).raise_for_status()
    except LockTimeout:
        return []  # a batch is running (another serve, `unlearn run`): its runs are alive
    return [r["name"] for r in runs]


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
    for name in crash_orphaned_runs(url, params):
        print(f"flow run '{name}' was left Running by a previous serve: marked Crashed (its file is processed "
              f"again)", flush=True)
    stop = threading.Event()
    watcher = threading.Thread(target=watch_inbox, daemon=True, name="inbox-watcher",
                               args=(inbox, stop, params.operations.inbox_settle_seconds, emit_request_event,
                                     trigger_deployment_exists(url), params.operations.inbox_retry_seconds,
                                     deployment_runs_live(url)))
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
