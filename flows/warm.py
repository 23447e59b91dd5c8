"""Warm workers: the pipeline's heavy imports done once, a forked child per stage.

Each DVC stage is a process of its own, and each used to spend 5-9 s importing torch, Prefect, MLflow,
pandera and Great Expectations before its flow began (`make run`: three stages, then `unlearn erase` and
`unlearn status`). `python -m flows.session` starts a worker (`python -m flows.warm serve FOLDER`) beside the
Prefect server. It imports what prepare and train need (EARLY_PLAN), answering requests on FOLDER/early.sock
between two imports; then it forks a successor that imports the deletion batch's packages (FULL_PLAN) and
answers on FOLDER/full.sock, while the first stays free for train. A stage's command
(`python -m flows.warm run flows.prepare`) is a stdlib-only client: it sends its argv, working directory,
environment and its stdin/stdout/stderr file descriptors; the worker forks, the child takes them over
(`dup2`) and calls the module's `main()` in the already-imported interpreter, and the exit code comes back to
the client, which exits with it. The child is an ordinary process of the same program: the same code path,
the same Prefect flow runs and MLflow runs as `python -m flows.prepare`, only without the import time.

A stage of a plain `dvc repro` (no session in its environment) first joins the session of that `dvc repro`,
starting it when it is the first stage (flows.session.join_session); a stage with nothing to do (flows/idle.py)
ends before any of this.
Without a worker (no `UNLEARN_WARM_WORKER` in the environment, e.g. UNLEARN_NO_SESSION=1), or when it cannot
be reached, or when the request's Prefect/MLflow settings differ from the worker's (those packages read
them at import), the client runs the module in its own process: same result, the old start-up time, and
one line on stderr saying why when a worker was configured.

Fork safety: a worker only imports; it starts no thread (checked before each fork: a worker with threads
refuses, and the client runs the module itself) and never runs a flow, so each child starts from a clean
single-threaded interpreter. A child ends through `exit_fast` (threading's shutdown and the atexit handlers,
then `os._exit`): the interpreter's teardown would touch every inherited page and copy them all. Signals:
Ctrl-C / SIGTERM of the client go to the child's process group; a client that dies (EOF on its socket) gets
its child stopped; a worker that stops (or dies) takes its children with it.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from typing import NoReturn

from adapters import clock  # stdlib only
# the names flows.session shares with the worker (re-exported: flows.session, flows.common, the tests)
from flows.procs import (ENV_SOCKET, ENV_TEMPORARY_SERVER, ENV_WAIT_FOR_API, _PRCTL, die_with_parent,  # noqa: F401
                         prefect_api_answers)
from flows.resident import SETTINGS_PREFIXES, settings_of, touch  # noqa: F401  (stdlib only)


# What the workers import, in the order the stages need them. The first worker ("early") imports what prepare
# and train need, answering requests between two imports (a stage that arrives early waits until the plan is
# imported up to its module, then forks). When it is done it forks a successor ("full") that goes on
# with the deletion batch's packages (Great Expectations alone takes 4-7 s) while the first one stays free to
# answer train at once. Targets not in EARLY_TARGETS go to the full worker.
# The names come from `UNLEARN_WARM_DEBUG=<folder> make run`, which lists what each child still imported itself
# (most of it loaded lazily: Prefect's engines, MLflow's SQL store and its migrations check, pandera's backend).
EARLY_PLAN = (
    "numpy", "pandas", "torch", "prefect", "prefect.flows", "prefect.tasks", "prefect.flow_engine",
    "prefect.task_engine", "prefect.artifacts", "prefect.concurrency.sync", "prefect.concurrency.v1.sync",
    "pandera.pandas", "pandera.backends.pandas", "pandera.accessors.pandas_accessor", "fastapi", "graphviz",
    "psutil", "narwhals.stable.v1", "flows.prepare",
    "mlflow", "mlflow.pyfunc", "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.store.db.utils", "alembic.migration", "alembic.autogenerate", "mako.template", "mako.ext.pygmentplugin",
    "mlflow.tracing.export.mlflow_v3", "mlflow.pyfunc.scoring_server", "mlflow.models.display_utils", "sqlite3",
    # `module:function` is called once imported: MLflow maps every installed distribution's files to its modules
    # (about 1 s here) the first time a model is logged, to check its pip requirements; done here, each stage
    # that logs a model (train, deletion) inherits the map.
    "mlflow.utils.requirements_utils:_init_packages_to_modules_map",
    "flows.train",
)
FULL_PLAN = (
    "great_expectations", "great_expectations.render.renderer", "jinja2.ext", "tasks.validation",
    "adapters.request_check",
    "adapters.request_check:cache_data_docs_templates", "flows.deletion_batch", "adapters.plots", "matplotlib.pyplot", "matplotlib.backends.backend_agg",
    "PIL.PngImagePlugin", "tasks.erasure", "dvc.repo", "flows.audit", "flows.cli",
)
EARLY_TARGETS = frozenset({"flows.prepare", "flows.train"})
SOCKETS = {"early": "early.sock", "full": "full.sock"}
HEADER = struct.Struct("!I")
STARTED = time.perf_counter()
IN_CHILD = False  # True in a child forked for a command: it runs its target itself and never forwards again
# Settings Prefect and MLflow read when imported: a request whose values differ runs in its own process.
_settings = settings_of


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing left to lose
            pass


def _signal_group(pid: int, signum: int) -> None:
    """Signal the process group a child leads (it calls setpgid), if it still exists."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------------------------------- client

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("warm worker closed the connection")
        buf += chunk
    return buf


def _send_message(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    payload = json.dumps(obj).encode()
    header = HEADER.pack(len(payload))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(payload)


def _read_message(sock: socket.socket, with_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, with_fds)
        if not data:
            raise ConnectionError("warm worker client closed the connection")
        data += _recv_exact(sock, HEADER.size - len(data))
    else:
        data = _recv_exact(sock, HEADER.size)
    (n,) = HEADER.unpack(data)
    return json.loads(_recv_exact(sock, n)), fds


def _socket_for(folder: str, target: str, wait_s: float = 60.0) -> str | None:
    """The worker socket for `target`: the full worker's, once it exists (the early worker forks it when done
    importing), else the early worker's; None when no worker is there."""
    early, full = (os.path.join(folder, SOCKETS[k]) for k in ("early", "full"))
    if target.split(":")[0] in EARLY_TARGETS:
        return early if os.path.exists(early) else None
    deadline = time.monotonic() + wait_s
    while not os.path.exists(full):
        if not os.path.exists(early) or time.monotonic() > deadline:
            return early if os.path.exists(early) else None
        time.sleep(0.05)
    return full


def forward(target: str, argv: list[str]) -> int | None:
    """Run `target` (a module, or `module:function`) with `argv` in a warm worker, if one is configured.

    Returns the exit code, or None when the caller should run it itself (no worker configured, or it said why
    not on stderr)."""
    folder = os.environ.get(ENV_SOCKET)
    if not folder or IN_CHILD:  # a forked child forwarding its own command would fork another, without end
        return None
    path = _socket_for(folder, target)
    if path is None:
        print(f"no warm worker in {folder}: running {target} in this process", file=sys.stderr)
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _flush_stdio()
        _send_message(sock, {"target": target, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
        answer, _ = _read_message(sock)
    except OSError as e:
        sock.close()
        print(f"warm worker {path} unreachable ({e}): running {target} in this process", file=sys.stderr)
        return None
    if "refused" in answer:
        sock.close()
        print(f"warm worker: {answer['refused']}: running {target} in this process", file=sys.stderr)
        return None
    child = int(answer["pid"])

    def relay(signum, _frame):  # Ctrl-C / SIGTERM of this client (DVC stopping a stage) reach the child's group
        _signal_group(child, signum)

    previous = {s: signal.signal(s, relay) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        done, _ = _read_message(sock)
    except (OSError, ValueError):
        print(f"warm worker {path} went away while running {target}", file=sys.stderr)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sock.close()
    return int(done["exit"])


def run_target(target: str, argv: list[str]) -> int:
    """Call `module:function()`, or the module's `main()` (the flows' `python -m` entry), or else run the module
    as `__main__` like `python -m`; with sys.argv set. Returns the exit code."""
    module, _, function = target.partition(":")
    sys.argv = [module, *argv]
    try:
        entry = getattr(importlib.import_module(module), function or "main", None)
        if function or callable(entry):
            code = entry()
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as e:
        code = e.code
    finally:  # flows.session's per-stage split: compute and tracking seconds (nothing unless it asked)
        clock.write_record(clock.stage_label(target))
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # SystemExit("error: ...") prints its message and exits 1, as Python does
    return 1


# ----------------------------------------------------------------------------------------------------- worker

def _wait_for_prefect_api(timeout_s: float) -> None:
    """The session's temporary Prefect server starts beside this worker: a stage forked before it answers waits."""
    url = os.environ.get("PREFECT_API_URL", "")
    if not url:
        return
    deadline = time.monotonic() + timeout_s
    while not prefect_api_answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server at {url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.1)


def api_ready() -> bool:
    """With ENV_WAIT_FOR_API (the session's server may still be starting): wait for it, once; False (and one
    `error:` line) when it never answers. Called by flows.common.prefect_api, after the params were checked:
    a bad params key answers at once, not after the server's start."""
    if not os.environ.pop(ENV_WAIT_FOR_API, None):
        return True
    try:
        _wait_for_prefect_api(float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    return True


def mark_child() -> None:
    """This process is a child forked for a command. Set on `flows.warm` as the rest of the code imports it: the
    worker runs as `python -m flows.warm`, whose module is `__main__`, a second copy with globals of its own."""
    global IN_CHILD
    IN_CHILD = True
    importlib.import_module("flows.warm").IN_CHILD = True


def _child(request: dict, fds: list[int], worker_cwd: str) -> int:
    """In the forked child: become the client's process (stdio, cwd, environment, argv) and run its target."""
    mark_child()
    os.setpgid(0, 0)  # its own group: the client's signals reach every process it starts
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
    for target_fd, fd in enumerate(fds[:3]):
        os.dup2(fd, target_fd)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == worker_cwd:  # `python -m` puts the working directory first: the client's
        sys.path[0] = request["cwd"]
    env = {k: v for k, v in request["env"].items() if k != ENV_SOCKET}  # its own subprocesses start cold
    os.environ.clear()
    os.environ.update(env)
    before = set(sys.modules)
    try:
        code = run_target(request["target"], request["argv"])
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # as the interpreter would: the traceback on stderr, exit 1
        traceback.print_exc()
        code = 1
    debug = os.environ.get("UNLEARN_WARM_DEBUG")
    if debug:  # which modules the worker's plans miss: "1" counts them, a folder gets the list per target
        late = sorted(set(sys.modules) - before)
        print(f"warm worker: {request['target']} imported {len(late)} module(s) itself", file=sys.stderr)
        if os.path.isdir(debug):
            with open(os.path.join(debug, request["target"].replace(":", "_") + ".txt"), "w") as f:
                f.write("\n".join(late))
    return code


class Worker:
    """One warm worker: a listening socket, the imports still to do, and the children it forked."""

    def __init__(self, folder: str, level: str, plan: tuple[str, ...], next_plan: tuple[str, ...] = ()):
        self.folder, self.level, self.next_plan = folder, level, next_plan
        self.path = os.path.join(folder, SOCKETS[level])
        self.owner = os.getpid()
        self.cwd = os.getcwd()
        self.settings = _settings(dict(os.environ))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(16)
        self.children: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.plan = list(plan)
        self.successor_started = False

    def _refusal(self, request: dict) -> str | None:
        theirs = _settings(request["env"])
        if theirs != self.settings:
            keys = sorted(k for k in set(theirs) | set(self.settings) if theirs.get(k) != self.settings.get(k))
            return f"settings {', '.join(keys)} differ from the worker's"
        if threading.active_count() > 1:
            return f"the worker has {threading.active_count()} threads (forking it would not be safe)"
        return None

    def _forget_parent_state(self) -> None:
        """In a fork of this worker: close what belongs to the parent (its socket, its clients)."""
        self.listener.close()
        for conn in self.children.values():
            conn.close()
        self.children = {}

    def _accept(self) -> int | None:
        """Answer one client: fork a child for it (returns the exit code in that child), or refuse."""
        conn, _ = self.listener.accept()
        try:
            request, fds = _read_message(conn, with_fds=3)
        except (OSError, ValueError) as e:
            print(f"warm worker: a bad request ({e})", file=sys.stderr)
            conn.close()
            return None
        touch(self.folder)  # a command: a resident worker's idle clock restarts (flows/resident.py)
        why = self._refusal(request)
        if why:
            _send_message(conn, {"refused": why})
            conn.close()
            for fd in fds:
                os.close(fd)
            return None
        module = request["target"].split(":")[0]
        # Import what the target needs first (the plan up to its module; all of it for a module not in the plan):
        # a child forked earlier would import the rest itself while this worker imports it too, on the same cores.
        while self.plan and self._import_next() != module:
            pass
        _flush_stdio()
        if os.environ.get("UNLEARN_WARM_DEBUG"):
            print(f"warm worker ({self.level}, up {time.perf_counter() - STARTED:.1f} s): forking {request['target']}"
                  f"; still to import: {self.plan}", file=sys.stderr, flush=True)
        gc.freeze()  # the imported objects stay out of the child's garbage collections: fewer pages copied
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            self._forget_parent_state()
            conn.close()
            return _child(request, fds, self.cwd)
        for fd in fds:
            os.close(fd)  # the client's pipes must close when the child exits (DVC waits for their EOF)
        _send_message(conn, {"pid": pid})
        self.children[pid] = conn
        return None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            try:
                _send_message(conn, {"exit": code if code >= 0 else 128 - code})  # killed by signal N: 128 + N
            except OSError:
                pass
            conn.close()

    def _client_gone(self, conn: socket.socket) -> None:
        """EOF from a client whose child still runs (the stage was killed): stop that child's group."""
        for pid, c in list(self.children.items()):
            if c is conn:
                _signal_group(pid, signal.SIGTERM)

    def _import_next(self) -> str:
        """Import the next module of the plan (and call its function, for a `module:function` entry); returns
        the module's name."""
        entry = self.plan.pop(0)
        name, _, function = entry.partition(":")
        try:
            module = importlib.import_module(name)
            if function:
                getattr(module, function)()
        except Exception as e:  # the child that needs it does it again and reports the error in its stage
            print(f"warm worker: could not pre-import {entry}: {type(e).__name__}: {e}", file=sys.stderr)
        return name

    def _fork_successor(self) -> None:
        """The early worker is done importing: fork the full worker, which goes on importing (in the fork,
        `self` becomes the full worker)."""
        _flush_stdio()
        if os.fork() != 0:
            return
        die_with_parent()
        self._forget_parent_state()
        self.__init__(self.folder, "full", self.next_plan)

    def serve(self) -> int:
        """The worker's loop; returns only in a forked child (its exit code)."""
        while True:
            watched = [self.listener, *self.children.values()]
            readable, _, _ = select.select(watched, [], [], 0 if self.plan else 0.2)
            for r in readable:
                if r is self.listener:
                    code = self._accept()
                    if code is not None:
                        return code
                elif not r.recv(1, socket.MSG_PEEK):
                    self._client_gone(r)
            self._reap()
            if self.plan:
                self._import_next()
            elif self.level == "early" and not self.successor_started:
                self.successor_started = True
                self._fork_successor()  # in the successor, `self` is now the full worker: the loop goes on

    def close(self) -> None:
        if os.getpid() != self.owner:
            return
        for pid in self.children:
            _signal_group(pid, signal.SIGTERM)
        self.listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def exit_fast(code: int) -> NoReturn:
    """End a forked child as the interpreter would, minus its teardown: first threading's shutdown (waits for
    non-daemon threads and runs their exit hooks: Prefect drains its log and event services to the API there),
    then the atexit handlers, then `os._exit`. The teardown skipped (freeing every module and object) would
    write to every page shared with the worker and copy them all: 3.8 s per child on these machines."""
    _flush_stdio()
    try:
        threading._shutdown()  # private, but it is exactly what Py_FinalizeEx calls first
    finally:
        atexit._run_exitfuncs()
        _flush_stdio()
        os._exit(code)


def _stop(signum, _frame):
    # once: a second SIGTERM (the session's, a process-group kill) arriving while the interpreter runs its atexit
    # handlers raised SystemExit inside one of them ("Exception ignored in atexit callback" and a traceback)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


NICENESS = 3  # below the Prefect server and DVC, which start beside the worker and are on the critical path


def serve(folder: str, early_plan: tuple[str, ...] = EARLY_PLAN, full_plan: tuple[str, ...] = FULL_PLAN) -> NoReturn:
    """Run the early worker in `folder` (it creates early.sock, and its successor full.sock). Never returns: the
    worker ends by SIGTERM (SystemExit), a forked child by `exit_fast`."""
    signal.signal(signal.SIGTERM, _stop)
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    worker = Worker(folder, "early", early_plan, full_plan)
    try:
        code = worker.serve()
    finally:
        worker.close()
    exit_fast(code)  # only a forked child gets here


USAGE = """usage: python -m flows.warm run MODULE[:FUNCTION] [ARGS...]   run it in the warm worker (else here)
       python -m flows.warm serve FOLDER                     the workers (flows.session starts them)"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "run":
        from flows.idle import nothing_to_do

        if nothing_to_do(args[1], args[2:]):  # qualify under per_batch, an empty inbox: no server, no imports
            return 0
        from flows.session import join_session

        join_session()  # a plain `dvc repro`: one session for all its stages (flows/session.py)
        code = forward(args[1], args[2:])
        return run_target(args[1], args[2:]) if code is None else code
    if len(args) == 2 and args[0] == "serve":
        serve(args[1])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
