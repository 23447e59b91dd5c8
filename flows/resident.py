"""`unlearn up` / `unlearn down`: a resident Prefect server and warm worker for one project, so that a batch costs
its compute and not the start-up around it.

Every `unlearn repro` (and `make run`) starts a temporary Prefect server and a warm worker (flows/session.py) and
stops them at its end. In a project where prepare and train have nothing to do, the deletion stage starts at once
and waits for both: the server's start (8-20 s on 2 cores, its migrations check included) and the worker's imports
(torch, Prefect, MLflow, Great Expectations: 7-10 s). Measured on a 20-row digits batch of an `unlearn init`
project (load 5-7 on 2 cores): 51.9 s with them, 27.3 s with a server and worker already up
(docs/getting-started.md, "A resident server").

`unlearn up` starts both once, detached (`python -m flows.session --resident ROOT IDLE_S`), and records them in
ROOT/.unlearning/resident.json. Every later `unlearn repro`, `make run`, plain `dvc repro` stage and `unlearn`
command of that project uses them (`usable`): the stages fork from the warm worker, the flows talk to that
server. Its lifecycle:
- `unlearn down` stops it (after the command running in it, if one is);
- it stops by itself after `--idle-minutes` (default 30) without a command (the worker's socket folder's
  `used` file is touched by each use; a command still running in it counts as busy);
- `unlearn status` says whether it runs, since when, and when it stops;
- a worker that imported another version of the code (the package's files changed since `unlearn up`) is not
  used: the session starts its own server and worker, and says why (`unlearn down && unlearn up` refreshes it).
Nothing else outlives a command: without `unlearn up`, `unlearn repro` starts and stops its own as before.

Stdlib only (like flows/session.py): `unlearn status` and the session read it without Prefect or torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from adapters.pids import pid_alive
from flows.procs import ENV_SOCKET, ENV_TEMPORARY_SERVER, prefect_api_answers

FILE = Path(".unlearning") / "resident.json"  # relative to the project folder (the one holding params.yaml)
USED = "used"  # in the worker's socket folder: touched by each command that uses it
DEFAULT_IDLE_MINUTES = 30.0
CHECK_S = 2.0  # how often the resident process looks at its server, its worker and the idle time
PACKAGES = ("flows", "tasks", "adapters", "unlearning")
# Settings Prefect and MLflow read when imported: a warm worker serves only commands whose values equal its own
SETTINGS_PREFIXES = ("PREFECT_", "MLFLOW_")


def settings_of(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(SETTINGS_PREFIXES)}


def code_stamp(root: Path | None = None) -> str:
    """What the package's code is now: a digest of every .py file's path, size and modification time (a few
    hundred stat calls). A worker that imported other code must not run this code's stages."""
    root = Path(__file__).resolve().parents[1] if root is None else root
    h = hashlib.sha256()
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def record_path(project: Path) -> Path:
    return Path(project) / FILE


def read(project: Path) -> dict | None:
    """The project's resident server and worker while their process runs (a stale record is removed), else None."""
    path = record_path(project)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not pid_alive(int(info.get("pid", 0))):
        path.unlink(missing_ok=True)
        return None
    return info


def settings_digest(env: dict) -> str:
    """A digest of the Prefect and MLflow settings in `env` (the warm worker serves only commands with its own:
    flows/warm.py), never the values themselves (a password may be among them)."""
    items = sorted((k, v) for k, v in settings_of(env).items() if k != "PREFECT_API_URL")
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def usable(project: Path, env: dict | None = None) -> tuple[dict | None, str | None]:
    """(the resident session, None) when its server answers and its worker serves this code with `env`'s settings
    (default os.environ); (None, why) when one is recorded but cannot be used; (None, None) when none runs."""
    info = read(project)
    if info is None:
        return None, None
    if info.get("code") != code_stamp():
        return None, ("the resident worker imported an older version of the code (`unlearn down && unlearn up` "
                      "refreshes it)")
    if info.get("settings") != settings_digest(os.environ if env is None else env):
        return None, ("this command's Prefect or MLflow settings (PREFECT_*, MLFLOW_* variables) differ from the "
                      "resident worker's (started by `unlearn up` in another environment)")
    if not os.path.exists(os.path.join(info["folder"], "early.sock")) or not prefect_api_answers(info["api_url"]):
        return None, "the resident server or worker does not answer (`unlearn down && unlearn up` restarts them)"
    return info, None


def use(info: dict, env: dict) -> dict:
    """`env` set to run against the resident server and worker (as flows/session.py sets a session's), and the
    use recorded (the idle clock restarts)."""
    touch(info["folder"])
    env.update({"PREFECT_API_URL": info["api_url"], ENV_TEMPORARY_SERVER: info["api_url"], ENV_SOCKET: info["folder"]})
    return env


def touch(folder: str) -> None:
    try:
        Path(folder, USED).touch()
    except OSError:
        pass


def idle_seconds(folder: str, now: float | None = None) -> float:
    now = time.time() if now is None else now
    try:
        return max(0.0, now - os.stat(os.path.join(folder, USED)).st_mtime)
    except OSError:
        return 0.0


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `pid` (children, their children...), from /proc's parent ids."""
    if parents is None:
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
    out, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parents.items() if pp in frontier]
        out += frontier
    return out


def busy(worker_pid: int, folder: str, parents: dict[int, int] | None = None) -> bool:
    """Whether a command runs in the worker: a process below it besides the full worker (flows/warm.py forks it
    once its first imports are done, and it runs no command itself)."""
    full = 1 if os.path.exists(os.path.join(folder, "full.sock")) else 0
    return len(descendants(worker_pid, parents)) > full


def status_line(project: Path, now: float | None = None) -> str:
    """One line for `unlearn status`."""
    info = read(project)
    if info is None:
        return ("resident server: none (`unlearn up` keeps a Prefect server and a warm worker for this project, so "
                "a batch does not wait for their start; `unlearn down` stops them)")
    now = time.time() if now is None else now
    idle = idle_seconds(info["folder"], now)
    left = max(0.0, info["idle_s"] - idle)
    return (f"resident server: up since {time.strftime('%H:%M', time.localtime(info['started']))} (pid {info['pid']}, "
            f"{info['api_url']}); idle {idle / 60:.0f} min, stops after {info['idle_s'] / 60:g} min idle (in "
            f"{left / 60:.0f} min) or `unlearn down`")


def up(project: Path, idle_minutes: float = DEFAULT_IDLE_MINUTES, wait_s: float = 180.0) -> int:
    """Start the resident server and worker for `project` (detached), wait until both answer; 0 when up."""
    project = Path(project).resolve()
    info, why = usable(project)
    if info is not None:
        print(status_line(project))
        return 0
    if why is not None:  # recorded but unusable: replace it
        print(f"{why}: restarting it", flush=True)
        down(project)
    record_path(project).parent.mkdir(parents=True, exist_ok=True)
    log = record_path(project).with_suffix(".log")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.session", "--resident", str(project),
                                 str(float(idle_minutes) * 60)], cwd=project, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, start_new_session=True)
    started, shown = time.monotonic(), 0.0
    while time.monotonic() - started < wait_s:
        if proc.poll() is not None:
            print(f"error: the resident server stopped at its start (exit {proc.returncode}); see {log}",
                  file=sys.stderr)
            return 1
        info, _ = usable(project)
        if info is not None and os.path.exists(os.path.join(info["folder"], "full.sock")):
            print(f"resident Prefect server and warm worker up for {project} ({time.monotonic() - started:.0f} s): "
                  f"{info['api_url']}; `unlearn repro`, `make run`, `dvc repro` and `unlearn` here use them; they stop "
                  f"after {idle_minutes:g} min idle or `unlearn down`")
            return 0
        if time.monotonic() - started - shown >= 10:
            shown = time.monotonic() - started
            print(f"unlearn up: starting the server and importing the pipeline ({shown:.0f} s)", flush=True)
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    print(f"error: the resident server did not answer within {wait_s:.0f} s; see {log}", file=sys.stderr)
    return 1


def down(project: Path, wait_s: float = 600.0) -> int:
    """Stop the project's resident server and worker (after the command running in them ends); 0."""
    project = Path(project).resolve()
    info = read(project)
    if info is None:
        print("no resident server runs for this project")
        return 0
    if info.get("worker_pid") and busy(int(info["worker_pid"]), info["folder"]):
        print("a command runs in the resident worker: they stop when it ends", flush=True)
    os.kill(int(info["pid"]), signal.SIGTERM)
    started = time.monotonic()
    while pid_alive(int(info["pid"])) and time.monotonic() - started < wait_s:
        time.sleep(0.2)
    record_path(project).unlink(missing_ok=True)
    print(f"resident server and worker stopped (pid {info['pid']})")
    return 0
