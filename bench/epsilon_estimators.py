"""Bias and spread of the per-row epsilon estimators (unlearning/metrics/epsilon.py) where the truth is known:
two Gaussians N(0, 1) (the shadow-unlearned side) and N(mu, 1) (the oracles), whose eps(delta) is the mu-Gaussian-DP
curve in closed form (Dong, Roth and Su 2019); mu = 0 is retrain against retrain (true eps 0).

Per N (models per side) and mu: the mean and standard deviation over rows of each estimator's point estimate,
its bias against the closed form, and how often its one-sided bounds hold (lower <= truth, upper >= truth); for
the Gaussian estimator also how often the plain percentile lower bound would (the bound the bias-corrected one
replaced: docs/certificate.md, "Bounds at every look").
Writes bench/results/epsilon_estimators.json and the table in docs/certificate.md.
Usage: python bench/epsilon_estimators.py [--rows 300] [--ns 16,32,80] [--mus 0,0.5,1,2] [--confidence 0.95] [--docs '']
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from results_io import write_between, write_json  # (bench/ is on sys.path when run as a script)
from unlearning.metrics.epsilon import gdp_epsilon, row_epsilon

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- epsilon-estimators:begin -->", "<!-- epsilon-estimators:end -->"


def estimator_bias(ns=(16, 32, 80), mus=(0.0, 0.5, 1.0, 2.0), rows: int = 300, delta: float = 1e-3,
                   confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """One record per (estimator, N, mu): truth, mean, sd, bias of the point estimate over `rows` independent
    rows, the mean lower and upper bounds and their coverage."""
    out = []
    for n in ns:
        for mu in mus:
            rng = np.random.default_rng([seed, n, int(mu * 1000)])
            u, r = rng.normal(size=(n, rows)), rng.normal(mu, 1.0, size=(n, rows))
            truth = float(gdp_epsilon(mu, delta)[0])
            for est in ("threshold", "gaussian"):
                e = row_epsilon(u, r, est, delta, confidence, seed=seed)
                plain = (None if e.boot_mu is None else  # the percentile lower bound, for comparison
                         round(float(np.mean(gdp_epsilon(np.quantile(e.boot_mu, 1 - confidence, axis=0), delta)
                                             <= truth + 1e-12)), 4))
                out.append({"estimator": est, "n": n, "mu": mu, "truth": round(truth, 4), "percentile_lower_holds": plain,
                            "mean": round(float(e.point.mean()), 4), "sd": round(float(e.point.std()), 4),
                            "bias": round(float(e.point.mean()) - truth, 4),
                            "lower_mean": round(float(e.lower.mean()), 4), "upper_mean": round(float(e.upper.mean()), 4),
                            "lower_holds": round(float(np.mean(e.lower <= truth + 1e-12)), 4),
                            "upper_holds": round(float(np.mean(e.upper >= truth - 1e-12)), 4)})
    return out


def table(records: list[dict]) -> str:
    lines = ["| estimator | N | mu | closed form | mean (sd) | bias | lower / upper bound (mean) | bound holds (lower / upper) "
             "| plain percentile lower bound holds |", "|---|---|---|---|---|---|---|---|---|"]
    for x in records:
        plain = x.get("percentile_lower_holds")
        plain = "" if plain is None else f"{plain:.3f}"
        lines.append(f"| {x['estimator']} | {x['n']} | {x['mu']:g} | {x['truth']:.2f} | {x['mean']:.2f} ({x['sd']:.2f}) "
                     f"| {x['bias']:+.2f} | {x['lower_mean']:.2f} / {x['upper_mean']:.2f} "
                     f"| {x['lower_holds']:.3f} / {x['upper_holds']:.3f} | {plain} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--ns", default="16,32,80")
    ap.add_argument("--mus", default="0,0.5,1,2")
    ap.add_argument("--delta", type=float, default=1e-3)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--out", default=str(ROOT / "bench/results/epsilon_estimators.json"))
    ap.add_argument("--docs", default=str(ROOT / "docs/certificate.md"), help="the page to write the table in "
                                                                           "('' to write the JSON only)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    recs = estimator_bias(tuple(int(x) for x in a.ns.split(",")), tuple(float(x) for x in a.mus.split(",")),
                          a.rows, a.delta, a.confidence)
    text = table(recs)
    print(text)
    write_json(a.out, {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": a.rows,
                       "delta": a.delta, "confidence": a.confidence,
                       "seconds": round(time.perf_counter() - t0, 1), "records": recs})
    note = (f"\n{a.rows} rows per cell, delta {a.delta}, one-sided confidence {a.confidence} for each bound "
            f"(`python bench/epsilon_estimators.py`).")
    if a.docs:
        write_between(a.docs, BEGIN, END, text + "\n" + note)


if __name__ == "__main__":
    main()
