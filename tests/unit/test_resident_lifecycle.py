"""`unlearn up` / `unlearn down` (flows/resident.py): the record of a project's resident server and worker, when a
command may use it, its idle clock and busy check, and that a command forked in a worker never forwards again
(fast: no server is started; tests/e2e covers the real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import flows.resident as resident
import flows.warm as warm
from flows.procs import ENV_SOCKET


def record(project, **kw):
    folder = project / "worker"
    folder.mkdir(exist_ok=True)
    (folder / "early.sock").touch()
    info = {"pid": os.getpid(), "api_url": "http://127.0.0.1:9/api", "folder": str(folder), "idle_s": 600.0,
            "started": time.time(), "code": resident.code_stamp(), "project": str(project),
            "settings": resident.settings_digest(os.environ), **kw}
    path = resident.record_path(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))
    return info


def test_a_record_is_used_only_when_its_process_runs_its_code_and_its_settings_match(tmp_path, monkeypatch):
    assert resident.usable(tmp_path) == (None, None)
    info = record(tmp_path)
    monkeypatch.setattr(resident, "prefect_api_answers", lambda url: True)
    assert resident.usable(tmp_path) == (info, None)
    used = os.path.join(info["folder"], resident.USED)
    open(used, "w").close()
    os.utime(used, (1.0, 1.0))  # last used long ago
    env = resident.use(info, {})
    assert env["PREFECT_API_URL"] == env["UNLEARN_TEMPORARY_SERVER"] == info["api_url"]
    assert env[ENV_SOCKET] == info["folder"] and os.stat(used).st_mtime > 1.0  # the use restarted the idle clock
    other = {**os.environ, "PREFECT_LOGGING_LEVEL": "DEBUG"}  # a worker serves only its own settings
    assert resident.usable(tmp_path, other)[1].startswith("this command's Prefect or MLflow settings")
    assert "DEBUG" not in resident.record_path(tmp_path).read_text()  # a digest, never the values
    record(tmp_path, code="0" * 16)
    assert "older version of the code" in resident.usable(tmp_path)[1]
    record(tmp_path)
    monkeypatch.setattr(resident, "prefect_api_answers", lambda url: False)
    assert "does not answer" in resident.usable(tmp_path)[1]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record(tmp_path, pid=dead.pid)  # killed without cleaning up: the record goes
    assert resident.usable(tmp_path) == (None, None) and not resident.record_path(tmp_path).exists()


def test_status_says_when_it_stops(tmp_path):
    assert resident.status_line(tmp_path).startswith("resident server: none (`unlearn up`")
    info = record(tmp_path, idle_s=1800.0)
    resident.touch(info["folder"])
    os.utime(os.path.join(info["folder"], resident.USED), (time.time() - 600, time.time() - 600))
    line = resident.status_line(tmp_path)
    assert f"pid {os.getpid()}" in line and "idle 10 min, stops after 30 min idle (in 20 min)" in line


def test_busy_counts_the_commands_below_the_worker_not_the_full_worker(tmp_path):
    parents = {10: 1, 11: 10, 12: 11, 13: 12, 20: 1}  # 10 the worker, 11 its full worker, 12 a command, 13 its dvc
    assert resident.descendants(10, parents) == [11, 12, 13]
    (tmp_path / "full.sock").touch()
    assert resident.busy(10, str(tmp_path), parents)
    assert not resident.busy(10, str(tmp_path), {10: 1, 11: 10, 20: 1})


def test_a_forked_child_never_forwards_its_command_again(tmp_path, monkeypatch):
    """A child of the worker that ran `unlearn X` found the resident (its environment has no socket) and forwarded
    to the worker, whose child did the same: without the guard, a fork without end."""
    import flows.cli as cli

    monkeypatch.setenv(ENV_SOCKET, str(tmp_path))
    monkeypatch.setattr(warm, "IN_CHILD", True)
    monkeypatch.setattr(warm, "_socket_for", lambda *a: 1 / 0)  # not even looked up
    assert warm.forward("flows.cli:main", ["status"]) is None
    monkeypatch.delenv(ENV_SOCKET)
    monkeypatch.setattr(resident, "usable", lambda *a: 1 / 0)
    monkeypatch.setattr(sys, "argv", ["unlearn", "methods"])
    assert cli.main() == 0  # ran here, the resident never consulted


def test_which_commands_a_resident_worker_runs(tmp_path):
    from flows.cli import _resident_project

    assert _resident_project(["status"]) == os.getcwd()
    assert _resident_project(["--params", str(tmp_path / "params.yaml"), "plan", "x.csv"]) == str(tmp_path)
    assert _resident_project([f"--params={tmp_path}/params.yaml", "run"]) == str(tmp_path)
    for cmd in ("up", "down", "init", "ui", "repro", "methods"):  # its own lifecycle, a server, or a session
        assert _resident_project([cmd]) is None


def test_the_child_mark_reaches_the_module_the_code_imports(monkeypatch):
    """The worker runs as `python -m flows.warm` (module `__main__`): marking only its own globals left
    `flows.warm.IN_CHILD` False in the child, and `unlearn erase` forked children without end."""
    import importlib.util

    monkeypatch.setattr(warm, "IN_CHILD", False)
    spec = importlib.util.spec_from_file_location("__main__as_worker", warm.__file__)
    as_main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(as_main)
    as_main.mark_child()
    assert as_main.IN_CHILD and warm.IN_CHILD
