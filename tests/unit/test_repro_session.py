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
