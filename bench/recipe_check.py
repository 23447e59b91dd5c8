"""Benchmark: the recipe check's error rates (unlearning/metrics/exchangeability.py) on the digits default.

The check pools the production model with N shadow originals (the declared recipe, params.yaml's `train`,
on the same rows) and warns when the model lies beyond every shadow (p = 1 / (N + 1)). This bench measures:
- false alarms: fresh models of the declared recipe (new seeds), each checked against the same N shadows
  (expected 1 / (N + 1) under exchangeability);
- detection per recipe change: models trained by one changed recipe (the kind of mismatch a checkpoint of
  your own, `train.init_checkpoint`, can carry), several seeds each.
Prints a table; writes bench/results/recipe_check.json.
Usage: python bench/recipe_check.py [--shadows 80] [--null 40] [--seeds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
from results_io import write_json  # noqa: E402  (bench/ is on sys.path when run as a script)

from unlearning.config import load_params
from unlearning.data import load_dataset
from unlearning.metrics.exchangeability import exchangeability_test
from unlearning.metrics.margins import margins
from unlearning.models import TrainRecipe, build_model, fit
from unlearning.models.zoo import arch_kwargs

ROOT = Path(__file__).resolve().parents[1]


def changes(r: TrainRecipe) -> dict[str, TrainRecipe]:
    rep = dataclasses.replace
    return {"epochs / 3": rep(r, epochs=max(1, r.epochs // 3)), "epochs x 3": rep(r, epochs=r.epochs * 3),
            "lr / 3": rep(r, lr=r.lr / 3), "lr x 3": rep(r, lr=r.lr * 3),
            "weight decay x 20": rep(r, weight_decay=r.weight_decay * 20),
            "label smoothing 0.1": rep(r, label_smoothing=0.1), "batch size x 2": rep(r, batch_size=r.batch_size * 2),
            "sgd momentum 0.9, lr x 5": rep(r, optimizer="sgd", momentum=0.9, lr=r.lr * 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shadows", type=int, default=80, help="N shadow originals (validation.n_shadows)")
    ap.add_argument("--null", type=int, default=40, help="fresh models of the declared recipe (false alarms)")
    ap.add_argument("--seeds", type=int, default=5, help="models per changed recipe")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "recipe_check.json"))
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    params = load_params(ROOT / "params.yaml")
    t = params.train
    r0 = TrainRecipe(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                     optimizer=t.optimizer, momentum=t.momentum, schedule=t.schedule, label_smoothing=t.label_smoothing)
    ds = load_dataset(params.prepare.dataset, seed=params.base.seed, val_fraction=params.prepare.val_fraction)
    train = np.flatnonzero(ds.split == "train")
    X = torch.as_tensor(ds.X[train], dtype=torch.float32)
    y = torch.as_tensor(ds.label[train], dtype=torch.long)
    X_all = torch.as_tensor(ds.X, dtype=torch.float32)
    spec = {"arch": t.model.arch, "in_shape": list(ds.in_shape), "n_classes": len(ds.class_names),
            "kwargs": arch_kwargs(t.model.model_dump())}

    def trained(seeds: list[int], recipe: TrainRecipe) -> np.ndarray:
        model = build_model(spec, seeds)
        fit(model, X, y, recipe, progress=False)
        with torch.no_grad():
            return margins(model(X_all).numpy(), ds.label)  # [members, n]

    start = time.perf_counter()
    shadows = trained(list(range(10_000, 10_000 + args.shadows)), r0)
    rows = []

    def rate(name: str, m: np.ndarray) -> dict:
        out = [exchangeability_test(m[j], shadows) for j in range(m.shape[0])]
        alarms = sum(o["rank"] == o["n_pool"] for o in out)
        row = {"models": name, "n": len(out), "warned": alarms, "rate": alarms / len(out),
               "median_p": float(np.median([o["pvalue"] for o in out]))}
        rows.append(row)
        print(f"| {name} | {len(out)} | {alarms} | {alarms / len(out):.2f} | {row['median_p']:.3f} |", flush=True)
        return row

    print(f"| models checked against {args.shadows} shadows | n | warned | rate | median p |\n|---|---|---|---|---|")
    rate("declared recipe, new seeds (false alarms)", trained(list(range(20_000, 20_000 + args.null)), r0))
    for name, r in changes(r0).items():
        rate(name, trained(list(range(30_000, 30_000 + args.seeds)), r))
    expected = 1 / (args.shadows + 1)
    print(f"expected false-alarm rate under exchangeability: 1/{args.shadows + 1} = {expected:.3f}; "
          f"{time.perf_counter() - start:.0f} s")
    write_json(args.out, {"dataset": params.prepare.dataset, "arch": t.model.arch, "n_shadows": args.shadows,
                          "expected_false_alarm_rate": expected, "rows": rows,
                          "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    main()
