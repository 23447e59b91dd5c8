"""Benchmark: does `unlearn plan` say what the batch then takes? And what does an own project's batch cost beside its
compute?

For each dataset (digits as a user's CSV; sklearn's breast cancer table with a small residual MLP of one's own,
`--arch custom`), a project is made by `unlearn init`, trained by a first `unlearn repro`, and given a resident
Prefect server and warm worker (`unlearn up`; `--no-up` leaves it out). Then `--batches` batches of mixed sizes
(the ids from `unlearn ids --split train`; licensing off: a licensed request skips the plan), each:
1. `unlearn plan FILE --json`: the predicted wall time of the batch in its phases (unlearning/planning/overhead.py:
   validation, diagnostics, references, candidates, tracking, erase, orchestration) and its range;
2. the file dropped in the inbox, `unlearn repro`: the batch's measured phases (the project's phase history,
   cache/costs/phases.jsonl, which the batch appends), and the session's split of the whole command
   (UNLEARN_SESSION_REPORT: wall, compute, tracking, orchestration).
It reports actual / predicted per phase and overall (the target: within [0.67, 1.5] on a quiet machine), whether
the actual lies in the predicted range, and each `unlearn repro`'s overhead (wall minus compute: target at most
15 s on a quiet machine), with the load average before and after every batch: on a shared machine every number is
an upper bound and the ratios' spread is what the load did.

Usage: python bench/plan_accuracy.py [--batches 10] [--datasets digits,breast_cancer] [--no-up]
       [--out bench/results/plan_accuracy.json] [--docs docs/evidence.md]
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

from unlearning.planning.overhead import PHASES  # noqa: E402

SIZES = (1, 5, 20, 50, 2, 100, 10, 30, 3, 60)  # rows per batch, mixed, cycled
TARGET = (0.67, 1.5)
OVERHEAD_TARGET_S = 15.0
BEGIN, END = "<!-- bench:plan_accuracy:begin -->", "<!-- bench:plan_accuracy:end -->"
INBATCH = re.compile(r"plan vs actual: predicted ([\d.]+) s .*?, took ([\d.]+) s")

RESIDUAL_MLP = '''"""A small residual MLP for a table (bench/plan_accuracy.py): any nn.Module mapping [B, d] to logits."""
import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, d: int, n_classes: int, width: int = 32):
        super().__init__()
        self.inp = nn.Linear(d, width)
        self.block = nn.Sequential(nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.out = nn.Linear(width, n_classes)

    def forward(self, x):
        h = self.inp(x)
        return self.out(torch.relu(h + self.block(h)))


def build(in_shape, n_classes, width=32):
    return ResidualMLP(in_shape[0], n_classes, width)
'''


def load() -> float:
    return round(os.getloadavg()[0], 2)


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = 3600) -> tuple[float, str, str]:
    started = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return round(wall, 2), res.stdout, res.stderr


def table(dataset: str, folder: Path) -> tuple[Path, list[str]]:
    """The dataset as a user's CSV (and the `unlearn init` options it needs)."""
    import pandas as pd

    if dataset == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        t = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(d.data.shape[1])])
        t.insert(0, "id", [f"img-{i:04d}" for i in range(len(t))])
        t["digit"] = d.target
        path = folder / "digits.csv"
        t.to_csv(path, index=False)
        return path, ["--id-column", "id", "--label-column", "digit"]
    if dataset == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        d = load_breast_cancer()
        t = pd.DataFrame(d.data, columns=[f"f{i}" for i in range(d.data.shape[1])])
        t.insert(0, "patient", [f"p-{i:03d}" for i in range(len(t))])
        t["malignant"] = 1 - d.target
        path = folder / "breast_cancer.csv"
        t.to_csv(path, index=False)
        (folder / "residual_mlp.py").write_text(RESIDUAL_MLP)
        return path, ["--id-column", "patient", "--label-column", "malignant", "--arch", "custom",
                      "--factory", "residual_mlp:build"]
    raise SystemExit(f"--datasets: unknown dataset {dataset!r}; allowed: digits, breast_cancer")


def request(path: Path, name: str, ids: list[str]) -> Path:
    lines = ["request_id,sample_id,requested_at,reason"] + [f"{name}-{i},{x},2026-12-01T08:00:00Z,bench"
                                                              for i, x in enumerate(ids)]
    path.write_text("\n".join(lines) + "\n")
    return path


def without_licensing(params_file: Path) -> None:
    """licensing.enabled: false in the project's params. A licensed request leaves the model unchanged and skips
    the plan's steps, so the plan's phases (the exact path's) say nothing about it and it adds no phase history:
    this bench measures the plan where the plan runs."""
    import yaml

    data = yaml.safe_load(params_file.read_text()) or {}
    data.setdefault("licensing", {})["enabled"] = False
    params_file.write_text(yaml.safe_dump(data, sort_keys=False))


def one_dataset(dataset: str, tmp: Path, n_batches: int, resident: bool, env: dict) -> dict:
    folder = tmp / dataset
    folder.mkdir()
    csv, options = table(dataset, folder)
    proj = folder / "project"
    unlearn = [str(BIN / "unlearn")]
    run([*unlearn, "init", str(proj), "--dataset", "table", "--path", str(csv), *options], folder, env)
    if (folder / "residual_mlp.py").exists():
        (proj / "residual_mlp.py").write_text((folder / "residual_mlp.py").read_text())
    without_licensing(proj / "params.yaml")
    out: dict = {"dataset": dataset, "resident": resident, "batches": []}
    out["first_repro_s"], _, _ = run([*unlearn, "repro"], proj, env)
    if resident:
        out["up_s"], _, _ = run([*unlearn, "up", "--idle-minutes", "30"], proj, env)
    try:
        _, ids_json, _ = run([*unlearn, "ids", "--split", "train", "--json"], proj, env)
        ids = json.loads(ids_json)["ids"]
        history = proj / "cache" / "costs" / "phases.jsonl"
        start = 0
        for i in range(n_batches):
            size = SIZES[i % len(SIZES)]
            name = f"2026-12-02T{i:04d}_bench"
            req = request(folder / f"{name}.csv", name, ids[start:start + size])
            start += size
            row = {"batch": i, "rows": size, "load_before": load()}
            row["plan_s"], plan_out, _ = run([*unlearn, "plan", str(req), "--json"], proj, env)
            plan = json.loads(plan_out)
            row["methods"] = [s["method"] for s in plan["steps"]]
            row["predicted"] = plan["wall_seconds"]["phases"]
            row["predicted_range"] = plan["wall_seconds"]["range_total"]
            (proj / "requests" / "inbox" / req.name).write_text(req.read_text())
            report = folder / f"{name}.session.json"
            row["repro_s"], log, err = run([*unlearn, "repro"], proj, {**env, "UNLEARN_SESSION_REPORT": str(report)})
            session = json.loads(report.read_text())
            row["session"] = {k: session[k] for k in ("total_s", "compute_s", "tracking_s", "orchestration_s")}
            row["stages"] = [{k: st[k] for k in ("stage", "wall_s", "compute_s", "tracking_s", "orchestration_s")}
                             for st in session["stages"]]
            row["overhead_s"] = round(session["total_s"] - session["compute_s"], 2)
            last = json.loads(history.read_text().splitlines()[-1])
            row["actual"] = last["actual"]
            found = INBATCH.findall(log + err)
            row["in_batch_plan"] = {"predicted": float(found[-1][0]), "took": float(found[-1][1])} if found else None
            row["load_after"] = load()
            pred, act = sum(row["predicted"].values()), sum(row["actual"].values())
            row["ratio"] = round(act / pred, 3) if pred > 0 else None
            row["in_range"] = row["predicted_range"][0] <= act <= row["predicted_range"][1]
            print(f"{dataset} batch {i} ({size} rows, {'+'.join(row['methods'])}): predicted {pred:.1f} s "
                  f"[{row['predicted_range'][0]:.1f}-{row['predicted_range'][1]:.1f}], took {act:.1f} s "
                  f"(ratio {row['ratio']}); repro {row['repro_s']:.1f} s, overhead {row['overhead_s']:.1f} s; "
                  f"load {row['load_before']}-{row['load_after']}", flush=True)
            out["batches"].append(row)
    finally:
        if resident:
            subprocess.run([*unlearn, "down"], cwd=proj, env=env, capture_output=True, timeout=600)
    return out


def summary(res: dict) -> dict:
    rows = res["batches"]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    per_phase = {}
    for k in PHASES:
        pairs = [(r["actual"][k], r["predicted"][k]) for r in rows]
        per_phase[k] = {"actual_median_s": round(statistics.median(a for a, _ in pairs), 2),
                        "predicted_median_s": round(statistics.median(p for _, p in pairs), 2)}
    overhead = [r["overhead_s"] for r in rows]
    return {"ratio_median": round(statistics.median(ratios), 3), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "within_target": sum(TARGET[0] <= x <= TARGET[1] for x in ratios), "n": len(ratios),
            "in_range": sum(r["in_range"] for r in rows), "per_phase": per_phase,
            "overhead_median_s": round(statistics.median(overhead), 2), "overhead_max_s": max(overhead),
            "load_min": min(min(r["load_before"], r["load_after"]) for r in rows),
            "load_max": max(max(r["load_before"], r["load_after"]) for r in rows)}


def docs_table(results: list[dict], when: str) -> str:
    lines = [f"`python bench/plan_accuracy.py` ({when}, {os.cpu_count()} cores shared with other work: the load "
             f"average is given per dataset; targets: actual / predicted within [{TARGET[0]}, {TARGET[1]}] on a quiet "
             f"machine, an own project's batch at most {OVERHEAD_TARGET_S:g} s beyond its compute)", "",
             "| dataset | batches | load | actual / predicted: median (min-max) | within [0.67, 1.5] | inside the "
             "predicted range | `unlearn repro` overhead: median (max) |", "|---|---:|---|---|---:|---:|---|"]
    for res in results:
        s = res["summary"]
        lines.append(f"| {res['dataset']}{' (resident: `unlearn up`)' if res['resident'] else ''} | {s['n']} | "
                     f"{s['load_min']:.1f}-{s['load_max']:.1f} | {s['ratio_median']:.2f} ({s['ratio_min']:.2f}-"
                     f"{s['ratio_max']:.2f}) | {s['within_target']}/{s['n']} | {s['in_range']}/{s['n']} | "
                     f"{s['overhead_median_s']:.1f} s ({s['overhead_max_s']:.1f} s) |")
    lines += ["", "Per phase, the median of the batches (seconds, actual / predicted):", "",
              "| dataset | " + " | ".join(PHASES) + " |", "|---|" + "---:|" * len(PHASES)]
    for res in results:
        pp = res["summary"]["per_phase"]
        lines.append(f"| {res['dataset']} | " + " | ".join(f"{pp[k]['actual_median_s']:.1f} / "
                                                            f"{pp[k]['predicted_median_s']:.1f}" for k in PHASES) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--datasets", default="digits,breast_cancer")
    ap.add_argument("--no-up", action="store_true", help="no resident server: each `unlearn repro` starts its own")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_accuracy.json"))
    ap.add_argument("--docs", default=str(ROOT / "docs" / "evidence.md"))
    a = ap.parse_args()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DO_NOT_TRACK": "true",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "UNLEARN_WARM_WORKER", "UNLEARN_TIMINGS"):
        env.pop(key, None)
    results = []
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        env["PREFECT_HOME"] = str(Path(tmp) / "prefect")  # a user's Prefect home of its own, not this checkout's
        for dataset in a.datasets.split(","):
            res = one_dataset(dataset.strip(), Path(tmp), a.batches, not a.no_up, env)
            res["summary"] = summary(res)
            results.append(res)
    when = time.strftime("%Y-%m-%d")
    text = docs_table(results, when)
    print(text)
    write_between(a.docs, BEGIN, END, text)
    write_json(a.out, {"what": "unlearn plan's predicted batch phases against the batch's measured ones, and each "
                               "unlearn repro's overhead", "date": when, "cpu_count": os.cpu_count(),
                       "target_ratio": TARGET, "target_overhead_s": OVERHEAD_TARGET_S, "results": results})


if __name__ == "__main__":
    main()
