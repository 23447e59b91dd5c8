"""`unlearn up` / `unlearn down` (flows/resident.py) in a project of `unlearn init`: a batch through `unlearn repro`
uses the resident Prefect server and warm worker (no server of its own), `unlearn status` shows them, `unlearn
down` stops them with nothing left behind, and an idle one stops by itself."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from adapters.pids import pid_alive
from tests.e2e.test_one_server_per_repro import drop_request, init_digits_project, none_left, run_watched, servers_of

pytestmark = pytest.mark.slow


def test_a_resident_server_serves_the_batches_until_down_or_idle(tmp_path):
    proj, home, env, unlearn, _ = init_digits_project(tmp_path)
    run_watched([*unlearn, "repro"], proj, env)  # prepare and train, an empty inbox
    record = proj / ".unlearning" / "resident.json"
    try:
        out, _ = run_watched([*unlearn, "up", "--idle-minutes", "10"], proj, env)
        assert "resident Prefect server and warm worker up" in out and record.exists(), out
        info = json.loads(record.read_text())
        resident_servers = servers_of(home)
        assert len(resident_servers) == 1
        out, _ = run_watched([*unlearn, "status"], proj, env)
        assert "resident server: up since" in out and f"pid {info['pid']}" in out, out

        drop_request(proj, "2026-12-01T0900_first", ["img-0003", "img-0010"])
        out, seen = run_watched([*unlearn, "repro"], proj, env)
        assert "the resident Prefect server and warm worker of this project (`unlearn up`)" in out, out[-3000:]
        assert "promoted" in out and "plan vs actual: predicted" in out, out[-3000:]
        assert seen == resident_servers, f"`unlearn repro` started a server of its own: {sorted(seen)}"
        assert "not using the resident server" not in out and "running flows" not in out, out[-3000:]

        out, _ = run_watched([*unlearn, "down"], proj, env)
        assert "stopped" in out and not record.exists() and not pid_alive(info["pid"])
        assert none_left(home), "a resident server outlived `unlearn down`"

        # idle: it stops by itself once no command used it for --idle-minutes (here 6 s)
        run_watched([*unlearn, "up", "--idle-minutes", "0.1"], proj, env)
        pid = json.loads(record.read_text())["pid"]
        deadline = time.monotonic() + 60
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not pid_alive(pid) and not record.exists() and none_left(home)
    finally:
        if record.exists():
            subprocess.run([*unlearn, "down"], cwd=proj, env=env, capture_output=True, timeout=300)
