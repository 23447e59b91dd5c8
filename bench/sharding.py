"""SISA sharded training (unlearning/sharding.py, docs/sharding.md): what a sharded original costs in accuracy
and what its exact deletions save, against the single model (Bourtoule et al., IEEE S&P 2021, report 4.63x on
Purchase, 2.45x on SVHN, 1.36x on ImageNet).

Per dataset (digits; Fashion-MNIST at 30,000 training rows, Debian package dataset-fashion-mnist; the MLP of
params.yaml, the default recipe unless --epochs says otherwise) and per S in --shards, R in --slices:
- train the S constituents from scratch in R slices (one vectorized pass per row count), sharded by user:
  every training row belongs to one synthetic user of about --rows-per-user rows (the shape of per-user or
  per-customer requests; `by: group` on a user column), and every user sits in one shard;
- validation accuracy of the aggregate (mean_probs) against the single model trained on every row;
- sisa deletions, each timed (CPU and wall seconds, 1 torch thread), gradient evaluations counted: one random row,
  50 random rows, all rows of one user, all rows of 10 users; the median over --draws draws (fewer for the
  costly requests: see the JSON's `draws`);
- the speed-up over a full retrain: the single model's retrain (the paper's baseline), and the sharded model's own
  retrain of every shard from scratch (what `retrain` would cost it).
One exactness audit per dataset (S = 5, R = 4, one user): the unlearned constituents against constituents
trained from scratch on the rows left (max abs difference; float32 on the CPU).

Writes bench/results/sharding.json, the table between `<!-- bench:sharding:begin -->` and
`<!-- bench:sharding:end -->` in docs/sharding.md, and the short summary between the same markers in README.md.
`--skewed`: instead, the skewed-grouping study (`skew_study`): one value holding 85% of the rows; the aggregate's
accuracy (mean_probs, size_weighted, vote) under hash and greedy (the pipeline's) placement, and what deleting one
row of the largest shard costs; written to bench/results/sharding_skew.json and between
`<!-- bench:sharding-skew:begin -->` and `<!-- bench:sharding-skew:end -->` in docs/sharding.md.
Usage: python bench/sharding.py [--datasets digits,fashion_mnist] [--shards 1,5,10,20] [--slices 1,4]
                                [--epochs N] [--draws 3] [--threads 1] [--skewed]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_io import write_between, write_json  # noqa: E402
from unlearning.config import Params  # noqa: E402
from unlearning.data.registry import load_dataset  # noqa: E402
from unlearning.models import TrainRecipe, accuracy, build_model, fit, seeds_for  # noqa: E402
from unlearning.sharding import ShardState, make_plan, train_from_scratch, unlearn_state  # noqa: E402

BEGIN, END = "<!-- bench:sharding:begin -->", "<!-- bench:sharding:end -->"
TARGETS = {"one_user_speedup_at_S10": 5.0, "accuracy_drop_points_at_S5_fashion_mnist": 2.0}
REQUESTS = ("one_row", "rows_50", "one_user", "users_10")


def data(name: str, rows_per_user: int, seed: int = 0):
    defaults = Params().prepare
    kw = {"seed": seed, "val_fraction": 0.2}
    if name == "fashion_mnist":
        kw.update(fashion_mnist_dir=defaults.fashion_mnist_dir, max_train=30000, max_val=5000)
    ds = load_dataset(name, **kw)
    tr, va = ds.split == "train", ds.split == "val"
    n = int(tr.sum())
    rng = np.random.default_rng(seed + 1)
    users = np.array([f"user{u}" for u in rng.integers(0, max(1, n // rows_per_user), n)], dtype=object)
    return (torch.as_tensor(ds.X[tr]), torch.as_tensor(ds.label[tr]), torch.as_tensor(ds.X[va]),
            torch.as_tensor(ds.label[va]), ds.sample_id[tr].astype(str), users, len(ds.class_names))


def timed(fn):
    """(result, wall seconds, CPU seconds of this process): the CPU time is what the wall time would be on an idle
    core with one torch thread, whatever else shares the machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def forget_ids(kind: str, ids: np.ndarray, users: np.ndarray, rng) -> list[str]:
    if kind == "one_row":
        return [str(rng.choice(ids))]
    if kind == "rows_50":
        return [str(i) for i in rng.choice(ids, 50, replace=False)]
    chosen = rng.choice(np.unique(users), 1 if kind == "one_user" else 10, replace=False)
    return [str(i) for i in ids[np.isin(users, chosen)]]


def run_dataset(name: str, shards: list[int], slices: list[int], epochs: int | None, draws: int,
                rows_per_user: int) -> dict:
    t = Params().train
    recipe = TrainRecipe(epochs=epochs or t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                         optimizer=t.optimizer, schedule=t.schedule)
    X, y, Xv, yv, ids, users, n_classes = data(name, rows_per_user)
    spec = {"arch": "mlp", "in_shape": [X.shape[1]], "n_classes": n_classes, "kwargs": {"hidden": list(t.model.hidden)}}
    single = build_model(spec, [0])
    cost, single_wall, single_s = timed(lambda: fit(single, X, y, recipe))
    single_acc = float(accuracy(single, Xv, yv)[0])
    print(f"{name}: {len(ids)} train rows, single model {single_s:.1f} CPU s ({single_wall:.1f} s wall), val acc "
          f"{single_acc:.4f}", flush=True)
    out = {"dataset": name, "n_train": len(ids), "n_val": int(len(yv)), "n_users": int(len(np.unique(users))),
           "epochs": recipe.epochs, "single": {"cpu_seconds": single_s, "wall_seconds": single_wall,
                                               "val_accuracy": single_acc,
                                               "gradient_evals": cost.gradient_evals}, "points": []}
    for S in shards:
        for R in slices:
            plan = make_plan(ids, users, S, R, 0, recipe.epochs, seeds_for(0, S, 7_000), by="group")
            ckpts = {}
            (constituents, report), full_wall, full_s = timed(lambda: train_from_scratch(
                spec, plan, X, y, recipe, checkpoint=lambda k, r, m: ckpts.__setitem__((k, r), m.select(0))))
            model = ShardState(plan, X, y, ckpts).model(constituents)
            acc = float(accuracy(model, Xv, yv)[0])
            point = {"shards": S, "slices": R, "val_accuracy": acc, "accuracy_drop_points": 100 * (single_acc - acc),
                     "sharded_retrain_cpu_seconds": full_s, "sharded_retrain_wall_seconds": full_wall,
                     "sharded_retrain_gradient_evals": report.gradient_evals,
                     "requests": {}}
            rng = np.random.default_rng(1000 * S + R)
            for kind in REQUESTS:
                n_draws = draws if kind in ("one_row", "one_user") else max(1, draws - 1)
                secs, walls, evals, shards_hit, rows = [], [], [], [], []
                for _ in range(n_draws):
                    keys = forget_ids(kind, ids, users, rng)
                    (after, rep, first), w, s = timed(lambda: unlearn_state(model, keys, recipe))
                    secs.append(s)
                    walls.append(w)
                    evals.append(rep.gradient_evals)
                    shards_hit.append(len(first))
                    rows.append(len(keys))
                sec = statistics.median(secs)
                point["requests"][kind] = {
                    "draws": n_draws, "rows": statistics.median(rows), "cpu_seconds": sec,
                    "wall_seconds": statistics.median(walls),
                    "wall_speedup_vs_single_retrain": single_wall / max(statistics.median(walls), 1e-9),
                    "shards_retrained": statistics.median(shards_hit),
                    "gradient_evals": statistics.median(evals),
                    "speedup_vs_single_retrain": single_s / max(sec, 1e-9),
                    "speedup_vs_sharded_retrain": full_s / max(sec, 1e-9),
                    "compute_speedup_vs_single_retrain": cost.gradient_evals / max(statistics.median(evals), 1)}
            r = point["requests"]
            print(f"  S={S:>2} R={R}: acc {acc:.4f} ({point['accuracy_drop_points']:+.2f} pts), sharded retrain "
                  f"{full_s:.1f} CPU s; CPU-time speed-up vs single: row "
                  f"{r['one_row']['speedup_vs_single_retrain']:.1f}x, "
                  f"50 rows {r['rows_50']['speedup_vs_single_retrain']:.1f}x, user "
                  f"{r['one_user']['speedup_vs_single_retrain']:.1f}x, 10 users "
                  f"{r['users_10']['speedup_vs_single_retrain']:.1f}x", flush=True)
            out["points"].append(point)
    out["audit"] = audit(spec, X, y, ids, users, recipe)
    return out


def audit(spec, X, y, ids, users, recipe) -> dict:
    """Exactness: one user's deletion by sisa against a from-scratch run on the rows left (S = 5, R = 4)."""
    plan = make_plan(ids, users, 5, 4, 0, recipe.epochs, seeds_for(0, 5, 7_000), by="group")
    ckpts = {}
    constituents, _ = train_from_scratch(spec, plan, X, y, recipe,
                                         checkpoint=lambda k, r, m: ckpts.__setitem__((k, r), m.select(0)))
    keys = forget_ids("one_user", ids, users, np.random.default_rng(7))
    after, _, first = unlearn_state(ShardState(plan, X, y, ckpts).model(constituents), keys, recipe)
    st = after.shard_state
    reference, _ = train_from_scratch(spec, st.plan, st.X, st.y, recipe)
    diff = max((a - b).abs().max().item() for a, b in zip(after.constituents.parameters(), reference.parameters()))
    return {"shards": 5, "slices": 4, "rows_forgotten": len(keys), "shards_retrained": sorted(first),
            "max_abs_param_difference": diff, "exact_to_1e-6": diff <= 1e-6}


SKEW_BEGIN, SKEW_END = "<!-- bench:sharding-skew:begin -->", "<!-- bench:sharding-skew:end -->"


def skewed_keys(n: int, share: float, others: int, seed: int = 0) -> np.ndarray:
    """A skewed grouping of n rows (Adult's native_country: one value holds ~90%): `share` of the rows in one
    value, the rest spread over `others` values of Zipf-like sizes."""
    rng = np.random.default_rng(seed + 2)
    weights = 1.0 / np.arange(1, others + 1)
    small = rng.choice(others, n, p=weights / weights.sum())
    return np.where(rng.random(n) < share, "dominant", np.char.add("v", small.astype(str))).astype(object)


def hash_placement(plan, keys: np.ndarray, seed: int):
    """The plan with each value in shard sha256(value) mod S (the placement a plain hash gives; the pipeline's own
    is greedy bin-packing, unlearning/sharding.py assign_shards), slices recut the same way."""
    import dataclasses
    import hashlib

    from unlearning.sharding import assign_slices

    shard = np.asarray([int(hashlib.sha256(str(k).encode()).hexdigest(), 16) % plan.shards for k in keys])
    return dataclasses.replace(plan, shard=shard, slice=assign_slices(keys, shard, plan.shards, plan.slices, seed))


def skew_study(name: str, shards: int, epochs: int | None, share: float = 0.85, others: int = 40) -> dict:
    """What balanced placement and the size-weighted aggregate do on a skewed grouping: validation accuracy of
    the single model and of the aggregate (mean_probs, size_weighted, vote) under hash and greedy placement, the
    shard sizes, and what deleting one row of the largest shard costs in retrains."""
    from unlearning.sharding import cost_in_retrains, shard_skew

    t = Params().train
    recipe = TrainRecipe(epochs=epochs or t.epochs, batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay,
                         optimizer=t.optimizer, schedule=t.schedule)
    X, y, Xv, yv, ids, _, n_classes = data(name, 30)
    keys = skewed_keys(len(ids), share, others)
    spec = {"arch": "mlp", "in_shape": [X.shape[1]], "n_classes": n_classes, "kwargs": {"hidden": list(t.model.hidden)}}
    single = build_model(spec, [0])
    fit(single, X, y, recipe)
    out = {"dataset": name, "shards": shards, "epochs": recipe.epochs, "dominant_share": share, "values": others + 1,
           "single_val_accuracy": float(accuracy(single, Xv, yv)[0]), "placements": {}}
    greedy = make_plan(ids, keys, shards, 1, 0, recipe.epochs, seeds_for(0, shards, 7_000), by="group")
    for placement, plan in (("hash", hash_placement(greedy, keys, 0)), ("greedy", greedy)):
        sizes = plan.sizes()
        constituents, _ = train_from_scratch(spec, plan, X, y, recipe)
        accs = {agg: float(accuracy(ShardState(plan, X, y, {}, agg).model(constituents), Xv, yv)[0])
                for agg in ("mean_probs", "size_weighted", "vote")}
        largest = int(np.argmax(sizes))
        out["placements"][placement] = {
            "shard_rows": sizes, "skew": shard_skew(sizes), "val_accuracy": accs,
            "one_row_of_largest_shard_retrains": cost_in_retrains(plan, {largest: 0})}
        print(f"  skewed {name} S={shards} {placement}: sizes {sorted(sizes, reverse=True)}, acc "
              + ", ".join(f"{k} {v:.4f}" for k, v in accs.items())
              + f" (single {out['single_val_accuracy']:.4f})", flush=True)
    return out


def skew_table(result: dict) -> str:
    lines = [f"Measured {result['measured_at']} on {result['machine']} (2 cores shared with other jobs, loaded) by "
             f"`python bench/sharding.py --skewed`: {result['dataset']}, {result['epochs']} epochs, S = "
             f"{result['shards']}, one value holding {result['dominant_share']:.0%} of the rows and "
             f"{result['values'] - 1} small ones; one draw (a small run).", "",
             "| placement | shard rows | largest / mean | one row of the largest shard | mean_probs | size_weighted "
             "| vote | single model |", "|---|---|---|---|---|---|---|---|"]
    for name, p in result["placements"].items():
        a = p["val_accuracy"]
        lines.append(f"| {name} | {' / '.join(map(str, sorted(p['shard_rows'], reverse=True)))} | {p['skew']:.1f} | "
                     f"{p['one_row_of_largest_shard_retrains']:.2f} retrains | {a['mean_probs']:.3f} | "
                     f"{a['size_weighted']:.3f} | {a['vote']:.3f} | {result['single_val_accuracy']:.3f} |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.1f}x"


def table(result: dict) -> str:
    lines = [f"Measured {result['measured_at']} on {result['machine']} ({result['threads']} torch thread, 2 cores "
             f"shared with other jobs) by `python bench/sharding.py`; {result['note']}. "
             f"Speed-up of the exact sisa deletion over one retrain of the single model, in CPU time of the "
             f"process (what the wall time is on an idle core; wall times, noisier here, are in the JSON); in "
             f"brackets: "
             f"in gradient evaluations. Users: synthetic, about "
             f"{result['rows_per_user']} rows each, sharded `by: group`.", "",
             "| data | S | R | val acc (single) | vs single (pts) | one row | 50 rows | one user | 10 users |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d in result["datasets"]:
        for p in d["points"]:
            r = p["requests"]
            cells = [f"{_fmt(r[k]['speedup_vs_single_retrain'])} ({_fmt(r[k]['compute_speedup_vs_single_retrain'])})"
                     for k in REQUESTS]
            lines.append(f"| {d['dataset']} | {p['shards']} | {p['slices']} | {p['val_accuracy']:.3f} "
                         f"({d['single']['val_accuracy']:.3f}) | {-p['accuracy_drop_points']:+.1f} | "
                         + " | ".join(cells)
                         + " |")
    for d in result["datasets"]:
        a = d["audit"]
        lines.append(f"\nExactness audit ({d['dataset']}, S = 5, R = 4, one user of {a['rows_forgotten']} rows): max "
                     f"|unlearned - from scratch| = {a['max_abs_param_difference']:.2g} over every parameter.")
    lines.append("\n" + "; ".join(result["verdicts"]) + ".")
    return "\n".join(lines)


def dataset_note(d: dict) -> str:
    r = d["points"][0]["requests"]
    return (f"{d['dataset']}: {d['epochs']} epochs, medians of {r['one_row']['draws']} draws "
            f"({r['rows_50']['draws']} for 50 rows and 10 users)")


def audit_words(result: dict) -> str:
    diff = max(d["audit"]["max_abs_param_difference"] for d in result["datasets"])
    return "bit-equal" if diff == 0 else f"within {diff:.1g} (not bit-equal)"


def summary(result: dict) -> str:
    """The README's few lines: the one-user speed-up at S = 10, the accuracy at S = 5, what scattered rows gain."""
    import textwrap

    def span(values) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.1f}x" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}x"

    pts = [(d, p) for d in result["datasets"] for p in d["points"]]
    user10 = [p["requests"]["one_user"]["speedup_vs_single_retrain"] for _, p in pts if p["shards"] == 10]
    rows50 = [p["requests"]["rows_50"]["speedup_vs_single_retrain"] for _, p in pts if p["shards"] > 1]
    acc5 = [(p["val_accuracy"], d["single"]["val_accuracy"], p["accuracy_drop_points"]) for d, p in pts
            if p["shards"] == 5 and d["dataset"] == "fashion_mnist"]
    target = TARGETS["one_user_speedup_at_S10"]
    text = (f"Sharded originals ([docs/sharding.md](docs/sharding.md), `python bench/sharding.py`, "
            f"{result['measured_at'][:10]}): deleting one user's rows from S = 10 shards is {span(user10)} faster "
            f"than a retrain of the single model (CPU time, digits and Fashion-MNIST 30,000 rows, R = 1 and 4; target "
            f"{target:.0f}x: {'met' if min(user10) >= target else 'missed'}); the audit's unlearned constituents "
            f"against a from-scratch run: {audit_words(result)}.")
    if acc5:
        worst = max(acc5, key=lambda a: a[2])
        text += (f" At S = 5 the Fashion-MNIST aggregate's validation accuracy is {min(a[0] for a in acc5):.3f}-"
                 f"{max(a[0] for a in acc5):.3f} against the single model's {worst[1]:.3f} (target: at most "
                 f"{TARGETS['accuracy_drop_points_at_S5_fashion_mnist']:.0f} points below: "
                 f"{'met' if worst[2] <= TARGETS['accuracy_drop_points_at_S5_fashion_mnist'] else 'missed'}).")
    text += (f" Scattered rows gain little: 50 random rows touch nearly every shard ({span(rows50)}); shard by who "
             f"asks.")
    return textwrap.fill(text, width=115) + "\n"


def verdicts(result: dict) -> list[str]:
    out = []
    for d in result["datasets"]:
        for p in d["points"]:
            if p["shards"] == 10:
                s = p["requests"]["one_user"]["speedup_vs_single_retrain"]
                out.append(f"{d['dataset']} S = 10, R = {p['slices']}: one user's deletion {s:.1f}x faster than a "
                           f"retrain (target {TARGETS['one_user_speedup_at_S10']:.0f}x: "
                           f"{'met' if s >= TARGETS['one_user_speedup_at_S10'] else 'missed'})")
            if p["shards"] == 5 and d["dataset"] == "fashion_mnist":
                drop = p["accuracy_drop_points"]
                out.append(f"{d['dataset']} S = 5, R = {p['slices']}: validation accuracy {p['val_accuracy']:.3f} "
                           f"against the single model's {d['single']['val_accuracy']:.3f} ({-drop:+.1f} points; "
                           f"target: at most {TARGETS['accuracy_drop_points_at_S5_fashion_mnist']:.0f} below, "
                           f"{'met' if drop <= TARGETS['accuracy_drop_points_at_S5_fashion_mnist'] else 'missed'})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="digits,fashion_mnist")
    ap.add_argument("--shards", default="1,5,10,20")
    ap.add_argument("--slices", default="1,4")
    ap.add_argument("--epochs", type=int, default=None, help="default: train.epochs of params.yaml")
    ap.add_argument("--draws", type=int, default=3, help="draws of the cheap requests (one row, one user); "
                                                         "the costly ones (50 rows, 10 users) take one fewer")
    ap.add_argument("--rows-per-user", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sharding.json"))
    ap.add_argument("--page", default=str(ROOT / "docs" / "sharding.md"), help="the docs page of the full table")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--merge", help="a,b.json: join the datasets of earlier runs' JSON (one run per dataset) and "
                                    "write the JSON and the tables, training nothing")
    ap.add_argument("--skewed", action="store_true", help="only the skewed-grouping study: hash vs greedy placement, "
                                                           "mean_probs vs size_weighted vs vote (first of --datasets, "
                                                           "first of --shards above 1)")
    a = ap.parse_args()
    if a.skewed:
        torch.set_num_threads(a.threads)
        torch.manual_seed(0)
        S = next((int(s) for s in a.shards.split(",") if int(s) > 1), 5)
        result = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "machine": platform.machine(), **skew_study(a.datasets.split(",")[0], S, a.epochs)}
        write_json(Path(a.out).with_name("sharding_skew.json"), result)
        if a.page:
            write_between(a.page, SKEW_BEGIN, SKEW_END, skew_table(result))
        return
    if a.merge:
        parts = [__import__("json").loads(Path(f).read_text()) for f in a.merge.split(",")]
        result = {**parts[-1], "datasets": [d for p in parts for d in p["datasets"]],
                  "seconds": sum(p["seconds"] for p in parts),
                  "note": "; ".join(dataset_note(d) for p in parts for d in p["datasets"])}
        result["verdicts"] = verdicts(result)
        return finish(result, a)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    datasets = [run_dataset(n, [int(s) for s in a.shards.split(",")], [int(r) for r in a.slices.split(",")],
                            a.epochs, a.draws, a.rows_per_user) for n in a.datasets.split(",")]
    result = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.machine(), "threads": a.threads, "rows_per_user": a.rows_per_user,
              "note": "; ".join(dataset_note(d) for d in datasets)
                      + ("" if a.epochs is None else " (--epochs: fewer than the recipe's)"),
              "targets": TARGETS, "datasets": datasets, "seconds": time.perf_counter() - start}
    result["verdicts"] = verdicts(result)
    finish(result, a)


def finish(result: dict, a) -> None:
    write_json(a.out, result)
    if a.page:
        write_between(a.page, BEGIN, END, table(result))
    if a.readme:
        write_between(a.readme, BEGIN, END, summary(result))
    print("\n".join(result["verdicts"]))


if __name__ == "__main__":
    main()
