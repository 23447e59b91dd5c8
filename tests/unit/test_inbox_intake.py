"""An inbox entry `dvc repro` cannot hash (a dangling symlink, a FIFO) leaves for requests/rejected/ before DVC
hashes the deletion stage's inbox dependency (flows/intake.py, flows/session.py), so it blocks no other file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_project

ROOT = Path(__file__).resolve().parents[2]


def test_intake_moves_what_dvc_cannot_hash_and_leaves_the_rest(tmp_path, capsys):
    from flows.intake import intake

    params = make_project(tmp_path / "p", inbox_files=False)
    inbox = tmp_path / "p" / "requests" / "inbox"
    os.symlink(tmp_path / "nonexistent", inbox / "x.csv")
    os.mkfifo(inbox / "pipe.csv")
    (inbox / "good.csv").write_text("request_id,sample_id,requested_at,reason\n")
    (inbox / "notes.txt").write_text("hashable: the flow itself rejects it")
    assert intake(str(params)) == 2
    rejected = tmp_path / "p" / "requests" / "rejected"
    assert sorted(p.name for p in inbox.iterdir()) == ["good.csv", "notes.txt"]
    report = json.loads((rejected / "x.csv.error.json").read_text())
    assert report["problems"] == [f"a dangling symlink (to {tmp_path / 'nonexistent'}, which does not exist); refused: "
                                  f"remove the link, or put the request file itself in the inbox"]
    assert (rejected / "x.csv").is_symlink()
    assert "FIFO" in json.loads((rejected / "pipe.csv.error.json").read_text())["problems"][0]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pipe.csv: not a regular file") and out[1].startswith("x.csv: a dangling symlink")
    assert out[-1].startswith("error: 2 file(s) rejected and moved to requests/rejected/")
    assert intake(str(params)) == 0  # nothing left to move


@pytest.mark.parametrize("cmd,reads", [
    (["dvc", "repro", "deletion"], True), (["/v/bin/dvc", "repro"], True), (["py", "-m", "dvc", "repro"], True),
    (["dvc", "repro", "-f", "-s", "deletion"], True), (["dvc", "repro", "train"], False),
    (["dvc", "repro", "report/dvc.yaml"], False), (["unlearn", "erase"], False), (["dvc", "status"], False)])
def test_the_session_runs_the_intake_before_a_repro_reaching_the_deletion_stage(cmd, reads):
    from flows.session import repro_reads_inbox

    assert repro_reads_inbox(cmd) is reads


def test_a_dangling_symlink_no_longer_blocks_dvc_repro_deletion(tmp_path):
    """A real `dvc repro deletion` through the session on a one-stage DVC project whose deletion stage depends
    on the inbox: without the intake DVC dies hashing the link ([Errno 2]) and the good file waits."""
    proj = tmp_path / "p"
    make_project(proj, inbox_files=False)
    (proj / "dvc.yaml").write_text("stages:\n  deletion:\n    cmd: ls requests/inbox > applied.txt\n"
                                   "    deps: [requests/inbox]\n    outs: [{applied.txt: {cache: false}}]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": "http://127.0.0.1:9/api"}  # no server needed
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=proj, env=env, check=True)
    inbox = proj / "requests" / "inbox"
    os.symlink("/nonexistent", inbox / "x.csv")
    (inbox / "good.csv").write_text("request_id,sample_id,requested_at,reason\n")
    res = subprocess.run([sys.executable, "-m", "flows.session", "--cold", sys.executable, "-m", "dvc", "repro",
                          "deletion"], cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert "No such file or directory" not in out, out
    assert res.returncode == 2, out  # a rejected entry fails the run, after the stage ran for the others
    assert (proj / "applied.txt").read_text().split() == ["good.csv"]
    assert (proj / "requests" / "rejected" / "x.csv.error.json").exists()
    assert "x.csv: a dangling symlink (to /nonexistent, which does not exist); refused: remove the link" in out
