"""`unlearn repro` and the session a plain `dvc repro` shares (flows/session.py): the commands it runs, how
a stage finds its run's session, and that a stale record is never joined."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import flows.session as session
from tests.helpers import make_project


def test_unlearn_repro_runs_dvc_repro_erase_and_status_in_one_session(tmp_path, monkeypatch):
    import flows.cli as cli

    params_path = make_project(tmp_path / "p", inbox_files=False)
    calls = []
    monkeypatch.setattr(session, "main", lambda argv: calls.append(argv) or 0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--params", str(params_path), "repro", "deletion"]) == 0
    assert os.getcwd() == str(params_path.parent)  # dvc repro runs in the project folder
    argv = calls[0]
    parts = " ".join(os.path.basename(a) for a in argv).split(" --then ")
    assert parts[0] == "dvc repro deletion"
    assert parts[1].endswith("erase") and parts[2].endswith("status"), parts


def test_a_stage_not_under_dvc_starts_no_session(monkeypatch):
    env = {"PATH": os.environ["PATH"]}
    assert session.dvc_ancestor() is None  # pytest's parents: no dvc
    assert session.join_session(env) is None and env == {"PATH": os.environ["PATH"]}
    env = {"UNLEARN_NO_SESSION": "1"}
    monkeypatch.setattr(session, "dvc_ancestor", lambda: 1 / 0)  # not even looked up
    assert session.join_session(env) is None


def test_a_stage_joins_its_runs_session_and_never_a_stale_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands in for `dvc`
    try:
        monkeypatch.setattr(session, "dvc_ancestor", lambda: owner.pid)
        path = tmp_path / session.session_file(owner.pid)
        path.parent.mkdir(parents=True)
        info = {"pid": os.getpid(), "owner": owner.pid, "api_url": "http://127.0.0.1:1/api", "folder": "/x"}
        path.write_text(json.dumps(info))
        env: dict = {}
        assert session.join_session(env) == info["api_url"]
        assert env["PREFECT_API_URL"] == info["api_url"] and env["UNLEARN_WARM_WORKER"] == "/x"
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        path.write_text(json.dumps({**info, "pid": dead.pid}))  # a session killed without cleaning up
        assert session.read_session(owner.pid) is None
    finally:
        owner.kill()
        owner.wait()
    assert session.read_session(owner.pid) is None  # its dvc is gone


FAKE_SESSION = """
import json, os, sys, time
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "write":
    path = os.path.join(".unlearning", "sessions", sys.argv[1] + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "owner": int(sys.argv[1]), "api_url": "http://127.0.0.1:1/api", "folder": "/x"}, f)
    os.replace(path + ".tmp", path)
    time.sleep(60)
"""


def test_a_stage_waits_for_a_slow_session_instead_of_starting_a_second_server(tmp_path, monkeypatch):
    """A session that writes its record after SESSION_WAIT_S (a loaded machine) is still joined; one that ends
    without a record is not waited for."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "SESSION_WAIT_S", 0.1)  # the session writes after 1 s: later than this
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands in for `dvc`
    (tmp_path / session.SESSIONS_DIR).mkdir(parents=True)
    started = []
    try:
        monkeypatch.setattr(session, "dvc_ancestor", lambda: owner.pid)

        def fake_session(behaviour):
            def start(pid, env):
                proc = subprocess.Popen([sys.executable, "-c", FAKE_SESSION, str(pid), *behaviour],
                                        start_new_session=True)
                started.append(proc)
                return proc
            return start

        monkeypatch.setattr(session, "start_session", fake_session(["1.0", "write"]))
        env: dict = {}
        assert session.join_session(env) == "http://127.0.0.1:1/api" and env["UNLEARN_WARM_WORKER"] == "/x"
        assert started[-1].poll() is None  # the session it joined runs on
        started[-1].kill()
        started[-1].wait()
        monkeypatch.setattr(session, "start_session", fake_session(["0", "exit"]))
        env = {}
        assert session.join_session(env) is None and env == {}  # no session: the stage runs with its own server
        assert started[-1].poll() == 0
    finally:
        for proc in (owner, *started):
            proc.kill()
            proc.wait()
