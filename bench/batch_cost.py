"""What a deletion batch costs, in units of one plain retrain of the same model (unlearning/planning/plan.py).

Per point (dataset rows x model), in ONE child process with the same torch threads: prepare Fashion-MNIST
(Debian package dataset-fashion-mnist), train the original through the flows, time one plain retrain of the
model on the training rows, then run real deletion batches (flows.deletion_batch.run: Prefect, MLflow, the
gate) on three paths:
- `retrain`: the default policy on 100 random ids (the usual pick: one model, no references);
- `do_nothing_accepted`: do_nothing named explicitly on a low-gap set (10 random ids) and certified at full N;
- `rejected`: do_nothing named explicitly on a high-gap set (100 ids of one class), rejected at the first
  decisive look of the sequential certificate, then the exact retrain.
Each path records the batch's wall time / one retrain, its compute / one retrain (the task bodies:
adapters/clock.py), the diagnostics' share and seconds / one retrain, the plan's predicted retrains, the models
trained, and the child's peak RSS. A point also records the plan of a full-N certificate of do_nothing
(predicted seconds and peak memory against validation.memory_mb) when its paths leave that one out.
`--full-data-plan` adds the plan of the full-data CNN (60,000 rows, N = 80) without training it: the planner's
memory check on a member probe (the plan needs no trained original for that).

Writes bench/results/batch_cost.json and regenerates the README table between the markers
`<!-- bench:batch_cost:begin -->` and `<!-- bench:batch_cost:end -->`.
Usage: python bench/batch_cost.py [--points mlp:2000,mlp:8000,mlp:30000,cnn:2000,cnn:8000@retrain+rejected]
                                  [--paths retrain,do_nothing_accepted,rejected] [--threads 2] [--full-data-plan]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_io import write_between  # noqa: E402

PATHS = ("retrain", "do_nothing_accepted", "rejected")
BEGIN, END = "<!-- bench:batch_cost:begin -->", "<!-- bench:batch_cost:end -->"
TARGETS = {"retrain": 2.0, "diagnostics": 1.0, "rejected": 10.0, "peak_rss_gb": 4.0}


def point_params(model: str, rows: int) -> dict:
    """The overrides of a point: Fashion-MNIST at `rows` training rows, the default recipe, `model`."""
    return {"base": {"progress": False}, "prepare": {"dataset": "fashion_mnist", "max_train": rows, "max_val": 2000},
            "train": {"model": {"arch": model}}}


def request(path: Path, ids: list[str], tag: str) -> Path:
    rows = [f"{tag}-{i},{s},2026-12-01T10:00:00Z,bench" for i, s in enumerate(ids)]
    path.write_text("request_id,sample_id,requested_at,reason\n" + "\n".join(rows) + "\n")
    return path


def retained(root: Path):
    import pandas as pd

    m = pd.read_csv(root / "state" / "manifest.csv", dtype=str) if (root / "state" / "manifest.csv").exists() \
        else pd.read_csv(root / "data" / "prepared" / "manifest.csv", dtype=str)
    if "status" in m:
        m = m[m.status == "retained"]
    return m[m.split == "train"]


def child_runs(tracker, run_id: str) -> dict:
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    return {r.info.run_name: r for r in runs}


def seconds_of(run) -> float:
    return (run.info.end_time - run.info.start_time) / 1000 if run is not None and run.info.end_time else 0.0


def one_retrain_seconds(params) -> float:
    """One plain retrain of the model on the prepared training rows, with the recipe (one member)."""
    import numpy as np
    import torch

    from tasks.training import build
    from unlearning.data import load_prepared
    from unlearning.models import fit
    from unlearning.models.training import recipe_from

    prepared = load_prepared(params.path("prepared_dir"))
    rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    X = torch.as_tensor(np.asarray(prepared.X[rows]), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(prepared.label[rows]), dtype=torch.long)
    model = build(params.train.model, params.root, prepared, [params.base.seed + 1])
    t = time.perf_counter()
    fit(model, X, y, recipe_from(params.train))
    return time.perf_counter() - t


def easiest_rows(params_path: Path, ids: list[str], k: int) -> list[str]:
    """The k retained training rows the production model fits best (lowest loss): well-learned, typical rows,
    where a retrain without them predicts them almost as well, so do_nothing's gap is small."""
    import numpy as np
    import torch

    from tasks.state import StateSettings, load_state
    from unlearning.batch.rows import eval_logits
    from unlearning.config import load_params

    state = load_state.fn(StateSettings.of(load_params(params_path)), "cpu")
    rows = state.prepared.rows(ids)
    logits = eval_logits(state.model, state.prepared, rows)[0]
    loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(state.prepared.label[rows]), reduction="none")
    return [ids[i] for i in np.argsort(loss.numpy())[:k]]


def run_path(root: Path, params_path: Path, name: str, ids: list[str], overrides: dict, retrain_s: float) -> dict:
    from flows.deletion_batch import run
    from adapters import clock
    from adapters.tracking import Tracker
    from unlearning.config import load_params

    params = load_params(params_path, overrides)
    req = request(root / f"{name}.csv", ids, name)
    clock.reset()
    t = time.perf_counter()
    (r,) = run(str(req), str(params_path), overrides)
    wall = time.perf_counter() - t
    compute = clock.totals()["compute_s"]  # the task bodies of this batch (adapters/clock.py)
    largest = [(name, round(sec, 2)) for name, sec in clock.largest(6)]
    tracker = Tracker(params.mlflow_tracking_uri(), params.tracking.experiment)
    runs = child_runs(tracker, r.get("run_id") or "")
    batch = tracker.client.get_run(r["run_id"]) if r.get("run_id") else None
    diag = seconds_of(runs.get("diagnostics"))
    ens = runs.get("ensembles")
    metrics = batch.data.metrics if batch is not None else {}
    return {"path": name, "status": r["status"], "method": r.get("method"), "n_forget": len(ids),
            "wall_seconds": round(wall, 2), "wall_retrains": round(wall / retrain_s, 2),
            "compute_retrains": round(compute / retrain_s, 2),
            "diagnostics_seconds": round(diag, 2), "diagnostics_retrains": round(diag / retrain_s, 2),
            "diagnostics_share": round(diag / wall, 3) if wall else None,
            "predicted_retrains": metrics.get("predicted_retrains"),
            "predicted_peak_mb": metrics.get("predicted_peak_mb"),
            "references_trained": {k: ens.data.metrics.get(k) for k in ("n_oracles", "n_shadows")} if ens else
            {"n_oracles": 0, "n_shadows": 0},
            "largest_sections": largest,
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def one_point(spec: str, paths: list[str], threads: int) -> dict:
    """Everything for one point, in this process (the parent runs each point in its own child)."""
    import numpy as np
    import torch
    import yaml

    from unlearning.config import deep_merge, load_params

    torch.set_num_threads(threads)
    model, rows = spec.split(":")
    root = Path(tempfile.mkdtemp(prefix=f"batch_cost_{model}_{rows}_"))
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ["UNLEARN_TIMING_DETAIL"] = "1"  # adapters/clock.py: seconds per section name
    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), point_params(model, int(rows)))
    (root / "requests" / "inbox").mkdir(parents=True)
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    from flows.prepare import prepare
    from flows.train import train

    t = time.perf_counter()
    prepare(str(params_path))
    train(str(params_path))
    setup = time.perf_counter() - t
    p = load_params(params_path)
    retrain_s = one_retrain_seconds(p)
    rng = np.random.default_rng(int(rows))
    out = {"point": spec, "model": model, "rows": int(rows), "threads": threads, "setup_seconds": round(setup, 1),
           "retrain_seconds": round(retrain_s, 3), "paths": []}
    explicit = {"deletion": {"method": "do_nothing"}}
    for name in paths:
        train_rows = retained(root)
        if name == "retrain":
            ids, over = rng.choice(train_rows.sample_id.to_numpy(), 100, replace=False).tolist(), {}
        elif name == "do_nothing_accepted":
            ids, over = easiest_rows(params_path, train_rows.sample_id.tolist(), 10), explicit
        else:
            label = train_rows.label.value_counts().index[0]
            ids, over = train_rows[train_rows.label == label].sample_id.head(100).tolist(), explicit
        out["paths"].append(run_path(root, params_path, name, ids, over, retrain_s))
        print(json.dumps(out["paths"][-1]), file=sys.stderr, flush=True)
    return out


def full_data_plan(threads: int) -> dict:
    """The planner on the full-data CNN (60,000 rows, N = 80, do_nothing certified): timing probe and memory
    footprint on an untrained member over the prepared rows (no original is trained for it)."""
    import numpy as np
    import torch
    import yaml

    from tasks.batch_settings import BatchSettings
    from tasks.planning import batch_plan, probe
    from unlearning.batch.rows import BatchRows
    from unlearning.config import deep_merge, load_params
    from unlearning.data import load_prepared
    from flows.prepare import prepare

    torch.set_num_threads(threads)
    root = Path(tempfile.mkdtemp(prefix="batch_cost_cnn_full_"))
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    over = deep_merge(point_params("cnn", None), {"prepare": {"max_val": None}, "deletion": {"method": "do_nothing"}})
    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), over)
    params_path = root / "params.yaml"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    prepare(str(params_path))
    p = load_params(params_path)
    prepared = load_prepared(p.path("prepared_dir"))
    train_rows = np.flatnonzero((prepared.manifest["split"] == "train").to_numpy())
    val = np.flatnonzero((prepared.manifest["split"] == "val").to_numpy())
    forget, retain = train_rows[:100], train_rows[100:]
    rows = BatchRows(before=train_rows, forget=forget, retain=retain, adjacent_mask=np.zeros(len(retain), bool),
                     validation=val)
    state = type("S", (), {"prepared": prepared})()
    timing, footprint = probe(BatchSettings.of(p).probe_inputs, state, rows, "cpu")
    plan = batch_plan(p.validation, p.gate, p.deletion.weigh_cost, {"candidates": ["do_nothing", "retrain"]},
                      "retrain_equivalence", timing, footprint, p.diagnostics.max_retrains * timing.retrain_seconds)
    return {"point": "cnn:60000 (plan only)", "rows": int(len(train_rows)), "refusal": plan.refusal,
            "peak_mb": round(plan.peak_bytes / 2**20), "memory_mb": plan.memory_mb, "chunk_size": plan.chunk_size,
            "eval_members": plan.eval_members, "eval_block_rows": plan.eval_block_rows,
            "predicted_seconds": plan.predicted_seconds, "predicted_retrains": round(plan.predicted_retrains, 1),
            "retrain_seconds_predicted": round(timing.retrain_seconds, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def table(results: dict) -> str:
    """The README table: one row per point and path."""
    lines = [f"Measured {results['date']} on {results['machine']} ({results['threads']} threads) by "
             f"`python bench/batch_cost.py`. Targets: retrain path <= {TARGETS['retrain']}x one retrain, diagnostics "
             f"<= {TARGETS['diagnostics']}x, a rejected approximate candidate <= {TARGETS['rejected']}x, peak RSS <= "
             f"{TARGETS['peak_rss_gb']} GB.", "",
             "| point | one retrain (s) | path | method | batch wall / retrain | compute / retrain | diagnostics / "
             "retrain | references trained (oracles + shadows) | peak RSS (GB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for pt in results["points"]:
        for r in pt["paths"]:
            refs = r["references_trained"]
            lines.append(f"| {pt['point']} | {pt['retrain_seconds']:.2f} | {r['path']} | {r['method']} | "
                         f"{r['wall_retrains']:.1f} | {r['compute_retrains'] if r['compute_retrains'] is not None else '-'} | "
                         f"{r['diagnostics_retrains']:.2f} | {int(refs.get('n_oracles') or 0)} + "
                         f"{int(refs.get('n_shadows') or 0)} | {r['peak_rss_gb']:.2f} |")
    full = results.get("full_data_plan")
    if full:
        lines += ["", f"Full-data CNN ({full['rows']} rows, do_nothing certified at N = 80), `unlearn plan`'s planner: "
                      f"predicted peak {full['peak_mb']} MB of validation.memory_mb = {full['memory_mb']} "
                      f"({'fits' if not full['refusal'] else 'REFUSED: ' + full['refusal']}), chunks of "
                      f"{full['chunk_size']} members, evaluation {full['eval_members']} members x "
                      f"{full['eval_block_rows']} rows; predicted {full['predicted_retrains']} retrains."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="mlp:2000,mlp:8000,mlp:30000,cnn:2000,cnn:8000")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full-data-plan", action="store_true", help="also plan the full-data CNN (N = 80)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: one point, JSON on stdout
    ap.add_argument("--plan-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "batch_cost.json"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    a = ap.parse_args()
    if a.plan_only:
        print(json.dumps(full_data_plan(a.threads)))
        return
    if a.one:
        print(json.dumps(one_point(a.one, [p for p in a.paths.split(",") if p], a.threads)))
        return
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
               "threads": a.threads, "points": []}
    for spec in [s for s in a.points.split(",") if s]:
        t = time.perf_counter()
        spec, _, only = spec.partition("@")  # "cnn:8000@retrain+rejected": this point's paths only
        paths = only.replace("+", ",") if only else a.paths
        out = subprocess.run([sys.executable, __file__, "--one", spec, "--paths", paths, "--threads",
                              str(a.threads)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(f"{spec}: failed\n{out.stderr[-3000:]}", file=sys.stderr)
            continue
        point = json.loads(out.stdout.strip().splitlines()[-1])
        results["points"].append(point)
        print(f"{spec}: {time.perf_counter() - t:.0f} s; retrain {point['retrain_seconds']:.2f} s; " + "; ".join(
            f"{r['path']} -> {r['method']} {r['wall_retrains']:.1f}x (diagnostics {r['diagnostics_retrains']:.2f}x)"
            for r in point["paths"]), flush=True)
    if a.full_data_plan:
        out = subprocess.run([sys.executable, __file__, "--plan-only", "--threads", str(a.threads)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode == 0:
            results["full_data_plan"] = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            print(f"full-data plan failed\n{out.stderr[-3000:]}", file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(table(results))
    write_between(a.readme, BEGIN, END, table(results))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
