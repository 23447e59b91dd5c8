"""newton_ggn: influence removal (forget gradient) vs a Newton step on the retain objective.

Both steps use the same matrix, G_R + lam I with lam = train.weight_decay * |R| (the damping matched to the
recipe, the method's default); they differ in the gradient:
- `retain`: theta0 - (G_R + lam I)^-1 grad(L_R + lam/2 ||.||^2)(theta0), with the Armijo line search;
- `forget`: theta0 + (G_R + lam I)^-1 grad L_F(theta0) (unlearning/leverage/newton.influence_removal_step).
At a minimiser of the full objective they coincide (tests/unit/test_newton_ggn.py, ridge); a recipe that stops
early is not at one. Measured against the oracles (exact retrains on R with the project's recipe): for each
candidate member, the mean over samples of |margin(candidate) - mean margin(oracles)|, per split, averaged
over the candidate's members (several originals, so one lucky seed does not decide); do_nothing for scale.

Digits default model and recipe (params.yaml). Sets: random forget sets of 50 training rows, one whole class
(3), and the 50 rows of highest training loss (a high-self-leverage proxy, as bench/calibration.py).
Writes bench/results/newton_removal.json and prints a markdown table.
Usage: python bench/newton_removal.py [--oracles 16] [--members 4] [--random-sets 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from digits_problem import digits_problem, train_members  # noqa: E402  (bench/ is on sys.path as a script)
from unlearning.config import load_params  # noqa: E402
from unlearning.methods import run_method  # noqa: E402
from unlearning.methods.base import UnlearnContext  # noqa: E402
from unlearning.metrics import margins  # noqa: E402
from unlearning.models import predict_logits  # noqa: E402
from unlearning.seeds import method_seed, role_seeds  # noqa: E402

CANDIDATES = {"do_nothing": ("do_nothing", {}), "newton_retain": ("newton_ggn", {"gradient": "retain"}),
              "newton_forget": ("newton_ggn", {"gradient": "forget"})}


_train = train_members


def main() -> None:
    params = load_params(ROOT / "params.yaml")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oracles", type=int, default=16, help="oracles per set (their mean margin is the reference)")
    ap.add_argument("--members", type=int, default=4, help="originals unlearned per set (candidate members)")
    ap.add_argument("--random-sets", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=params.base.seed)
    ap.add_argument("--out", default=str(ROOT / "bench/results/newton_removal.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    prob = digits_problem(params)
    X, y, y_np, spec, recipe = prob.X, prob.y, prob.y_np, prob.spec, prob.recipe
    train_rows, val_rows = prob.train_rows, prob.val_rows
    originals = _train(spec, role_seeds(a.seed, "bench", a.members), X[train_rows], y[train_rows], recipe)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(predict_logits(originals, X[train_rows])[0], y[train_rows],
                                                 reduction="none").numpy()
    rng = np.random.default_rng(a.seed + 6)
    sets = [(f"random50_{k}", np.sort(rng.choice(train_rows, 50, replace=False))) for k in range(a.random_sets)]
    sets += [("class_3", train_rows[y_np[train_rows] == 3]), ("high_loss50", np.sort(train_rows[np.argsort(-loss)[:50]]))]

    rows = []
    for name, F in sets:
        ts = time.perf_counter()
        R = np.setdiff1d(train_rows, F)
        oracles = _train(spec, role_seeds(a.seed, "oracles", a.oracles), X[R], y[R], recipe)
        eval_rows = {"forget": F, "retain": np.sort(np.random.default_rng(a.seed).choice(R, 300, replace=False)),
                     "validation": val_rows}
        ref = {s: margins(predict_logits(oracles, X[r]).numpy(), y_np[r]).mean(0) for s, r in eval_rows.items()}
        spread = {s: float(np.mean(np.abs(margins(predict_logits(oracles, X[r]).numpy(), y_np[r]) - ref[s])))
                  for s, r in eval_rows.items()}  # one oracle vs the oracles' mean: the noise level
        ctx = UnlearnContext(model=originals, X_forget=X[F], y_forget=y[F], X_retain=X[R], y_retain=y[R],
                             adjacent_mask=torch.as_tensor(np.isin(y_np[R], np.unique(y_np[F]))), recipe=recipe,
                             seed=method_seed(a.seed))
        out = {"set": name, "n_forget": int(len(F)), "oracle_spread": spread, "candidates": {}}
        for label, (method, args) in CANDIDATES.items():
            tm = time.perf_counter()
            model = run_method(method, ctx, args).model
            sec = time.perf_counter() - tm
            gap = {s: float(np.mean(np.abs(margins(predict_logits(model, X[r]).numpy(), y_np[r]) - ref[s])))
                   for s, r in eval_rows.items()}
            acc = {s: float((predict_logits(model, X[r]).argmax(-1).numpy() == y_np[r]).mean()) for s, r in eval_rows.items()}
            out["candidates"][label] = {"margin_gap": gap, "accuracy": acc, "seconds": round(sec, 2)}
        out["seconds"] = round(time.perf_counter() - ts, 1)
        rows.append(out)
        c = out["candidates"]
        print(f"{name:14s} nF={len(F):4d} |margin gap| forget: " + "  ".join(
            f"{k} {v['margin_gap']['forget']:.3f}" for k, v in c.items()) + f"  (oracle spread {spread['forget']:.3f}; "
              f"{out['seconds']:.0f} s)", flush=True)

    closer = {s: sum(r["candidates"]["newton_forget"]["margin_gap"][s] < r["candidates"]["newton_retain"]["margin_gap"][s]
                     for r in rows) for s in ("forget", "retain", "validation")}
    beats_nothing = {k: sum(r["candidates"][k]["margin_gap"]["forget"] < r["candidates"]["do_nothing"]["margin_gap"]["forget"]
                            for r in rows) for k in ("newton_retain", "newton_forget")}
    result = {"bench": "newton_removal", "when": datetime.now(timezone.utc).isoformat(), "machine": platform.platform(),
              "threads": a.threads, "oracles": a.oracles, "members": a.members, "sets": rows,
              "newton_forget_closer_than_retain": closer, "beats_do_nothing_on_forget": beats_nothing,
              "n_sets": len(rows), "seconds": round(time.perf_counter() - t_start, 1)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print("\n| set | nF | split | oracle spread | do_nothing | newton retain | newton forget |\n|---|---|---|---|---|---|---|")
    for r in rows:
        for s in ("forget", "retain", "validation"):
            c = r["candidates"]
            print(f"| {r['set']} | {r['n_forget']} | {s} | {r['oracle_spread'][s]:.3f} | "
                  f"{c['do_nothing']['margin_gap'][s]:.3f} | {c['newton_retain']['margin_gap'][s]:.3f} | "
                  f"{c['newton_forget']['margin_gap'][s]:.3f} |")
    print(f"\nnewton_forget closer to the oracles than newton_retain (sets of {len(rows)}): {closer}")
    print(f"closer than do_nothing on the forget split: {beats_nothing}; wall {result['seconds']:.0f} s; wrote {a.out}")


if __name__ == "__main__":
    main()
