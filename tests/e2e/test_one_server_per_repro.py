"""A project of one's own runs at the speed of `make run`: a project scaffolded by `unlearn init` (digits as a
user's CSV) processes two batches through the documented command, `unlearn repro` (dvc repro, unlearn erase,
unlearn status in one session), each run with exactly one Prefect server and none left behind; a plain
`dvc repro` of a third batch also starts one server for all its stages (the first stage starts the session,
the next ones join it), and a `dvc repro` with nothing to do starts none.

Servers are seen as in tests/e2e/test_no_orphan_server.py (uvicorn processes), told apart from other
projects' by this test's PREFECT_HOME in their environment."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def servers_of(prefect_home: str) -> set[int]:
    """The uvicorn (Prefect server) processes whose environment names `prefect_home`."""
    found = set()
    marker = f"PREFECT_HOME={prefect_home}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"uvicorn" not in (proc / "cmdline").read_bytes():
                continue
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.add(int(proc.name))
        except OSError:
            continue
    return found


def run_watched(cmd: list[str], cwd: Path, env: dict, timeout: float = 900) -> tuple[str, set[int]]:
    """Run `cmd`; returns its output and every server of this test's PREFECT_HOME seen while it ran."""
    seen: set[int] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.update(servers_of(env["PREFECT_HOME"]))
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        done.set()
        t.join()
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr, seen


def none_left(prefect_home: str, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while servers_of(prefect_home):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def drop_request(proj: Path, name: str, ids: list[str]) -> None:
    pd.DataFrame({"request_id": [f"{name}-{i}" for i in range(len(ids))], "sample_id": ids,
                  "requested_at": "2026-12-01T08:00:00Z", "reason": "user asked"}).to_csv(
        proj / "requests" / "inbox" / f"{name}.csv", index=False)


def write_digits_csv(path: Path, n: int = 600) -> Path:
    """The first `n` digits as a user's CSV (id, 64 pixels, digit, split: every fifth row val)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    table = pd.DataFrame(d.data[:n], columns=[f"p{i}" for i in range(64)])
    table.insert(0, "id", [f"img-{i:04d}" for i in range(len(table))])
    table["digit"] = d.target[:n]
    table["split"] = ["val" if i % 5 == 4 else "train" for i in range(len(table))]
    table.to_csv(path, index=False)
    return path


def init_digits_project(tmp_path: Path) -> tuple[Path, str, dict, list[str], str]:
    """(project, its PREFECT_HOME, the commands' environment, `unlearn`, init's output): `unlearn init` of the
    digits CSV in tmp_path/mine, with a Prefect home of its own and no server or worker of the caller's."""
    write_digits_csv(tmp_path / "digits.csv")
    proj, home = tmp_path / "mine", str(tmp_path / "prefect")
    env = {**os.environ, "PREFECT_HOME": home, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "UNLEARN_WARM_WORKER", "UNLEARN_NO_SESSION"):
        env.pop(key, None)
    unlearn = [sys.executable, "-m", "flows.cli"]
    out, _ = run_watched([*unlearn, "init", str(proj), "--dataset", "table", "--path", str(tmp_path / "digits.csv"),
                          "--id-column", "id", "--label-column", "digit", "--split-column", "split"], tmp_path, env)
    return proj, home, env, unlearn, out


def test_two_batches_through_unlearn_repro_start_one_server_each(tmp_path):
    proj, home, env, unlearn, out = init_digits_project(tmp_path)  # the ids below: train rows
    assert "unlearn repro" in out  # the next step it names

    drop_request(proj, "2026-12-01T0900_first", ["img-0003", "img-0010"])
    out, seen = run_watched([*unlearn, "repro"], proj, env)
    assert "Running stage 'train'" in out and "promoted" in out and "finished 1 pending erasure(s)" in out, out[-3000:]
    assert len(seen) == 1, f"servers started by the first `unlearn repro`: {sorted(seen)}"
    assert none_left(home), "a Prefect server outlived `unlearn repro`"

    drop_request(proj, "2026-12-01T1000_second", ["img-0020"])
    out, seen = run_watched([*unlearn, "repro"], proj, env)
    # one row the model never memorized: licensed (the model unchanged, docs/design.md §4.9) or retrained
    applied = "promoted" in out or "forgotten with the model unchanged" in out
    assert applied and "3 request(s) in 2 batch(es)" in out, out[-3000:]
    assert len(seen) == 1, f"servers started by the second `unlearn repro`: {sorted(seen)}"
    assert none_left(home), "a Prefect server outlived `unlearn repro`"

    # plain `dvc repro`: one session for all its stages, started by the first that has work
    drop_request(proj, "2026-12-01T1100_third", ["img-0030"])
    out, seen = run_watched([sys.executable, "-m", "dvc", "repro"], proj, env)
    assert "promoted" in out or "forgotten with the model unchanged" in out, out[-3000:]
    assert len(seen) == 1, f"servers started by a plain `dvc repro`: {sorted(seen)}"
    assert none_left(home), "the session of a plain `dvc repro` outlived it"
    assert not list((proj / ".unlearning" / "sessions").glob("*.json"))

    # nothing to do: no stage runs (after `unlearn erase`), so no server starts
    run_watched([*unlearn, "erase"], proj, env)
    out, seen = run_watched([sys.executable, "-m", "dvc", "repro"], proj, env)
    assert not seen, out[-3000:]
