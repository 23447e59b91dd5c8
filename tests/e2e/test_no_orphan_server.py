"""A killed batch leaves no Prefect server behind (no leftovers from crashes).

Without PREFECT_API_URL a flow process starts a temporary Prefect server; Prefect's own outlives a kill -9
of its parent. flows.common.prefect_api starts it with the parent-death signal instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.pids import pid_alive as alive
from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def uvicorn_children_of(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat[3]) == pid and "uvicorn" in cmdline:
            out.append(int(proc.name))
    return out


def test_kill_9_of_a_flow_process_stops_its_temporary_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from flows.common import prefect_api\n"
            "with prefect_api() as url:\n"
            "    print('API', url, flush=True); time.sleep(600)\n") % str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("API http://127.0.0.1:"), line
        servers = uvicorn_children_of(proc.pid)
        assert len(servers) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 15
        while time.time() < deadline and alive(servers[0]):
            time.sleep(0.2)
        assert not alive(servers[0]), "the temporary Prefect server outlived its killed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
