"""Bounds that hold at every look (docs/certificate.md, "Bounds at every look"): retrain against retrain, where
the truth is "indistinguishable", at each look of the sequential certificate (N = 16, 32, 80 per role).

Per forget set (random rows of digits, or of Fashion-MNIST with --dataset fashion_mnist): a pool of --pool oracles
trained on R = D minus F; --draws times, two disjoint sets of N of them drawn from the pool, one in the place of
the shadow-unlearned models (a true retrain's), one as the oracles; at each look their first n per role. Each look
measures the per-row Gaussian epsilon (unlearning/metrics/epsilon.py) at the look's one-sided confidence
1 - alpha_k, and the core's criterion (unlearning/sequential.py Criterion.judge) judges it at each budget:
- `quantile` (gate.epsilon.aggregate): the bias-corrected lower bound the gate uses, and the plain percentile lower
  bound it replaced (`percentile`, the same rule fed the old bound: what an interim look did before);
- `mean`: the joint bootstrap's bias-corrected lower bound of the capped mean.
Reports the interim false-reject rate of a true retrain per look and budget (target: at most that look's alpha,
per split), and how often a draw's N = 16 lower bound sits above its own N = 80 upper bound (a bound that cannot
hold). Writes JSON and the table in docs/certificate.md between `<!-- interim-bounds:begin -->` and `end`.

Usage: python bench/interim_bounds.py [--dataset digits] [--rows 8000] [--sets 4] [--pool 240] [--draws 12]
                                      [--budgets 0.5,1,1.5,2,2.5,3] [--threads 1] [--docs] [--tables-only]
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from calibration import load_problem  # (bench/ is on sys.path when run as a script)
from digits_problem import train_members
from results_io import write_between, write_json
from unlearning.batch.rows import BatchRows, sampled_for_certificate
from unlearning.config import load_params
from unlearning.certificate.gate import SplitMeasures
from unlearning.metrics import margins
from unlearning.metrics.epsilon import RowEpsilon, batch_epsilon, epsilon_of_mu, gdp_epsilon, row_epsilon
from unlearning.models import predict_logits
from unlearning.planning.plan import sequential_step
from unlearning.seeds import role_seeds
from unlearning.sequential import Criterion

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- interim-bounds:begin -->", "<!-- interim-bounds:end -->"
# the gate's bounds (quantile, mean aggregate) and the plain percentile ones they replace (what a bootstrap gives
# without the bias correction): per row then the quantile, and the joint bootstrap's of the capped mean
BOUNDS = ("quantile", "percentile", "mean", "mean_percentile")


def percentile_rows(rows: RowEpsilon, confidence: float, delta: float) -> RowEpsilon:
    """The per-row bounds as they were: the lower bound the plain (1 - confidence) percentile of the bootstrap mu
    (biased upward at small N), the upper bound unchanged."""
    low = gdp_epsilon(np.quantile(rows.boot_mu, 1 - confidence, axis=0), delta)
    return RowEpsilon(rows.point, low, rows.upper, rows.boot_mu)


def look_bounds(m_unl: np.ndarray, m_orc: np.ndarray, splits: np.ndarray, cfg, confidence: float,
                seed: int) -> dict[str, dict]:
    """Per bound kind and split: the split's BatchEpsilon at one look (margins [n, rows] per role)."""
    rows = row_epsilon(m_unl, m_orc, "gaussian", cfg.delta, confidence, n_bootstrap=cfg.n_bootstrap, seed=seed)
    old = percentile_rows(rows, confidence, cfg.delta)
    out: dict[str, dict] = {k: {} for k in BOUNDS}
    for s in dict.fromkeys(splits.tolist()):
        mask = splits == s

        def part(r: RowEpsilon) -> RowEpsilon:
            return RowEpsilon(r.point[mask], r.lower[mask], r.upper[mask], r.boot_mu[:, mask])

        out["quantile"][s] = batch_epsilon(part(rows), "quantile", cfg.quantile, confidence, cfg.delta)
        out["percentile"][s] = batch_epsilon(part(old), "quantile", cfg.quantile, confidence, cfg.delta)
        mean = batch_epsilon(part(rows), "mean", cfg.quantile, confidence, cfg.delta, cfg.row_cap)
        out["mean"][s] = mean
        resampled = np.minimum(epsilon_of_mu(rows.boot_mu[:, mask], cfg.delta), cfg.row_cap).mean(axis=1)
        out["mean_percentile"][s] = replace(mean, lower=float(np.quantile(resampled, 1 - confidence)))
    return out


def rejects(criterion: Criterion, spec, bounds: dict) -> bool:
    """The core's interim rule (Criterion.judge) on a look's epsilon records: does this look reject?"""
    measures = [SplitMeasures(s, math.nan, epsilon=e) for s, e in bounds.items()]
    return not criterion.judge(measures, spec).passed


def run_set(prob, params, a, F: np.ndarray, k: int) -> dict:
    R = np.setdiff1d(prob.train_rows, F)
    rows = BatchRows(before=prob.train_rows, forget=F, retain=R, adjacent_mask=np.isin(prob.y_np[R], prob.y_np[F]),
                     validation=prob.val_rows)
    eval_rows, splits = sampled_for_certificate(rows, params.validation.certificate_rows, a.seed).eval_rows()
    t0 = time.perf_counter()
    pool = train_members(prob.spec, role_seeds(a.seed + k, "oracles", a.pool), prob.X[R], prob.y[R], prob.recipe)
    m = margins(predict_logits(pool, prob.X[eval_rows]).numpy(), prob.y_np[eval_rows])  # [pool, rows]
    train_s = time.perf_counter() - t0
    gate = params.gate.model_copy(update={"criterion": "epsilon"})
    step = sequential_step("retrain", params.validation, gate, 1.0)
    cfg = gate.epsilon
    draws = []
    rng = np.random.default_rng([a.seed, k])
    for d in range(a.draws):
        order = rng.permutation(a.pool)
        n = step.looks[-1][1]
        u, o = m[order[:n]], m[order[n:2 * n]]
        per_look = []
        for (n_s, n_o), alpha in zip(step.looks, step.alphas):
            per_look.append(look_bounds(u[:n_s], o[:n_o], splits, cfg, 1 - alpha, a.seed + d))
        draws.append(per_look)
    return {"n_forget": int(len(F)), "rows": int(len(eval_rows)), "train_seconds": round(train_s, 2), "draws": draws,
            "looks": [list(x) for x in step.looks], "alphas": list(step.alphas)}


def summarize(sets: list[dict], params, budgets) -> list[dict]:
    """Per bound kind, look and budget: how often the core's interim rule rejected a true retrain (any split), over
    every draw of every set; and how often the look's lower bound exceeded the same draw's last-look upper
    bound on some split."""
    gate = params.gate.model_copy(update={"criterion": "epsilon"})
    looks, alphas = sets[0]["looks"], sets[0]["alphas"]
    out = []
    for kind in BOUNDS:
        for i, ((n_s, n_o), alpha) in enumerate(zip(looks, alphas)):
            row = {"bound": kind, "look": i + 1, "n": n_o, "alpha": alpha, "draws": 0, "rejects": {},
                   "lower_above_final_upper": 0, "lower_q": [], "final_upper_q": []}
            for b in budgets:
                how = "mean" if kind.startswith("mean") else "quantile"
                g = gate.model_copy(update={"epsilon": gate.epsilon.model_copy(update={"max": b, "aggregate": how})})
                criterion = Criterion.of(g, [tuple(x) for x in looks], alphas)
                spec = criterion.looks[i]
                if spec.final:
                    continue  # the last look runs the whole gate: its rate is the calibration's (bench/calibration.py)
                row["rejects"][f"{b:g}"] = sum(rejects(criterion, spec, draw[i][kind]) for s in sets
                                               for draw in s["draws"])
            for s in sets:
                for draw in s["draws"]:
                    row["draws"] += 1
                    final_kind = "mean" if kind.startswith("mean") else "quantile"
                    row["lower_above_final_upper"] += any(
                        draw[i][kind][sp].lower > draw[-1][final_kind][sp].upper for sp in draw[i][kind])
                    row["lower_q"].append(max(e.lower for e in draw[i][kind].values()))
                    row["final_upper_q"].append(max(e.upper for e in draw[-1][final_kind].values()))
            row["lower_max_split_median"] = round(float(np.median(row.pop("lower_q"))), 3)
            row["final_upper_max_split_median"] = round(float(np.median(row.pop("final_upper_q"))), 3)
            out.append(row)
    return out


def table(result: dict) -> str:
    budgets = result["budgets"]
    lines = [f"| dataset | bound | look (N per role, alpha) | draws | rejected at budget {' / '.join(f'{b:g}' for b in budgets)}"
             " | lower bound (median of the largest split) | last look's upper bound (same) | lower above the same "
             "draw's last upper |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in result["summary"].items():
        for r in rows:
            if r["look"] == len(result["looks"]):
                continue  # the last look accepts or rejects with the whole gate: its rate is the calibration's
            rej = " / ".join(str(r["rejects"][f"{b:g}"]) for b in budgets)
            lines.append(f"| {name} | {r['bound']} | {r['look']} ({r['n']}, {r['alpha']:.4g}) | {r['draws']} | {rej} | "
                         f"{r['lower_max_split_median']:.2f} | {r['final_upper_max_split_median']:.2f} | "
                         f"{r['lower_above_final_upper']} |")
    return "\n".join(lines)


def main() -> None:
    params = load_params(ROOT / "params.yaml")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits", choices=("digits", "fashion_mnist"))
    ap.add_argument("--rows", type=int, default=8000, help="training rows of Fashion-MNIST")
    ap.add_argument("--sets", type=int, default=4, help="random forget sets (sizes cycle 1, 5, 10, 50)")
    ap.add_argument("--pool", type=int, default=240, help="oracles trained per set, drawn from in disjoint pairs")
    ap.add_argument("--draws", type=int, default=12, help="retrain-against-retrain draws per set")
    ap.add_argument("--budgets", default="0.5,1,1.5,2,2.5,3")
    ap.add_argument("--seed", type=int, default=params.base.seed)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--docs", action="store_true", help="write the table into docs/certificate.md (every dataset's "
                                                        "JSON found in bench/results/)")
    ap.add_argument("--tables-only", action="store_true", help="only (re)write the docs table from the JSON")
    a = ap.parse_args()
    if a.tables_only:
        write_docs()
        return
    torch.set_num_threads(a.threads)
    n_last = params.validation.n_oracles
    if a.pool < 2 * n_last:
        raise SystemExit(f"error: --pool = {a.pool}: two disjoint sets of validation.n_oracles = {n_last} need at "
                         f"least {2 * n_last}")
    budgets = [float(x) for x in a.budgets.split(",")]
    t_start = time.perf_counter()
    prob = load_problem(params, a.dataset, a.rows)
    rng = np.random.default_rng(a.seed + 51)
    sets = []
    for k in range(a.sets):
        F = np.sort(rng.choice(prob.train_rows, (1, 5, 10, 50)[k % 4], replace=False))
        sets.append(run_set(prob, params, a, F, k))
        print(f"[{k + 1}/{a.sets}] {len(F)} forget rows: {a.pool} oracles in {sets[-1]['train_seconds']:.0f} s, "
              f"{a.draws} draws ({time.perf_counter() - t_start:.0f} s so far)", flush=True)
    summary = summarize(sets, params, budgets)
    for r in summary:
        print(f"{r['bound']:10s} look {r['look']} (N = {r['n']}): rejected {r['rejects']} of {r['draws']}; lower "
              f"{r['lower_max_split_median']:.2f}, last upper {r['final_upper_max_split_median']:.2f}, lower above "
              f"last upper {r['lower_above_final_upper']}")
    out = a.out or str(ROOT / "bench/results" / ("interim_bounds.json" if a.dataset == "digits"
                                                 else f"interim_bounds_{a.dataset}.json"))
    write_json(out, {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dataset": a.dataset,
                     "machine": platform.machine(), "threads": a.threads, "sets": a.sets, "pool": a.pool,
                     "draws": a.draws, "budgets": budgets, "looks": sets[0]["looks"], "alphas": sets[0]["alphas"],
                     "epsilon_gate": params.gate.epsilon.model_dump(), "summary": summary,
                     "forget_sizes": [s["n_forget"] for s in sets], "rows": sets[0]["rows"],
                     "wall_seconds": round(time.perf_counter() - t_start, 1)})
    if a.docs:
        write_docs()


def write_docs() -> None:
    import json

    found = {}
    for name, f in (("digits", "interim_bounds.json"), ("fashion_mnist", "interim_bounds_fashion_mnist.json")):
        p = ROOT / "bench/results" / f
        if p.exists():
            found[name] = json.loads(p.read_text())
    if not found:
        return
    first = next(iter(found.values()))
    result = {"budgets": first["budgets"], "looks": first["looks"], "summary": {k: v["summary"] for k, v in found.items()}}
    runs = "; ".join(f"{k}: {v['sets']} random forget sets of {v['forget_sizes']} rows, {v['draws']} draws each from "
                     f"a pool of {v['pool']} oracles, {v['rows']} evaluated rows, {v['wall_seconds']:.0f} s, "
                     f"{v['date'][:10]}" for k, v in found.items())
    note = (f"\n`python bench/interim_bounds.py --docs` ({runs}; JSON in bench/results/interim_bounds*.json). "
            f"Rejected: draws on which the core's interim rule rejected a true retrain on some split.")
    write_between(ROOT / "docs/certificate.md", BEGIN, END, table(result) + "\n" + note)


if __name__ == "__main__":
    main()
