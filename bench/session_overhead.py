"""Benchmark: `make run`'s session, warm (one server, the warm worker) against cold (`--cold`: every stage and
command in a process of its own, each stage with the session's server), on fresh copies of the project.

Each run copies the project's files (bench/project_copy.py copy_project) to a temporary folder (its own PREFECT_HOME
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

A project of one's own (`--only init`, and by default after the modes above): digits written as a user's CSV,
`unlearn init`, then the documented commands, each timed by its wall clock: the first `unlearn repro`
(prepare, train, a first batch), one more 20-row batch through `unlearn repro` (the session's split per stage:
overhead = wall minus compute; the batch's fixed costs = its deletion stage minus the training the flow
reports, plus `unlearn erase`, written to the project's .unlearning/fixed_costs.json for `unlearn plan`:
unlearning/planning/overhead.py), a `dvc repro` with nothing to do, the read-only commands (status, ids, lookup,
validate, verify-erasure, plan), and `--stream N` batches of one request file each (`unlearn repro`).
The table goes to docs/evidence.md between the bench:session:begin/end markers.
Usage: python bench/session_overhead.py [--repeats 1] [--only make-run|init] [--stream 20]
       [--out bench/results/session_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_between, write_json  # noqa: E402  (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))
from adapters.tracking import REQUESTS_ENV  # noqa: E402  (the variable that counts MLflow's requests)
from project_copy import copy_project  # noqa: E402  (the project's files + the sample request)


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
        report, requests = Path(tmp) / "report.json", Path(tmp) / "mlflow-requests.tsv"
        cmd = [sys.executable, "-m", "flows.session", *([] if mode == "warm" else ["--cold"]),
               str(BIN / "dvc"), "repro", "deletion", "--then", str(BIN / "unlearn"), "erase",
               "--then", str(BIN / "unlearn"), "status"]
        load = os.getloadavg()[0]
        started = time.perf_counter()
        try:
            res = subprocess.run(cmd, cwd=proj, env={**env, "UNLEARN_SESSION_REPORT": str(report),
                                                     REQUESTS_ENV: str(requests)},
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
        return {"mode": mode, "command_wall_s": round(wall, 2), "load_avg_1m": load, **out,
                "mlflow_requests": mlflow_requests(requests)}


def mlflow_requests(path: Path) -> dict:
    """The batch's MLflow requests, by stage (adapters/tracking.py `count_request`: "call", a store call of the
    tracker; "http", a request to a tracking server, 0 on the local SQLite store). A team server checks the login
    of each HTTP request: their number is what tracking costs there (docs/operations.md)."""
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        label, kind = line.split("\t")[:2]
        stage = "deletion" if label == "deletion" else "erase" if label.endswith("erase") else "other"
        out.setdefault(stage, {"call": 0, "http": 0})[kind] += 1
    return out


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


# ---------------------------------------------------------------------------- a project made by `unlearn init`
TOOK = re.compile(r"plan vs actual: predicted [\d.]+ s .*?, took ([\d.]+) s")
TARGETS = {"one batch: overhead (wall - compute)": 15.0, "dvc repro, nothing to do": 5.0, "status": 3.0,
           "verify-erasure": 10.0, "stream: per batch": 10.0}


def timed(cmd: list[str], proj: Path, env: dict, report: Path | None = None) -> tuple[float, str, dict]:
    """(wall seconds, output, the session's report when `report`): the command must succeed."""
    env = {**env, **({"UNLEARN_SESSION_REPORT": str(report), REQUESTS_ENV: str(report.with_suffix(".tsv"))}
                     if report else {})}
    started = time.perf_counter()
    res = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    if not report:
        return round(wall, 2), res.stdout + res.stderr, {}
    return round(wall, 2), res.stdout + res.stderr, {**json.loads(report.read_text()),
                                                     "mlflow_requests": mlflow_requests(report.with_suffix(".tsv"))}


def drop(proj: Path, name: str, ids: list[str], folder: Path | None = None) -> Path:
    """A request file naming `ids`, in the project's inbox (or in `folder`)."""
    path = (folder or proj / "requests" / "inbox") / f"{name}.csv"
    lines = ["request_id,sample_id,requested_at,reason"] + [f"{name}-{i},{x},2026-12-01T08:00:00Z,bench"
                                                              for i, x in enumerate(ids)]
    path.write_text("\n".join(lines) + "\n")
    return path


def init_project(tmp: Path, stream: int) -> dict:
    """The init'd project's commands, timed (see the module docstring)."""
    from sklearn.datasets import load_digits
    import pandas as pd

    from unlearning.planning.overhead import write_fixed_costs

    d = load_digits()
    table = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(64)])
    table.insert(0, "id", [f"img-{i:04d}" for i in range(len(table))])
    table["digit"] = d.target
    table["split"] = ["val" if i % 5 == 4 else "train" for i in range(len(table))]  # the requests name train rows
    table.to_csv(tmp / "digits.csv", index=False)
    proj = tmp / "mine"
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "UNLEARN_WARM_WORKER", "UNLEARN_TIMINGS"):
        env.pop(key, None)
    unlearn = [str(BIN / "unlearn")]
    out: dict = {"load_avg_1m_start": os.getloadavg()[0], "commands": {}}
    wall, _, _ = timed([*unlearn, "init", str(proj), "--dataset", "table", "--path", str(tmp / "digits.csv"),
                        "--id-column", "id", "--label-column", "digit", "--split-column", "split"], tmp, env)
    out["commands"]["init"] = wall
    ids = [f"img-{i:04d}" for i in range(0, 1797, 7) if i % 5 != 4]  # training rows, spread over the table
    drop(proj, "2026-12-01T0800_first", ids[:5])
    out["commands"]["repro (first: prepare, train, one batch)"], _, out["first_repro"] = timed(
        [*unlearn, "repro"], proj, env, tmp / "first.json")
    batch = drop(proj, "2026-12-01T0900_batch", ids[5:25])
    wall, log, report = timed([*unlearn, "repro"], proj, env, tmp / "batch.json")
    out["commands"]["repro (one 20-row batch)"] = wall
    out["one_batch"] = report
    took = [float(x) for x in TOOK.findall(log)]
    deletion = next((st for st in report["stages"] if st["stage"] == "deletion"), None)
    erase = next((st for st in report["stages"] if st["stage"].endswith("erase")), None)
    if deletion and erase and took:
        out["fixed_costs"] = {"stage": round(deletion["wall_s"] - took[-1], 2), "erase": erase["wall_s"]}
        out["fixed_costs_file"] = str(write_fixed_costs(proj, out["fixed_costs"]).relative_to(proj))
    out["commands"]["dvc repro, nothing to do"], _, _ = timed([str(BIN / "dvc"), "repro"], proj, env)
    processed = proj / "requests" / "processed" / batch.name
    probe = drop(proj, "probe", ids[30:130], folder=tmp)  # 100 rows, outside the inbox: validate and plan only read it
    for name, cmd in (("status", ["status"]), ("ids", ["ids", "--head", "5"]), ("lookup", ["lookup", ids[0]]),
                      ("validate (100 rows)", ["validate", str(probe)]), ("verify-erasure", ["verify-erasure"]),
                      ("plan (100 rows, with its probe)", ["plan", str(probe)])):
        out["commands"][name], _, _ = timed([*unlearn, *cmd], proj, env)
    out["processed_file_kept"] = processed.exists()
    per_batch = []
    for i in range(stream):
        drop(proj, f"2026-12-02T{i:04d}_stream", [ids[130 + i]])
        per_batch.append(timed([*unlearn, "repro"], proj, env)[0])
    out["stream"] = {"batches": stream, "wall_s": per_batch,
                     "per_batch_s": round(statistics.median(per_batch), 2) if per_batch else None}
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


def init_rows(res: dict) -> list[tuple[str, float, float | None]]:
    """(what, seconds, target or None) for the docs table."""
    batch = res["one_batch"]
    rows = [(f"one batch: stage {st['stage']} (wall {st['wall_s']:.1f} s, compute {st['compute_s']:.1f} s): overhead",
             round(st["wall_s"] - st["compute_s"], 2), None) for st in batch["stages"] if st["wall_s"] > 0]
    rows.append(("one batch: overhead (wall - compute)", round(batch["total_s"] - batch["compute_s"], 2),
                 TARGETS["one batch: overhead (wall - compute)"]))
    rows += [(f"command: {k}", v, TARGETS.get(k)) for k, v in res["commands"].items()]
    if res["stream"]["per_batch_s"] is not None:
        rows.append((f"stream: per batch (median of {res['stream']['batches']}, `unlearn repro` each)",
                     res["stream"]["per_batch_s"], TARGETS["stream: per batch"]))
    for k, v in res.get("fixed_costs", {}).items():
        rows.append((f"fixed cost per batch for `unlearn plan`: {k}", v, None))
    return rows


def init_table(res: dict) -> str:
    lines = [f"`python bench/session_overhead.py --only init --stream {res['stream']['batches']}` (digits as a CSV, "
             f"`unlearn init`; load average {res['load_avg_1m_start']:.1f} at the start, {res['load_avg_1m_end']:.1f} "
             f"at the end, on {os.cpu_count()} cores; at a load above about 1 per core, other work shares them "
             f"and every number is an upper bound)", "",
             "| what | seconds | target |", "|---|---:|---:|"]
    for what, sec, target in init_rows(res):
        verdict = "" if target is None else f"<= {target:g} s: {'met' if sec <= target else 'NOT met'}"
        lines.append(f"| {what} | {sec:.1f} | {verdict} |")
    requests = res.get("one_batch", {}).get("mlflow_requests", {})
    if requests:  # what a team server would check the login of (docs/operations.md, "Accounts and threat model")
        calls = ", ".join(f"{stage} {n['call']} store call(s) ({n['http']} HTTP)" for stage, n in requests.items())
        lines += ["", f"MLflow requests of the 20-row batch (local store; each is a login check on a team server): "
                      f"{calls}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of warm, cold and resident runs (default 1)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "session_overhead.json"))
    ap.add_argument("--only", choices=["make-run", "init"], help="one part only (default: both)")
    ap.add_argument("--stream", type=int, default=3, help="init part: batches of one request each (default 3)")
    ap.add_argument("--docs", default=str(ROOT / "docs" / "evidence.md"), help="where the init part's table goes")
    a = ap.parse_args()
    if a.only != "make-run":
        with tempfile.TemporaryDirectory(prefix="session-bench-init-") as tmp:
            res = init_project(Path(tmp), a.stream)
        res.pop("fixed_costs_file", None)
        table = init_table(res)
        print(table)
        write_between(a.docs, "<!-- bench:session:begin -->", "<!-- bench:session:end -->", table)
        out = Path(a.out).with_name(Path(a.out).stem + "_init.json")
        write_json(str(out), {"what": "a project made by unlearn init: its commands' wall times", **res})
        if a.only == "init":
            return
    runs = []
    for i in range(a.repeats):
        for mode in MODES:
            r = one_run(mode)
            runs.append(r)
            print(f"[{i + 1}/{a.repeats}] {r['mode']}: {r['total_s']:.1f} s, overhead {r['overhead_share']:.0%} "
                  f"(load {r['load_avg_1m']:.1f}); MLflow requests of the batch: {r['mlflow_requests']}", flush=True)
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
