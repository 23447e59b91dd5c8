"""Scale-out that helps: the same deletion batch on the threads runner (two threads) and on a local Dask cluster
of two single-thread worker processes (validation.task_runner = dask), on this machine.

Identical projects (digits, the default recipe) are prepared and trained; the same request (50 random
training ids, seeded) is applied in each with do_nothing named and certified in one look of
validation.n_oracles + n_shadows references, so the batch is dominated by the reference chunks the runner
spreads. Three runners: threads; a local Dask cluster the batch starts (dask_workers: 2); and a running
cluster (a scheduler and two single-thread workers started before the clock, warmed by one batch, as a team's
cluster serves batches: validation.dask_address). Prints the wall time of each batch and the ratios (target:
Dask <= 1.25 x threads) and writes bench/results/dask_scaling.json.
Usage: python bench/dask_scaling.py [--n 80] [--forget 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def project(root: Path, n: int) -> Path:
    import yaml

    from unlearning.config import deep_merge

    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), {
        "base": {"progress": False}, "diagnostics": {"enabled": False},
        "deletion": {"method": "do_nothing"}, "validation": {"n_oracles": n, "n_shadows": n, "looks": []}})
    (root / "requests" / "inbox").mkdir(parents=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    from flows.prepare import prepare
    from flows.train import train

    prepare(str(path))
    train(str(path))
    return path


def batch(root: Path, a, overrides: dict, run) -> dict:
    """Prepare and train a project in `root`, then time one batch of the seeded request under `overrides`."""
    import numpy as np
    import pandas as pd

    params_path = project(root, a.n)
    m = pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    ids = np.random.default_rng(0).choice(m[m.split == "train"].sample_id.to_numpy(), a.forget, replace=False)
    req = root / "batch.csv"
    req.write_text("request_id,sample_id,requested_at,reason\n"
                   + "\n".join(f"r{i},{s},2026-12-01T10:00:00Z,bench" for i, s in enumerate(sorted(ids))) + "\n")
    t = time.perf_counter()
    (r,) = run(str(req), str(params_path), overrides)
    return {"seconds": round(time.perf_counter() - t, 1), "status": r["status"], "method": r.get("method")}


def start_cluster(base: Path) -> tuple[str, list]:
    """A Dask scheduler and two single-thread worker processes on loopback, started before any clock."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bindir = Path(sys.executable).parent
    log = base / "cluster.log"
    out = log.open("w")
    procs = [subprocess.Popen([str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=out, stderr=out, cwd=ROOT, start_new_session=True)]
    time.sleep(3)
    procs.append(subprocess.Popen([str(bindir / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "2",
                                   "--nthreads", "1", "--no-dashboard"], stdout=out, stderr=out, cwd=ROOT,
                                  start_new_session=True))
    deadline = time.time() + 120
    while log.read_text().count("Registered to") < 2 and time.time() < deadline:
        time.sleep(1)
    return f"tcp://127.0.0.1:{port}", procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=80, help="references per role (one look)")
    ap.add_argument("--forget", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dask_scaling.json"))
    a = ap.parse_args()
    from flows.deletion_batch import run

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    base = Path(tempfile.mkdtemp(prefix="dask_scaling_"))
    os.environ.setdefault("PREFECT_HOME", str(base / ".prefect"))
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "n_per_role": a.n,
           "forget": a.forget, "runs": {}}
    cluster = start_cluster(base)
    try:
        address = cluster[0]
        runs = (("threads", {}, False),
                ("dask_local_cluster", {"validation": {"task_runner": "dask", "dask_workers": 2}}, False),
                ("dask_running_cluster", {"validation": {"task_runner": "dask", "dask_address": address}}, True))
        for runner, overrides, warm_up in runs:
            if warm_up:  # the workers import torch and the project once, as a cluster that serves batches has
                batch(base / f"{runner}_warm_up", a, overrides, run)
            out["runs"][runner] = batch(base / runner, a, overrides, run)
            print(f"{runner}: {out['runs'][runner]}", flush=True)
    finally:  # each process group whole: a worker's task may have started a Prefect server of its own
        import signal

        for proc in reversed(cluster[1]):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
    threads = out["runs"]["threads"]["seconds"]
    for runner in ("dask_local_cluster", "dask_running_cluster"):
        out[f"{runner}_over_threads"] = round(out["runs"][runner]["seconds"] / threads, 2)
        print(f"{runner} / threads = {out[f'{runner}_over_threads']} (target <= 1.25)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
