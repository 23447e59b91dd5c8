"""Benchmark: `make run`'s session, warm (one server, the warm worker) against cold (`--cold`: every stage and
command in a process of its own, each stage with the session's server), on fresh copies of the project.

Each run copies the project's files (tests.helpers.copy_project) to a temporary folder (its own PREFECT_HOME
and MLflow store, both prepared as `make setup` does: Prefect migrated and stamped, the MLflow store created),
then times `python -m flows.session [--cold] dvc repro deletion --then unlearn erase --then unlearn status`
on the digits
default and its sample request file. The session's own split (compute: task bodies; tracking: MLflow calls
and review figures; orchestration: the rest) is read from its report (UNLEARN_SESSION_REPORT). Warm and cold
runs alternate (`--repeats` pairs; other processes share the 2 cores: the load average is recorded); the
table shows the median of each mode, and the ratio cold / warm of the wall time.

Targets: warm wall time <= 45 s on a quiet 2-core machine; overhead (tracking + orchestration)
<= 25 % of it.

The floor: with compute C, overhead O <= 25 % of C + O means O <= C / 3. The bench also times, alone on the
machine, the two costs that sit on the critical path before any stage's first task can start: the temporary
Prefect server's start (no flow run exists before it answers) and the import of what the first stage needs
(the warm worker's EARLY_PLAN, in a fresh interpreter). Each, against C / 3, says whether the 25 % target is
reachable at this compute without a server and a worker that outlive `make run`.

The resident mode measures that last option: a started Prefect server (`prefect server start`, as `make server`)
and a warm worker, both started and settled (their imports done, their CPU idle) before the clock starts, then
the same commands (the session starts neither: PREFECT_API_URL is set, and `--cold` with UNLEARN_WARM_WORKER
naming the resident worker's folder forwards every stage and command to it). What it leaves is the overhead
no start-up cost explains: per-stage orchestration (DVC, flow and task runs) and tracking.
Usage: python bench/session_overhead.py [--repeats 1] [--out bench/results/session_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_json  # noqa: E402  (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))
from tests.helpers import copy_project  # noqa: E402  (the e2e tests' copy: the project's files + the sample request)


def prepared_env(proj: Path) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(proj / ".prefect"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # as the Makefile sets them
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "UNLEARN_WARM_WORKER", "UNLEARN_TIMINGS"):
        env.pop(key, None)
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    subprocess.run([str(BIN / "prefect"), "server", "database", "upgrade", "-y"], cwd=proj, env=env, check=True,
                   capture_output=True)
    import importlib.metadata

    (proj / ".prefect" / "prefect.db.version").write_text(importlib.metadata.version("prefect"))
    subprocess.run([sys.executable, "-m", "flows.stores"], cwd=proj, env=env, check=True, capture_output=True)
    return env


MODES = ("warm", "cold", "resident")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settle(pids: list[int], quiet_s: float = 2.0, timeout_s: float = 180.0) -> None:
    """Wait until the processes `pids` and their children used no CPU for `quiet_s` (their imports are done)."""
    import psutil

    def cpu() -> float:
        total = 0.0
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                for p in (proc, *proc.children(recursive=True)):
                    t = p.cpu_times()
                    total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    deadline = time.monotonic() + timeout_s
    last = cpu()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu()
        if now - last < 0.05 * quiet_s:
            return
        last = now
    raise SystemExit(f"processes {pids} were still busy after {timeout_s:.0f} s")


def start_resident(proj: Path, env: dict, folder: Path) -> tuple[list[subprocess.Popen], dict]:
    """A started Prefect server and a warm worker in `folder`, both settled; returns them and the commands' env."""
    from flows.warm import ENV_SOCKET, prefect_api_answers

    api = f"http://127.0.0.1:{free_port()}/api"
    env = {**env, "PREFECT_API_URL": api}
    port = api.rsplit(":", 1)[1].split("/")[0]
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
                              cwd=proj, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    worker = subprocess.Popen([sys.executable, "-m", "flows.warm", "serve", str(folder)], cwd=proj, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not prefect_api_answers(api):
        if server.poll() is not None or time.monotonic() > deadline:
            stop_group([server, worker])
            raise SystemExit(f"the started Prefect server at {api} did not answer")
        time.sleep(0.2)
    while not (folder / "full.sock").exists():  # the full worker exists once the early plan is imported
        time.sleep(0.2)
    settle([server.pid, worker.pid])
    return [server, worker], {**env, ENV_SOCKET: str(folder)}


def stop_group(procs: list[subprocess.Popen]) -> None:
    import signal

    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def one_run(mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="session-bench-") as tmp:
        proj = Path(tmp) / "proj"
        copy_project(proj)
        env = prepared_env(proj)
        resident: list[subprocess.Popen] = []
        if mode == "resident":
            folder = Path(tmp) / "worker"
            folder.mkdir()
            resident, env = start_resident(proj, env, folder)
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "flows.session", *([] if mode == "warm" else ["--cold"]),
               str(BIN / "dvc"), "repro", "deletion", "--then", str(BIN / "unlearn"), "erase",
               "--then", str(BIN / "unlearn"), "status"]
        load = os.getloadavg()[0]
        started = time.perf_counter()
        try:
            res = subprocess.run(cmd, cwd=proj, env={**env, "UNLEARN_SESSION_REPORT": str(report)},
                                 capture_output=True, text=True, timeout=1800)
        finally:
            wall = time.perf_counter() - started
            stop_group(resident)
        if res.returncode != 0:
            raise SystemExit(f"{mode} session failed (rc {res.returncode}):\n"
                             f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        if mode == "resident" and ("running flows." in res.stderr or "no warm worker" in res.stderr):
            raise SystemExit(f"resident session: a command did not reach the resident worker:\n{res.stderr[-3000:]}")
        out = json.loads(report.read_text())
        return {"mode": mode, "command_wall_s": round(wall, 2), "load_avg_1m": load, **out}


def server_start_s(proj: Path, env: dict) -> float:
    """Seconds until the session's temporary server (flows.session.ServerProcess) answers, nothing beside it."""
    from flows.session import ServerProcess, _terminate

    server = ServerProcess(env)
    try:
        while server.up_after is None:
            if server.proc.poll() is not None:
                raise SystemExit(f"the Prefect server exited with {server.proc.returncode}")
            time.sleep(0.05)
        return round(server.up_after, 2)
    finally:
        _terminate(server.proc)


def first_stage_imports_s(proj: Path, env: dict) -> float:
    """Seconds a fresh interpreter takes to import the warm worker's EARLY_PLAN (what prepare and train need)."""
    code = ("import importlib, time; t = time.perf_counter(); from flows.warm import EARLY_PLAN\n"
            "for m in EARLY_PLAN: importlib.import_module(m.partition(':')[0])\n"
            "print(time.perf_counter() - t)")
    res = subprocess.run([sys.executable, "-c", code], cwd=proj, env=env, check=True, capture_output=True, text=True)
    return round(float(res.stdout.strip().splitlines()[-1]), 2)


def floor(repeats: int) -> dict:
    """The critical-path costs before a first task can start, each measured alone (medians of `repeats`)."""
    with tempfile.TemporaryDirectory(prefix="session-bench-floor-") as tmp:
        proj = Path(tmp) / "proj"
        copy_project(proj)
        env = prepared_env(proj)
        server = [server_start_s(proj, env) for _ in range(repeats)]
        imports = [first_stage_imports_s(proj, env) for _ in range(repeats)]
    return {"server_start_alone_s": round(statistics.median(server), 2),
            "first_stage_imports_alone_s": round(statistics.median(imports), 2),
            "server_start_runs_s": server, "first_stage_imports_runs_s": imports}


def median_of(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of warm, cold and resident runs (default 1)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "session_overhead.json"))
    a = ap.parse_args()
    runs = []
    for i in range(a.repeats):
        for mode in MODES:
            r = one_run(mode)
            runs.append(r)
            print(f"[{i + 1}/{a.repeats}] {r['mode']}: {r['total_s']:.1f} s, overhead {r['overhead_share']:.0%} "
                  f"(load {r['load_avg_1m']:.1f})", flush=True)
    summary = {}
    print(f"\n{'mode':<8} {'wall':>7} {'compute':>8} {'tracking':>9} {'orchestration':>14} {'overhead':>9}")
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {k: median_of(mine, k) for k in ("total_s", "compute_s", "tracking_s", "orchestration_s",
                                                          "overhead_share")}
        s = summary[mode]
        print(f"{mode:<8} {s['total_s']:6.1f}s {s['compute_s']:7.1f}s {s['tracking_s']:8.1f}s "
              f"{s['orchestration_s']:13.1f}s {s['overhead_share']:8.0%}")
    ratio = summary["cold"]["total_s"] / summary["warm"]["total_s"]
    print(f"cold / warm wall time: {ratio:.2f}x; warm target <= 45 s: "
          f"{'met' if summary['warm']['total_s'] <= 45 else 'NOT met'}; overhead target <= 25 %: "
          f"{'met' if summary['warm']['overhead_share'] <= 0.25 else 'NOT met'}")
    print(f"resident (a started server and worker, both settled before the clock): "
          f"{summary['resident']['total_s']:.1f} s, overhead {summary['resident']['overhead_share']:.0%} "
          f"(target <= 25 %: {'met' if summary['resident']['overhead_share'] <= 0.25 else 'NOT met'})")
    costs = floor(max(a.repeats, 3))
    allowed = summary["warm"]["compute_s"] / 3
    costs["overhead_allowed_by_25pct_s"] = round(allowed, 2)
    print(f"\nthe floor (each alone, median of {len(costs['server_start_runs_s'])}): the temporary Prefect server "
          f"answers after {costs['server_start_alone_s']:.1f} s; the first stage's imports take "
          f"{costs['first_stage_imports_alone_s']:.1f} s.\nthe 25 % target allows compute / 3 = {allowed:.1f} s of "
          f"overhead in all: the server's start alone is {costs['server_start_alone_s'] / allowed:.1f}x that.")
    write_json(a.out, {"what": "make run's session: warm, cold, and resident (a started server and worker)", "cpu_count": os.cpu_count(),
                       "summary": summary, "cold_over_warm": round(ratio, 2), "floor": costs, "runs": runs})


if __name__ == "__main__":
    main()
