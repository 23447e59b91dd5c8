"""`unlearn up` / `unlearn down` (flows/resident.py) in a project of `unlearn init`: a batch through `unlearn repro`
uses the resident Prefect server and warm worker (no server of its own), `unlearn status` shows them, `unlearn
down` stops them with nothing left behind, and an idle one stops by itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from flows.procs import pid_alive
from tests.e2e.test_one_server_per_repro import drop_request, none_left, run_watched, servers_of

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_resident_server_serves_the_batches_until_down_or_idle(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    table = pd.DataFrame(d.data[:600], columns=[f"p{i}" for i in range(64)])
    table.insert(0, "id", [f"img-{i:04d}" for i in range(len(table))])
    table["digit"] = d.target[:600]
    table["split"] = ["val" if i % 5 == 4 else "train" for i in range(len(table))]
    table.to_csv(tmp_path / "digits.csv", index=False)
    proj = tmp_path / "mine"
    home = str(tmp_path / "prefect")
    env = {**os.environ, "PREFECT_HOME": home, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "UNLEARN_WARM_WORKER", "UNLEARN_NO_SESSION"):
        env.pop(key, None)
    unlearn = [sys.executable, "-m", "flows.cli"]
    run_watched([*unlearn, "init", str(proj), "--dataset", "table", "--path", str(tmp_path / "digits.csv"),
                 "--id-column", "id", "--label-column", "digit", "--split-column", "split"], tmp_path, env)
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
