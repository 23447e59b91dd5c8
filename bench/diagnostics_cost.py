"""What the default leverage diagnostics cost against one plain retrain of the same model (docs/design.md §4.1).

Each point runs in a process of its own (so its peak RSS is its own), with the same torch threads for both
timings: Fashion-MNIST, the params.yaml recipe and model (MLP), or the CNN (train.model.arch cnn), trained on
`rows` training rows; a forget set of 100 random ids; validation = `--val` rows of the test split. It times

- one plain retrain of the model on the retain rows (`unlearning.models.fit` called as tasks/training.py calls
  it: train_ensemble's default of one intra-op thread while training, which on two cores was 3-10x faster than
  two for these small models);
- the default diagnostics (`compute_diagnostics` with params.yaml `diagnostics:`: solver auto under a budget of
  max_retrains retrains, float32, cross-leverage on a sample, the error check);

and reports their ratio, the solver auto picked (with its cost estimates), peak RSS, the cross-leverage sampling
errors and the error check against exact (on a retain-row subsample where the exact solve is unaffordable).
Writes bench/results/diagnostics_cost.json and prints a table.

Usage: python bench/diagnostics_cost.py [--points mlp:2000 mlp:8000 mlp:30000 cnn:2000 cnn:8000] [--threads 2]
       [--device cuda] [--fashion-mnist-dir DIR]   (--device cuda: the retrain and the diagnostics both on the GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_io import write_json  # noqa: E402

POINTS = ["mlp:2000", "mlp:8000", "mlp:30000", "cnn:2000", "cnn:8000"]


def _problem(arch: str, rows: int, n_val: int, seed: int, fmnist_dir: str | None = None):
    from unlearning.config import load_params
    from unlearning.data import load_dataset
    from unlearning.models.training import TrainRecipe
    from unlearning.models.zoo import arch_kwargs

    params = load_params(ROOT / "params.yaml")
    ds = load_dataset("fashion_mnist", fashion_mnist_dir=fmnist_dir or params.prepare.fashion_mnist_dir, seed=seed,
                      max_train=rows, max_val=n_val)
    m = params.train.model.model_dump()
    m["arch"] = arch
    spec = {"arch": arch, "in_shape": [int(s) for s in ds.in_shape], "n_classes": int(ds.n_classes),
            "kwargs": arch_kwargs(m), "factory": None, "feature_layer": m["feature_layer"]}
    t = params.train
    recipe = TrainRecipe(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                         optimizer=t.optimizer, momentum=t.momentum, schedule=t.schedule,
                         label_smoothing=t.label_smoothing)
    X = torch.as_tensor(np.asarray(ds.X), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(ds.label).astype(np.int64))
    split = np.asarray(ds.split)
    return params, spec, recipe, X, y, np.flatnonzero(split == "train"), np.flatnonzero(split == "val")


def _peak_rss_mb() -> float:
    """This interpreter's own peak RSS: VmHWM (ru_maxrss keeps the parent's peak across the fork + exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_point(point: str, n_forget: int, n_val: int, seed: int, device: str = "cpu",
              fmnist_dir: str | None = None) -> dict:
    """One point, in this process: train the original (untimed), time a retrain and the default diagnostics."""
    from unlearning.leverage import compute_diagnostics
    from unlearning.models import build_model, fit

    arch, rows = point.split(":")
    params, spec, recipe, X, y, train, val = _problem(arch, int(rows), n_val, seed, fmnist_dir)
    X, y = X.to(device), y.to(device)   # (n, d) float32 and (n,) int64 where the models train
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rng = np.random.default_rng(seed)
    F = np.sort(rng.choice(train, size=n_forget, replace=False))
    R = np.setdiff1d(train, F)
    t0 = time.perf_counter()
    original = build_model(spec, [seed]).to(device)
    fit(original, X[train], y[train], recipe)
    original_s = time.perf_counter() - t0
    sync()
    retrain = build_model(spec, [seed + 1]).to(device)
    t0 = time.perf_counter()
    fit(retrain, X[R], y[R], recipe)  # as tasks/training.py: fit's own intra-op threads
    sync()
    retrain_s = time.perf_counter() - t0

    cfg = params.diagnostics
    t0 = time.perf_counter()
    rep = compute_diagnostics(
        original, X[F], y[F], X[R], y[R], X[val], y[val], cfg.damping(len(train), recipe.weight_decay),
        solver=cfg.solver, device=device, dtype=getattr(torch, cfg.dtype), proj_dim=cfg.proj_dim,
        check_subset=cfg.check_subset, check_rows=cfg.check_rows, cross_sample=cfg.cross_sample,
        last_layer_above=cfg.last_layer_above, budget_retrains=cfg.max_retrains, epochs=recipe.epochs, seed=seed,
        head_rank=cfg.head_rank, threads=cfg.threads,
        progress=f"diagnostics {point}", label_smoothing=recipe.label_smoothing)
    sync()
    diag_s = time.perf_counter() - t0
    rss_mb = _peak_rss_mb()
    d = rep.to_dict()
    return {"point": point, "device": device, "arch": arch, "rows": len(train), "n_forget": n_forget, "n_validation": len(val),
            "threads": torch.get_num_threads(), "retrain_threads": 1, "params": rep.solver_info.get("full_params", rep.n_params),
            "original_train_s": original_s, "retrain_s": retrain_s, "diagnostics_s": diag_s,
            "ratio": diag_s / retrain_s, "solver": rep.solver, "peak_rss_mb": rss_mb,
            "auto": rep.solver_info.get("auto"), "solver_info": d["solver_info"], "timings": rep.timings,
            "approx_error": rep.approx_error, "cross_leverage_sampling": rep.cross_leverage_sampling,
            "leakage_ratio": rep.leakage_ratio, "predicted_gap_do_nothing": rep.predicted_gap_do_nothing}


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def print_table(results: list[dict]) -> None:
    print(f"\n{'point':>10} {'params':>7} {'solver':>10} {'retrain s':>9} {'diag s':>8} {'ratio':>6} "
          f"{'RSS MB':>7} {'check rows':>10} {'self rho':>8} {'gap rho':>8} {'self err':>8} {'cross mean +- se':>22}")
    for r in results:
        if "error" in r:
            print(f"{r['point']:>10} failed: {r['error'][-200:]}")
            continue
        e = r["approx_error"] or {}
        c = r["cross_leverage_sampling"] or {}
        cross = f"{_fmt(c.get('mean'), '.3g')} +- {_fmt(c.get('se_mean'), '.2g')} ({c.get('sampled')}/{c.get('of')})"
        print(f"{r['point']:>10} {r['params']:>7} {r['solver']:>10} {r['retrain_s']:>9.2f} {r['diagnostics_s']:>8.2f} "
              f"{r['ratio']:>6.2f} {r['peak_rss_mb']:>7.0f} {str(e.get('retain_rows', '-')) + '+' + str(e.get('subset_size', '-')):>10} "
              f"{_fmt(e.get('self_leverage_spearman')):>8} {_fmt(e.get('predicted_gap_spearman')):>8} "
              f"{_fmt(e.get('self_leverage_rel_err')):>8} {cross:>22}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="+", default=POINTS, help="arch:rows, arch in mlp | cnn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forget", type=int, default=100)
    ap.add_argument("--val", type=int, default=2000, help="validation rows (of the test split)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the retrain and the diagnostics run")
    ap.add_argument("--fashion-mnist-dir", help="the IDX files (default: params.yaml prepare.fashion_mnist_dir)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per point")
    ap.add_argument("--one", help=argparse.SUPPRESS)       # run one point in this process, write --json
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "diagnostics_cost.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.one:
        Path(a.json).write_text(json.dumps(run_point(a.one, a.forget, a.val, a.seed, a.device, a.fashion_mnist_dir), default=float))
        return
    results, started = [], time.perf_counter()
    for point in a.points:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "point.json"
            cmd = [sys.executable, __file__, "--one", point, "--json", str(out), "--threads", str(a.threads),
                   "--forget", str(a.forget), "--val", str(a.val), "--seed", str(a.seed), "--device", a.device]
            cmd += ["--fashion-mnist-dir", a.fashion_mnist_dir] if a.fashion_mnist_dir else []
            print(f"[{point}] {' '.join(cmd[1:])}", flush=True)
            try:
                proc = subprocess.run(cmd, timeout=a.timeout, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
                if proc.returncode == 0:
                    results.append(json.loads(out.read_text()))
                else:
                    results.append({"point": point, "error": proc.stderr[-2000:]})
                sys.stderr.write(proc.stderr[-3000:])
            except subprocess.TimeoutExpired:
                results.append({"point": point, "error": f"timed out after {a.timeout} s"})
        r = results[-1]
        if "error" not in r:
            print(f"[{point}] {r['solver']}: diagnostics {r['diagnostics_s']:.2f} s vs retrain {r['retrain_s']:.2f} s "
                  f"= {r['ratio']:.2f}x, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    print_table(results)
    meta = {"device": a.device, "threads": a.threads, "cpu_count": os.cpu_count(), "torch": torch.__version__, "forget": a.forget,
            "validation_rows": a.val, "seed": a.seed, "seconds": time.perf_counter() - started,
            "load_avg_end": os.getloadavg()}
    write_json(a.out, {"meta": meta, "points": results})


if __name__ == "__main__":
    main()
