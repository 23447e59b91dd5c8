"""`python -m flows.session CMD ... [--then CMD ...]`: `make run`'s commands with ONE temporary Prefect server
and ONE warm worker for all of them.

Every DVC stage is a process of its own. Without help, each starts a temporary Prefect server (8-15 s on
these machines: uvicorn plus its migrations check) and imports torch, Prefect, MLflow, pandera and Great
Expectations again (5-9 s). This wrapper:
- starts one Prefect server the way Prefect starts its temporary one (uvicorn on `create_app`), from this
  stdlib-only process, so nothing is imported twice; its migrations check is skipped when `make setup`
  migrated the database for this Prefect version (`prefect_db_is_migrated`). Its URL reaches every command
  through `PREFECT_API_URL`; flow runs are as real as before, stored in `$PREFECT_HOME`, so `make server`
  shows them in the Prefect UI afterwards. With `PREFECT_API_URL` already set (`make server`, the team
  servers) that server is used instead;
- starts the warm worker beside it (flows/warm.py): the imports are done once, while the server starts, and
  each stage (`python -m flows.warm run flows.<stage>`) and each `unlearn` command runs in a child forked from
  it. `--cold` runs every command in processes of their own, as plain `dvc repro` does;
- runs the commands in order, stops at the first that fails, and prints the wall time of each stage
  (DVC's "Running stage 'x':" lines mark where one begins) split into compute, tracking and orchestration
  (adapters/clock.py), with the overhead share.

Nothing outlives it: the server, the worker and CMD are started with the Linux parent-death signal, so even a
`kill -9` of this wrapper stops them, and SIGTERM / Ctrl-C stop CMD, the worker and the server before it exits.

`python -m flows.session --for PID` is the session of a plain `dvc repro` (PID: the `dvc` process): started by
its first stage with work (`join_session`), joined by the next ones through .unlearning/sessions/PID.json, and
ended when PID ends (docs/operations.md, "One session per run"). `unlearn repro` is this wrapper around
`dvc repro`, `unlearn erase` and `unlearn status`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

from flows import resident
from flows.procs import (
    ENV_SOCKET, ENV_TEMPORARY_SERVER, ENV_WAIT_FOR_API, die_with_parent, prefect_api_answers,
)
from adapters.clock import ENV_FILE as TIMINGS_FILE
from adapters.pids import pid_alive


STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
# DVC exits 255 whatever the stage's command exited with; the command's documented code is on this line.
STAGE_FAILED_LINE = re.compile(r"^ERROR: failed to reproduce '[^']+': failed to run: .*, exited with (\d+)\s*$")
# flows.deletion_batch.report_results: a file was not applied, while the others of the run may have been
FILES_HELD_LINE = re.compile(r"^error: (\d+ file\(s\) rejected and moved to requests/rejected/|\[.*\] changed while"
                             r"|\d+ file\(s\) held for review in requests/held/)")
SKIPPED_LINE = re.compile(r"^Stage '([^']+)' (?:didn't change, skipping|is cached - skipping)")


def _die_with_parent() -> None:
    """In the child, before exec: ask the kernel to SIGTERM it when its parent dies (even by SIGKILL)."""
    os.setpgrp()  # its own process group: the stages it starts are stopped with it (os.killpg)
    die_with_parent()


class NoServerDocsHint(logging.Filter):
    """Prefect logs "Starting temporary server on URL\nSee https://www.prefect.io/docs/... for more information
    on running a dedicated Prefect server." at INFO on every start of a temporary server (each `unlearn run`,
    each `python -m flows.<stage>`). Keeps the first line; the docs hint goes (the README says how to run a
    dedicated server: `make server`). Every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Starting temporary server") and "\nSee " in msg:
            record.msg = msg.split("\n", 1)[0]
        return True


def quiet_server_hint() -> None:
    """Install `NoServerDocsHint` on the logger Prefect's temporary server logs with ("prefect"), once."""
    logger = logging.getLogger("prefect")
    if not any(isinstance(f, NoServerDocsHint) for f in logger.filters):
        logger.addFilter(NoServerDocsHint())


def start_temporary_server():
    """A temporary Prefect server (Prefect's own SubprocessASGIServer) that dies with this process."""
    from prefect.server.api import server as prefect_server

    quiet_server_hint()

    class Server(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self):
            # Prefect starts uvicorn with a plain Popen: add the parent-death signal to that one call.
            real_popen = subprocess.Popen
            subprocess.Popen = lambda *a, **kw: real_popen(*a, preexec_fn=_die_with_parent, **kw)
            try:
                return super()._run_uvicorn_command()
            finally:
                subprocess.Popen = real_popen

    server = Server()
    server.start()
    return server


GIT_HINT = ["\n", "To track the changes with git, run:\n", "\n", None, "\n", "To enable auto staging, run:\n", "\n",
            "\tdvc config core.autostage true\n"]  # None: the "\tgit add <files>" line


class DvcGitHint:
    """DVC ends `dvc repro` with an 8-line block, "To track the changes with git, run: git add dvc.lock" and
    "To enable auto staging, run: dvc config core.autostage true". This project's policy (docs/getting-started.md, "dvc.lock"):
    the repository ships without dvc.lock, you commit it with your data version when you want to keep a run,
    and auto staging stays off (it would stage files in your git index on every run). The block becomes one
    line saying that; any output that does not match the block exactly passes through unchanged."""

    def __init__(self):
        self.held: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to print now for one line of DVC output."""
        expected = GIT_HINT[len(self.held)]
        if (line == expected) or (expected is None and line.startswith("\tgit add ")):
            self.held.append(line)
            if len(self.held) < len(GIT_HINT):
                return []
            files = self.held[3].strip()[len("git add "):]
            self.held = []
            return [f"DVC updated {files}: it records what this run was built from; commit it with your data "
                    f"version when you want to keep this run (`git add {files}`; docs/getting-started.md, \"dvc.lock\")\n"]
        out, self.held = self.held, []
        return out + (self.feed(line) if out else [line])

    def flush(self) -> list[str]:
        out, self.held = self.held, []
        return out


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_timed(cmd: list[str], env: dict) -> tuple[int, list[tuple[str, float]], bool]:
    """Run `cmd`, pass its output through line by line, and time the stages it announces. Returns the exit code
    (a failed stage's own, rather than DVC's 255), the stages' wall times, and whether it failed because a
    request file was not applied (rejected, or still being written: the run's other files may be applied)."""
    env = {**env, "PYTHONUNBUFFERED": "1"}  # lines arrive as they are printed, so the stage times are right
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            preexec_fn=_die_with_parent)
    stages: list[tuple[str, float]] = []
    current, since = None, time.perf_counter()
    hint = DvcGitHint()
    stage_rc = None
    files_held = False
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            for shown in hint.feed(line):
                sys.stdout.write(shown)
            sys.stdout.flush()
            m = STAGE_LINE.match(line)
            if m:
                now = time.perf_counter()
                if current is not None:
                    stages.append((current, now - since))
                current, since = m.group(1), now
            elif SKIPPED_LINE.match(line):
                stages.append((SKIPPED_LINE.match(line).group(1) + " (skipped)", 0.0))
            elif failed := STAGE_FAILED_LINE.match(line):
                stage_rc = int(failed.group(1))
            elif FILES_HELD_LINE.match(line):
                files_held = True
    except KeyboardInterrupt:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # CMD and the stage processes it started
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        raise
    for shown in hint.flush():
        sys.stdout.write(shown)
    rc = proc.wait()
    if current is not None:
        stages.append((current, time.perf_counter() - since))
    if rc != 0 and stage_rc:  # a stage's bad input (2) or gate rejection (3), not DVC's 255
        rc = stage_rc
    return rc, stages, files_held and rc != 0


def prefect_home(env: dict) -> str:
    """Prefect's home folder (its SQLite database): PREFECT_HOME, else Prefect's default ~/.prefect."""
    return env.get("PREFECT_HOME") or os.path.join(os.path.expanduser("~"), ".prefect")


def prefect_db_is_migrated(env: dict) -> bool:
    """Whether $PREFECT_HOME/prefect.db is migrated for the installed Prefect version: the stamp
    `prefect.db.version` beside it, written by `make setup`, or by a session whose server migrated it at its start
    (`stamp_migrated`: a project of `unlearn init`, whose Prefect home is ~/.prefect). Then the temporary server
    need not check the migrations at start; any doubt (no stamp, another version, a database server of your own)
    leaves the check on."""
    import importlib.metadata

    home = prefect_home(env)
    if env.get("PREFECT_API_DATABASE_CONNECTION_URL"):
        return False
    db, stamp = os.path.join(home, "prefect.db"), os.path.join(home, "prefect.db.version")
    try:
        with open(stamp, encoding="utf-8") as f:
            return os.path.exists(db) and f.read().strip() == importlib.metadata.version("prefect")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return False


def stamp_migrated(env: dict) -> None:
    """After a server that checked its migrations at start answered: the database is at this Prefect's head, so
    the next sessions skip the check (`prefect_db_is_migrated`). Nothing for a database server of your own."""
    import importlib.metadata

    home = prefect_home(env)
    if env.get("PREFECT_API_DATABASE_CONNECTION_URL") or not os.path.exists(os.path.join(home, "prefect.db")):
        return
    try:
        with open(os.path.join(home, "prefect.db.version"), "w", encoding="utf-8") as f:
            f.write(importlib.metadata.version("prefect") + "\n")
    except (OSError, importlib.metadata.PackageNotFoundError):
        pass


class ServerProcess:
    """Prefect's temporary server started as Prefect starts it (uvicorn on `create_app`, UI off, the ephemeral
    services), but from this stdlib-only process: no `import prefect` here (~7 s on these machines), and the
    server's own start (~9 s) runs beside the warm worker's imports instead of before them. A thread notes when
    it first answers `/health`; stages forked before then wait for it (flows.warm, UNLEARN_WAIT_FOR_API)."""

    def __init__(self, env: dict):
        import socket
        import threading

        with socket.socket() as s:  # a free port, as Prefect picks one
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.started = time.perf_counter()
        self.up_after: float | None = None
        server_env = {**env, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.env, self.migrates = env, not prefect_db_is_migrated(env)
        if not self.migrates:
            server_env["PREFECT_API_DATABASE_MIGRATE_ON_START"] = "false"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host",
             "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
            env=server_env, preexec_fn=_die_with_parent)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            if prefect_api_answers(self.api_url):
                self.up_after = time.perf_counter() - self.started
                if self.migrates and self.env.get("PREFECT_API_DATABASE_MIGRATE_ON_START", "true") != "false":
                    stamp_migrated(self.env)  # it migrated at its start: the next sessions skip the check
                return
            time.sleep(0.1)


def _terminate(proc: subprocess.Popen, timeout: float = 10) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_warm_worker(env: dict, folder: str) -> subprocess.Popen:
    """flows.warm's worker: the heavy imports once, a forked child per stage and per `unlearn` command."""
    return subprocess.Popen([sys.executable, "-m", "flows.warm", "serve", folder], env=env, preexec_fn=_die_with_parent)


def params_problem(cmd: list[str], path: str = "params.yaml") -> str | None:
    """For `dvc repro`: what is wrong with ./params.yaml (the stages' params), or None. Checked first, so a
    typo answers in about a second instead of after the server's start and the stage's imports."""
    if os.path.basename(cmd[0]) != "dvc" or "repro" not in cmd[1:] or not os.path.exists(path):
        return None
    from unlearning.config import ConfigError, device_problem, load_params  # pydantic + yaml: ~0.4 s

    try:
        return device_problem(load_params(path).base)
    except ConfigError as e:
        return str(e)


def repro_reads_inbox(cmd: list[str]) -> bool:
    """Whether `cmd` is a `dvc repro` (or `python -m dvc repro`) that reaches the deletion stage, whose inbox
    dependency DVC hashes before the stage runs: no target (every stage), or a target naming it."""
    words = cmd[2:] if len(cmd) > 2 and cmd[1:3] == ["-m", "dvc"] else cmd
    if os.path.basename(words[0]) != "dvc" or "repro" not in words[1:]:
        return False
    targets = [w for w in words[words.index("repro") + 1:] if not w.startswith("-")]
    return not targets or any(t.split(":")[-1] == "deletion" or t == "dvc.yaml" for t in targets)


def split_commands(args: list[str]) -> tuple[list[list[str]], bool]:
    """`[--cold] CMD ARGS [--then CMD ARGS ...]` -> the commands, and whether to use the warm worker."""
    warm = True
    if args and args[0] == "--cold":
        warm, args = False, args[1:]
    commands, current = [], []
    for a in args:
        if a == "--then":
            commands.append(current)
            current = []
        else:
            current.append(a)
    commands.append(current)
    if any(not c for c in commands):
        raise ValueError("an empty command (a `--then` with nothing after it, or before it)")
    return commands, warm


def use_resident(env: dict, project: str = ".") -> bool:
    """Point `env` at the project's resident server and worker (`unlearn up`, flows/resident.py) when they serve
    this code and these settings; one line on stderr when one runs but cannot be used."""
    info, why = resident.usable(project, env)
    if why:
        print(f"not using the resident server: {why}", file=sys.stderr, flush=True)
    if info is None:
        return False
    resident.use(info, env)
    return True


def read_timings(path: str) -> dict[str, dict]:
    """The per-process records of adapters.clock (compute and tracking seconds), by stage label."""
    out: dict[str, dict] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                mine = out.setdefault(rec["label"], {"compute_s": 0.0, "tracking_s": 0.0})
                mine["compute_s"] += rec.get("compute_s", 0.0)
                mine["tracking_s"] += rec.get("tracking_s", 0.0)
                mine["largest"] = mine.get("largest", []) + rec.get("largest", [])
    except FileNotFoundError:
        pass
    return out


def timing_split(rows: list[tuple[str, float]], timings: dict[str, dict], total: float,
                 server_up: float | None) -> dict:
    """Each stage's wall time split into compute, tracking and the rest (orchestration); totals and the
    overhead share (tracking + orchestration over the wall time). Seconds."""
    stages, compute, tracking = [], 0.0, 0.0
    for name, wall in rows:
        t = {} if name.endswith("(skipped)") else timings.get(name, {})
        c, k = t.get("compute_s", 0.0), t.get("tracking_s", 0.0)
        compute, tracking = compute + c, tracking + k
        stages.append({"stage": name, "wall_s": round(wall, 2), "compute_s": round(c, 2), "tracking_s": round(k, 2),
                       "orchestration_s": round(max(wall - c - k, 0.0), 2), "largest": t.get("largest", [])})
    orchestration = max(total - compute - tracking, 0.0)
    return {"stages": stages, "total_s": round(total, 2), "compute_s": round(compute, 2),
            "tracking_s": round(tracking, 2), "orchestration_s": round(orchestration, 2),
            "overhead_share": round((tracking + orchestration) / total, 4) if total > 0 else 0.0,
            "prefect_server_up_s": None if server_up is None else round(server_up, 2)}


def timing_table(split: dict) -> list[str]:
    """`timing_split` as the table the session prints (the stage column as wide as its longest name)."""
    width = max([len("stage"), len("total")] + [len(s["stage"]) for s in split["stages"]])

    def row(name: str, wall: float, compute: float, tracking: float, orchestration: float) -> str:
        return f"  {name:<{width}} {wall:6.1f}s {compute:7.1f}s {tracking:8.1f}s {orchestration:13.1f}s"

    lines = ["", "wall time per stage (compute: task bodies; tracking: MLflow calls and review figures; "
                 "orchestration: the rest: process start, Prefect, DVC):",
             f"  {'stage':<{width}} {'wall':>7} {'compute':>8} {'tracking':>9} {'orchestration':>14}"]
    for s in split["stages"]:
        lines.append(row(s["stage"], s["wall_s"], s["compute_s"], s["tracking_s"], s["orchestration_s"]))
        if os.environ.get("UNLEARN_TIMING_DETAIL"):
            lines.extend(f"      {key:<60} {sec:6.2f}s" for key, sec in s["largest"])
    lines.append(row("total", split["total_s"], split["compute_s"], split["tracking_s"], split["orchestration_s"]))
    up = split["prefect_server_up_s"]
    lines.append(f"  overhead (tracking + orchestration): {split['overhead_share']:.0%} of the wall time"
                 + (f"; the Prefect server answered after {up:.1f} s" if up is not None else ""))
    return lines


# ------------------------------------------------------------------ one session for a plain `dvc repro`
# A stage of a plain `dvc repro` (no session in its environment) starts a session for the whole `dvc repro`:
# `python -m flows.session --for PID` (PID: the `dvc` process), detached, which writes
# .unlearning/sessions/<PID>.json and ends when that process ends. The later stages of the same `dvc repro`
# find it there (`join_session`), so the run starts one server and one warm worker, not one per stage.
SESSIONS_DIR = os.path.join(".unlearning", "sessions")
ENV_NO_SESSION = "UNLEARN_NO_SESSION"  # "1": each stage on its own (its own temporary server), as before
SESSION_WAIT_S = 15.0  # the longest a session waits for its warm worker's socket before writing its record
SESSION_START_S = 60.0  # beyond that, what a loaded machine may take to start the session's own process


def _proc_parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _proc_argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def dvc_ancestor(pid: int | None = None, depth: int = 6) -> int | None:
    """The `dvc` process this one runs under (DVC starts a stage's command through a shell), or None."""
    pid = os.getppid() if pid is None else _proc_parent(pid)
    for _ in range(depth):
        if not pid or pid <= 1:
            return None
        argv = _proc_argv(pid)
        if any(os.path.basename(a) == "dvc" for a in argv[:2]) or argv[1:3] == ["-m", "dvc"]:
            return pid
        pid = _proc_parent(pid)
    return None


def session_file(owner: int, root: str = ".") -> str:
    return os.path.join(root, SESSIONS_DIR, f"{owner}.json")


def read_session(owner: int, root: str = ".") -> dict | None:
    """The session started for `owner`, while it runs (a stale file from a killed one is None)."""
    try:
        with open(session_file(owner, root), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if pid_alive(int(info.get("pid", 0))) and pid_alive(owner) else None


def session_env(info: dict) -> dict:
    """What a stage's process needs to use a session: its server and its warm worker."""
    return {"PREFECT_API_URL": info["api_url"], ENV_TEMPORARY_SERVER: info["api_url"], ENV_WAIT_FOR_API: "1",
            ENV_SOCKET: info["folder"]}


def start_session(owner: int, env) -> subprocess.Popen:
    """`python -m flows.session --for OWNER`, detached (its own session, no parent-death signal): it outlives the
    stage that starts it and ends with `dvc`."""
    os.makedirs(SESSIONS_DIR, exist_ok=True)
    with open(os.path.join(SESSIONS_DIR, f"{owner}.log"), "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "flows.session", "--for", str(owner)], env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def wait_for_session(owner: int, proc: subprocess.Popen) -> dict | None:
    """The record of the session `proc` (just started for `owner`) once it wrote it; None when `proc` ended
    without one, or after SESSION_WAIT_S + SESSION_START_S (then `proc` is stopped: the stage starts its own
    server, so this one must not). The session writes it when its warm worker's socket is up, or after
    SESSION_WAIT_S without it. Waiting while the session lives, rather than a fixed 15 s, keeps a loaded machine
    (a slow interpreter start, a worker importing torch for 20 s) from starting a second Prefect server beside a
    session that was only slow."""
    deadline = time.monotonic() + SESSION_WAIT_S + SESSION_START_S
    info = read_session(owner)
    while info is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        info = read_session(owner)
    if info is None:
        _terminate(proc)  # its SIGTERM handler stops its worker and server (they also die with it)
    return info


def join_session(env=None) -> str | None:
    """For a stage of a plain `dvc repro` (`python -m flows.warm run ...`): use the session of this `dvc repro`,
    starting it when none runs yet; updates `env` (default os.environ) and returns the API URL, or None (a
    session in the environment already, `PREFECT_API_URL` set, not under `dvc`, or UNLEARN_NO_SESSION=1:
    the stage runs as before)."""
    env = os.environ if env is None else env
    if env.get(ENV_SOCKET) or env.get("PREFECT_API_URL") or env.get(ENV_NO_SESSION) == "1":
        return None
    if use_resident(env):  # `unlearn up`: every stage of every dvc repro here uses it
        return env["PREFECT_API_URL"]
    owner = dvc_ancestor()
    if owner is None:
        return None
    info = read_session(owner)
    if info is None:
        info = wait_for_session(owner, start_session(owner, env))
        if info is None:
            print("no session started for this dvc repro: this stage starts its own Prefect server", file=sys.stderr)
            return None
        print(f"one temporary Prefect server for this dvc repro: {info['api_url']} (ends with it)", flush=True)
    env.update(session_env(info))
    return info["api_url"]


def serve_for(owner: int) -> int:
    """`python -m flows.session --for PID`: a server and a warm worker until process PID ends (or SIGTERM)."""
    import shutil
    import tempfile

    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    env = dict(os.environ)
    folder = tempfile.mkdtemp(prefix="unlearn-session-")
    path = session_file(owner)
    server = ServerProcess(env)
    env.update({"PREFECT_API_URL": server.api_url, ENV_WAIT_FOR_API: "1", ENV_TEMPORARY_SERVER: server.api_url})
    worker = start_warm_worker(env, folder)
    try:
        deadline = time.monotonic() + SESSION_WAIT_S  # the worker's socket first: the stage that waits uses it
        while not os.path.exists(os.path.join(folder, "early.sock")) and worker.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "owner": owner, "api_url": server.api_url, "folder": folder}, f)
        os.replace(path + ".tmp", path)
        while pid_alive(owner) and server.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for p in (path, path.replace(".json", ".log")):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        for proc in (worker, server.proc):
            _terminate(proc)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def serve_resident(project: str, idle_s: float) -> int:
    """`python -m flows.session --resident PROJECT IDLE_S` (`unlearn up`, flows/resident.py): a server and a warm
    worker for PROJECT until `unlearn down` (SIGTERM), or until IDLE_S passed without a command and none runs."""
    import shutil
    import tempfile
    from pathlib import Path

    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    env = dict(os.environ)
    folder = tempfile.mkdtemp(prefix="unlearn-resident-")
    resident.touch(folder)
    server = ServerProcess(env)
    env.update({"PREFECT_API_URL": server.api_url, ENV_TEMPORARY_SERVER: server.api_url})
    worker = start_warm_worker(env, folder)
    path = resident.record_path(Path(project))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "api_url": server.api_url, "folder": folder, "idle_s": idle_s,
                               "started": time.time(), "code": resident.code_stamp(), "project": project,
                               "settings": resident.settings_digest(os.environ), "worker_pid": worker.pid}))
    os.replace(tmp, path)
    ready = False
    try:
        while server.proc.poll() is None and worker.poll() is None:
            time.sleep(resident.CHECK_S)
            if not ready and os.path.exists(os.path.join(folder, "full.sock")):
                ready = True
                resident.touch(folder)  # the idle clock starts once the imports are done, not at the start
            if (stopping or (ready and resident.idle_seconds(folder) > idle_s)) and not resident.busy(worker.pid, folder):
                break
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
        for proc in (worker, server.proc):
            _terminate(proc)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--help"], ["-h"]):  # the session's own help, not a command named --help
        print(f"{USAGE}\n\n{__doc__.strip()}")
        return 0
    if args[:1] == ["--for"] and len(args) == 2 and args[1].isdigit():
        return serve_for(int(args[1]))
    if args[:1] == ["--resident"] and len(args) == 3:
        return serve_resident(args[1], float(args[2]))
    try:
        commands, warm = split_commands(args)
    except ValueError as e:
        print(f"error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    problem = params_problem(commands[0])
    if problem:  # before any server or worker starts: one line, exit 2 (docs/troubleshooting.md)
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from flows.intake import erase_first  # an erase a kill stopped is finished before `dvc repro`

    commands = erase_first(commands)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.perf_counter()
    env = dict(os.environ)
    folder = tempfile.mkdtemp(prefix="unlearn-session-")  # worker sockets + timing records; removed at the end
    env[TIMINGS_FILE] = os.path.join(folder, "timings.jsonl")
    server = worker = None
    rows: list[tuple[str, float]] = []
    rc = held = 0
    try:
        if not env.get("PREFECT_API_URL") and use_resident(env):
            print(f"the resident Prefect server and warm worker of this project (`unlearn up`): {env['PREFECT_API_URL']}",
                  flush=True)
            if not warm:  # --cold: every command in a process of its own, as asked
                env.pop(ENV_SOCKET)
        elif not env.get("PREFECT_API_URL"):
            server = ServerProcess(env)
            env.update({"PREFECT_API_URL": server.api_url, ENV_WAIT_FOR_API: "1", ENV_TEMPORARY_SERVER: server.api_url})
            print(f"one temporary Prefect server for every stage: {server.api_url} (starting beside the warm worker)",
                  flush=True)
        if warm and not env.get(ENV_SOCKET):
            worker = start_warm_worker(env, folder)
            env[ENV_SOCKET] = folder
        for i, cmd in enumerate(commands):
            label = " ".join(os.path.basename(c) if j == 0 else c for j, c in enumerate(cmd))
            if repro_reads_inbox(cmd) and os.path.exists("params.yaml"):
                from flows.intake import intake  # stdlib + pydantic: an entry DVC cannot hash leaves first
                from unlearning.config import ConfigError

                try:
                    held = held or intake("params.yaml")  # 2: a file was rejected; the stage applies the others
                except ConfigError:
                    pass  # params.yaml the stage itself refuses, with its one line
            since = time.perf_counter()
            cmd_rc, stages, files_held = run_timed(cmd, {**env, "UNLEARN_TIMING_LABEL": label})
            rc = rc or cmd_rc
            if stages:
                if i == 0:  # before DVC's first stage line: DVC, server, imports
                    first = sum(s for _, s in stages)
                    rows.append(("start (DVC, server, imports)", max(time.perf_counter() - started - first, 0.0)))
                rows.extend(stages)
            else:
                rows.append((label, time.perf_counter() - since))
            if cmd_rc != 0 and not files_held:
                break
            if files_held:  # the other files of the run were applied: their erasure (next command) still runs
                print(f"{label}: a request file was not applied (exit {cmd_rc}); the next commands still run, for "
                      f"the files that were", flush=True)
        timings = read_timings(env[TIMINGS_FILE])
        rc = rc or held  # a failed command's own code first
    finally:
        for proc in (worker, server.proc if server else None):
            if proc is not None:
                _terminate(proc)
        shutil.rmtree(folder, ignore_errors=True)
    split = timing_split(rows, timings, time.perf_counter() - started, server.up_after if server else None)
    for line in timing_table(split):
        print(line)
    if server is not None and server.up_after is not None and os.path.exists("params.yaml"):
        print(f"  `unlearn up` keeps a Prefect server and a warm worker for this project: the next runs skip the "
              f"server's start ({server.up_after:.1f} s here) and the imports (flows/resident.py)")
    report = os.environ.get("UNLEARN_SESSION_REPORT")  # bench/session_overhead.py reads the split from here
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump({"commands": [" ".join(c) for c in commands], "warm": warm, "rc": rc, **split}, f, indent=1)
    return rc


USAGE = """usage: python -m flows.session [--cold] CMD [ARGS...] [--then CMD [ARGS...] ...]
  e.g. python -m flows.session dvc repro deletion --then unlearn erase --then unlearn status
  Runs the commands in order (stops at the first that fails) with one temporary Prefect server (unless
  PREFECT_API_URL names one) and a warm worker that imports the pipeline once (--cold: without it).
       python -m flows.session --for PID   a server and a warm worker until process PID ends (a dvc repro's)
       python -m flows.session --resident PROJECT IDLE_S   the resident ones of `unlearn up` (flows/resident.py)"""


if __name__ == "__main__":
    sys.exit(main())
