"""Benchmark of the leverage diagnostics (docs/design.md §4.1) on sklearn digits, one run, ratios measured together.

1. Solvers: exact (dense float64, the reference) vs projected (k = 256, 1024) vs matrix-free CG, at growing
   parameter counts (MLP 64-h-10 for h in --widths), all 1,797 digits (|F| = 20, R = the rest): seconds of
   the full diagnostics and the relative error / Spearman of the per-sample self-leverage vs exact.
2. Predicted vs actual output gap: the default model (64-32-10, the params.yaml recipe) trained on the
   80% train split; the Newton/influence predicted per-sample gap (Fisher norm) against the actual gap of the
   original vs the mean of a small oracle ensemble retrained on R with `train_ensemble`, as Spearman
   correlations per split (with the original's per-sample loss as a naive baseline).

Prints tables, writes bench/results/leverage.json.  Usage: python bench/leverage.py [--widths 8 16 32 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unlearning.leverage import (  # noqa: E402
    CGSolver, RowSet, StackedMemberFunction, compute_diagnostics, make_targets, spearman,
)
from unlearning.models import build_model, clone_model, predict_logits, train_ensemble  # noqa: E402

RECIPE = dict(epochs=30, batch_size=64, lr=0.01, weight_decay=5e-4)  # params.yaml `train`


def load_digits_tensors():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


def spec(h: int) -> dict:
    return {"arch": "mlp", "in_dim": 64, "hidden": [h], "n_classes": 10, "image_shape": None}


def train(h: int, X, y, seeds, epochs) -> torch.nn.Module:
    model = build_model(spec(h), seeds)
    train_ensemble(model, X, y, **{**RECIPE, "epochs": epochs})
    return model


def timed_diagnostics(model, X, y, F, R, lam, solver, repeats=1, **kw):
    """Best-of-`repeats` wall time of compute_diagnostics (the machine may be shared)."""
    best, rep = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        rep = compute_diagnostics(model, X[F], y[F], X[R], y[R], None, None, lam, solver=solver, device="cpu",
                                  check_subset=0, **kw)
        best = min(best, time.perf_counter() - t0)
    return best, rep


def solver_table(X, y, widths, epochs, lam, n_forget, repeats, skip_cg=False):
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(X), generator=g)
    F, R = perm[:n_forget], perm[n_forget:]
    rows = []
    for h in widths:
        model = train(h, X, y, [0], epochs)
        t_exact, exact = timed_diagnostics(model, X, y, F, R, lam, "exact", repeats)
        ref = exact.self_leverage
        row = {"hidden": h, "params": exact.n_params, "exact_s": t_exact,
               "exact_timings": {k: round(v, 3) for k, v in exact.timings.items()}}
        runs = [("proj256", dict(solver="projected", proj_dim=256)),
                ("proj1024", dict(solver="projected", proj_dim=1024)),
                ("cg", dict(solver="cg", cg_tol=1e-8, cg_iters=2000))]
        for name, kw in runs[:2] if skip_cg else runs:
            t, rep = timed_diagnostics(model, X, y, F, R, lam, kw.pop("solver"), 1, **kw)
            got = rep.self_leverage
            row[name] = {"s": t, "rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
                         "spearman": spearman(got, ref),
                         "newton_step_rel_err": float(np.linalg.norm(rep.newton_step - exact.newton_step)
                                                      / np.linalg.norm(exact.newton_step)),
                         **({"k": rep.solver_info["k"]} if "k" in rep.solver_info else {}),
                         **({"iterations": rep.solver_info["iterations"]} if name == "cg" else {})}
        rows.append(row)
        print(f"  h={h:3d} p={row['params']:5d}  exact {t_exact:6.2f}s | "
              + " | ".join(f"{n} {row[n]['s']:6.2f}s err {row[n]['rel_err']:.1e} rho {row[n]['spearman']:.3f}"
                           for n, _ in (runs[:2] if skip_cg else runs)), flush=True)
        if skip_cg:
            row["cg"] = {"s": float("nan"), "rel_err": float("nan"), "spearman": float("nan"), "iterations": -1}
    return rows


def cg_preconditioner_check(X, y, h, epochs, lam, n_rhs=4):
    """CG iterations with and without the Jacobi preconditioner on G_R V = B (random B [p, n_rhs])."""
    model = train(h, X, y, [0], epochs)
    fn = StackedMemberFunction(model, 0, device="cpu")
    rs = RowSet(fn, fn.theta0, X, make_targets(y, 10, "ce", torch.float64, "cpu"), "ce")
    B = torch.randn(fn.p, n_rhs, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = {}
    for pre in (False, True):
        slv = CGSolver(lam, tol=1e-8, max_iters=5000, precondition=pre).fit([rs])
        t0 = time.perf_counter()
        slv.solve(B)
        out["jacobi" if pre else "none"] = {"iterations": slv.info["iterations"], "s": time.perf_counter() - t0}
    return out


def _sqrt2kl(p, q):
    """sqrt(2 KL(p || q)) per row: the units of a Fisher norm of an output change."""
    kl = (p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log())).sum(-1)
    return (2 * kl.clamp_min(0)).sqrt()


def gap_correlation(X, y, h, epochs, lams, n_oracles, forget_frac, warm_epochs=10, seed=0):
    """Spearman(predicted per-sample gap, actual gap of the original vs the oracle-ensemble mean).

    Also: the removal-only prediction (J G_R^-1 J_F^T g_F), the original's per-sample loss as a naive
    baseline, the oracles' seed noise, and the gap to a WARM retrain (the original fine-tuned on R with the
    recipe for `warm_epochs`), which shares the original's basin as the Newton prediction does."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(X), generator=g)
    n_val = int(0.2 * len(X))
    V, D = perm[:n_val], perm[n_val:]
    n_f = int(forget_frac * len(D))
    F, R = D[:n_f], D[n_f:]
    t0 = time.perf_counter()
    original = train(h, X[D], y[D], [seed], epochs)
    oracles = train(h, X[R], y[R], list(range(seed + 1, seed + 1 + n_oracles)), epochs)
    warm = clone_model(original)
    train_ensemble(warm, X[R], y[R], **{**RECIPE, "epochs": warm_epochs})
    t_train = time.perf_counter() - t0

    def probs(model, idx):
        return torch.softmax(predict_logits(model, X[idx]).double(), -1)  # [N, n, C]

    out = {"hidden": h, "n_forget": n_f, "n_retain": len(R), "n_val": n_val, "n_oracles": n_oracles,
           "warm_epochs": warm_epochs, "train_seconds": t_train, "by_lam": {}}
    splits = {"forget": F, "retain": R, "validation": V}
    actual, actual_warm = {}, {}
    for name, idx in splits.items():
        p_orig, p_or = probs(original, idx)[0], probs(oracles, idx)
        actual[name] = _sqrt2kl(p_orig, p_or.mean(0)).numpy()
        actual_warm[name] = _sqrt2kl(p_orig, probs(warm, idx)[0]).numpy()
        loss = (-p_orig[torch.arange(len(idx)), y[idx]].log()).numpy()
        # seed noise: one oracle against the mean of the others (what no single-model predictor explains)
        out.setdefault("noise_floor_mean_sqrt2kl", {})[name] = float(_sqrt2kl(p_or[0], p_or[1:].mean(0)).mean())
        out.setdefault("actual_mean_sqrt2kl", {})[name] = float(actual[name].mean())
        out.setdefault("actual_warm_mean_sqrt2kl", {})[name] = float(actual_warm[name].mean())
        out.setdefault("spearman_loss_baseline", {})[name] = spearman(loss, actual[name])
    for lam in lams:
        t0 = time.perf_counter()
        rep = compute_diagnostics(original, X[F], y[F], X[R], y[R], X[V], y[V], lam, solver="exact", device="cpu")
        sec = time.perf_counter() - t0
        pred = {s: getattr(rep, f"predicted_gap_{s}") for s in splits}
        removal = {s: getattr(rep, f"predicted_removal_gap_{s}") for s in splits}
        out["by_lam"][str(lam)] = {
            "diagnostics_s": sec, "leakage_ratio": rep.leakage_ratio,
            "spearman": {s: spearman(pred[s], actual[s]) for s in splits},
            "spearman_removal_only": {s: spearman(removal[s], actual[s]) for s in splits},
            "spearman_vs_warm_retrain": {s: spearman(pred[s], actual_warm[s]) for s in splits},
            "predicted_mean": {s: float(pred[s].mean()) for s in splits},
            "removal_mean": {s: float(removal[s].mean()) for s in splits}}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    ap.add_argument("--lam", type=float, default=1.0, help="damping for the solver table")
    ap.add_argument("--n-forget", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2, help="best-of repeats for the exact timing")
    ap.add_argument("--default-hidden", type=int, default=32)
    ap.add_argument("--skip-cg", action="store_true", help="leave CG out of the solver table (the slow part)")
    ap.add_argument("--n-oracles", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "leverage.json"))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    X, y = load_digits_tensors()
    meta = {"threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "n": len(X), "recipe": RECIPE, "load_avg_start": os.getloadavg()}
    print(f"digits n={len(X)}, torch threads={meta['threads']}, load avg={meta['load_avg_start']}")

    print(f"\n[1] solvers, all {len(X)} digits, |F|={args.n_forget}, lam={args.lam} "
          f"(self-leverage error vs exact float64)")
    table = solver_table(X, y, args.widths, args.epochs, args.lam, args.n_forget, args.repeats, args.skip_cg)
    print(f"\n{'hidden':>6} {'params':>6} {'exact s':>8} {'proj256 s':>9} {'err':>8} {'rho':>6} "
          f"{'proj1024 s':>10} {'err':>8} {'rho':>6} {'cg s':>7} {'err':>8} {'iters':>5}")
    for r in table:
        print(f"{r['hidden']:>6} {r['params']:>6} {r['exact_s']:>8.2f} {r['proj256']['s']:>9.2f} "
              f"{r['proj256']['rel_err']:>8.1e} {r['proj256']['spearman']:>6.3f} {r['proj1024']['s']:>10.2f} "
              f"{r['proj1024']['rel_err']:>8.1e} {r['proj1024']['spearman']:>6.3f} {r['cg']['s']:>7.2f} "
              f"{r['cg']['rel_err']:>8.1e} {r['cg']['iterations']:>5}")
    fast = [r["hidden"] for r in table if r["exact_s"] <= 5.0]
    print(f"widths whose exact diagnostics take <= 5 s: {fast}")

    print("\n[2] CG iterations with / without the Jacobi preconditioner (hidden=16, 4 right-hand sides)")
    pre = cg_preconditioner_check(X, y, 16, args.epochs, args.lam)
    print("  ", pre)

    print(f"\n[3] predicted vs actual gap, hidden={args.default_hidden}, {args.n_oracles} oracles retrained on R")
    corr = gap_correlation(X, y, args.default_hidden, args.epochs, [1.0, 10.0, 100.0], args.n_oracles, 0.05)
    print(f"  |F|={corr['n_forget']} |R|={corr['n_retain']} |V|={corr['n_val']}, training {corr['train_seconds']:.1f}s")
    fmt = lambda d: "{" + ", ".join(f"{k}: {v:.3f}" for k, v in d.items()) + "}"  # noqa: E731
    print(f"  actual mean sqrt(2KL) vs oracle mean {fmt(corr['actual_mean_sqrt2kl'])}; "
          f"oracle seed noise {fmt(corr['noise_floor_mean_sqrt2kl'])}; vs warm retrain "
          f"{fmt(corr['actual_warm_mean_sqrt2kl'])}")
    print(f"  Spearman(original loss, actual) baseline  {fmt(corr['spearman_loss_baseline'])}")
    for lam, r in corr["by_lam"].items():
        print(f"  lam={lam:>6} ({r['diagnostics_s']:.2f}s): Spearman(predicted, actual) {fmt(r['spearman'])}; "
              f"removal-only {fmt(r['spearman_removal_only'])}; vs warm retrain {fmt(r['spearman_vs_warm_retrain'])}")
        print(f"{'':>16}predicted mean {fmt(r['predicted_mean'])}; removal-only mean {fmt(r['removal_mean'])}")

    result = {"meta": {**meta, "load_avg_end": os.getloadavg()}, "solvers": table, "exact_within_5s": fast,
              "cg_preconditioner": pre, "gap_correlation": corr}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=float))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
