"""Calibration bench of the retrain-equivalence gate and of the selection policy, on digits with the
default model and recipe (train.* of params.yaml) and the gate of params.yaml.

Per forget set (random sets of sizes 10, 50 and 200, one whole class, the highest-self-leverage rows):
- oracle set A (role `oracles`, the gate's oracles) and an INDEPENDENT oracle set B (role `oracles_b`), N each,
  trained on R = D minus F; the shadow originals (role `shadows`) and the original (base.seed) on D, once;
- candidates, each judged exactly as the flow judges them (unlearning.certificate.equivalence, the sequential looks of
  unlearning.sequential, unlearning.certificate.gate; the `retrain` row is the audit of an exact retrain, one look at N):
  `retrain_indep` (member 0 of B promoted, B's N models as the "shadow-unlearned" side vs A: the gate's
  false-reject rate on a true retrain), `retrain` (the flow's path: member 0 of A vs halves of A's others),
  `do_nothing`, `gradient_ascent`, `descent_ascent` (`finetune` on the first --finetune-sets sets, `newton_ggn` on
  the first --newton-sets sets: both slow),
  each run through unlearning.methods.run_method on the original and on the N shadows;
- `true_gap_ratio` of do_nothing: max over splits of KLoM P95(shadows vs B) / KLoM P95(A vs B), an independent
  N-vs-N measure of how far the original is from a retrain ("exceeds the floor" when > 1.5);
- the policy (unlearning.policy.selection.candidate_methods over the leverage diagnostics): whether its first candidate
  passed, and the seconds spent on candidates that failed before the first passing one (regret).
- both gate criteria (`gate.criterion`): `difference` (the verdicts above) and `epsilon` with each aggregate
  (`gate.epsilon.aggregate`: quantile, mean), every candidate judged by the core's loop (unlearning/sequential.py
  run_looks, the deletion flow's) at each budget of a grid, each look measured once per aggregate; the per-look
  bounds are stored beside the decisions; each method's per-row epsilon (both estimators, at full N) per split
  and kind of set (random, class, high leverage);
- the licensing rule of doing nothing (`licensing`): do_nothing where the predicted gap (leverage diagnostics, in
  noise units) is at most g, for g at each set's own gap, and its precision: how often a licensed set then fails its audit.
`--dataset fashion_mnist --rows 8000` runs the same on Fashion-MNIST (the Debian package dataset-fashion-mnist).
Prints a table per method and writes bench/results/calibration.json (calibration_<dataset>.json for others).
Usage: python bench/calibration.py [--n 80] [--random-sets 21] [--finetune-sets 2] [--newton-sets 0] [--threads 2]
       [--dataset digits] [--rows 8000] [--class-sets 1] [--leverage-sets 1] [--certificate-rows N]
       [--methods do_nothing,...] [--no-policy] [--tables-only]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from digits_problem import digits_problem, train_members  # (bench/ is on sys.path when run as a script)
from unlearning.batch.rows import BatchRows
from unlearning.certificate import metric_keys as K
from unlearning.certificate.equivalence import certificate_measures
from unlearning.config import load_params
from unlearning.planning.plan import sequential_step
from unlearning.sequential import Criterion, LookMeasures, run_looks
from unlearning.leverage import compute_diagnostics
from unlearning.methods import run_method
from unlearning.methods.base import UnlearnContext
from unlearning.data import load_dataset
from unlearning.metrics import klom, klom_summary, margins
from unlearning.metrics.epsilon import AGGREGATES, row_epsilon
from unlearning.models.training import recipe_from
from unlearning.models.zoo import spec_from
from unlearning.studies.digits import DigitsProblem
from unlearning.batch.rows import sampled_for_certificate
from unlearning.models import predict_logits
from unlearning.seeds import method_seed, original_seed, role_seeds
from unlearning.policy.selection import batch_facts, candidate_methods
from unlearning.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
from unlearning.batch.rows import SPLITS  # noqa: E402
METHODS = ("do_nothing", "gradient_ascent", "descent_ascent")


_train = train_members


def forget_sets(rng, train_rows, y, n_random, self_lev_rank, class_sets: int = 1, leverage_sets: int = 1
                ) -> list[tuple[str, np.ndarray]]:
    sizes = (10, 50, 200)
    out = [(f"random{sizes[k % 3]}_{k // 3}", np.sort(rng.choice(train_rows, sizes[k % 3], replace=False)))
           for k in range(n_random)]
    for c in (3, 8, 5, 1, 7, 0, 2, 4, 6, 9)[:class_sets]:
        out.append((f"class_{c}", train_rows[y[train_rows] == c]))
    if self_lev_rank is not None:
        for k in range(leverage_sets):  # consecutive windows of 50 down the ranking
            out.append((f"high_self_leverage50" + (f"_{k}" if k else ""),
                        np.sort(train_rows[self_lev_rank[50 * k:50 * (k + 1)]])))
    return out


def kind_of(name: str) -> str:
    return "class" if name.startswith("class") else "high_leverage" if name.startswith("high") else "random"


def load_problem(params, name: str, rows: int | None) -> DigitsProblem:
    """digits (the default problem) or Fashion-MNIST at `rows` training rows, with the model and recipe of
    params.yaml."""
    if name == "digits":
        return digits_problem(params)
    ds = load_dataset(name, seed=params.base.seed, val_fraction=params.prepare.val_fraction,
                      fashion_mnist_dir=params.prepare.fashion_mnist_dir, max_train=rows, max_val=2000)
    y = np.asarray(ds.label).astype(np.int64)
    split = np.asarray(ds.split)
    return DigitsProblem(X=torch.as_tensor(np.asarray(ds.X), dtype=torch.float32), y=torch.as_tensor(y), y_np=y,
                         train_rows=np.flatnonzero(split == "train"), val_rows=np.flatnonzero(split == "val"),
                         spec=spec_from(params.train.model, ds.in_shape, ds.n_classes), recipe=recipe_from(params.train))


EPS_SPLITS = ("forget", "retain", "validation")


def epsilon_distribution(m_unl: np.ndarray, m_orc: np.ndarray, splits: np.ndarray, delta: float,
                         quantile: float, seed: int) -> dict:
    """Per estimator and split (forget, retain = adjacent + remote, validation): the mean and the `quantile` of
    the rows' point estimates, and the quantile of their upper bounds (one-sided 0.95), at full N."""
    merged = np.where(np.isin(splits, ("adjacent", "remote")), "retain", splits)
    out = {}
    for est in ("gaussian", "threshold"):
        rows = row_epsilon(m_unl, m_orc, est, delta, 0.95, seed=seed)
        out[est] = {s: {"mean": round(float(rows.point[merged == s].mean()), 4),
                        "q": round(float(np.quantile(rows.point[merged == s], quantile)), 4),
                        "upper_q": round(float(np.quantile(rows.upper[merged == s], quantile)), 4)}
                    for s in EPS_SPLITS if (merged == s).any()}
    return out


def budget_key(budget: float) -> str:
    return f"{budget:g}"


def eps_passed(res: dict, budget: float, how: str = "quantile") -> bool:
    """Whether the core's certificate (unlearning/sequential.py run_looks) accepted the candidate under
    `gate.criterion: epsilon` at `budget`, aggregate `how` (stored per budget by `judge`)."""
    return res["epsilon"][how]["by_budget"][budget_key(budget)]["passed"]


# --- the two criteria, the budget and the licensing rule, from the per-set records --------------------------------

BUDGETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
FAR_KINDS = ("class", "high_leverage")


def _rate(xs: list[bool]) -> dict:
    return {"n": len(xs), "accepted": int(sum(xs)), "rate": round(float(np.mean(xs)), 3) if xs else None}


CRITERIA = ("difference", "epsilon", "epsilon_mean")  # the gate as configured; epsilon by each aggregate


def criteria_summary(sets: list[dict], budget: float) -> dict:
    """Per criterion (`difference`; `epsilon` with the quantile aggregate; `epsilon_mean` with the mean): the
    independent retrain's acceptance over every set, how often an interim look rejected it, do_nothing's
    acceptance on the sets whose true gap is large (a class, high leverage), and every method's per kind of set."""
    out = {}
    for crit in CRITERIA:
        def ok(res):
            return res["passed"] if crit == "difference" else eps_passed(res, budget, AGG_OF[crit])
        per_method = {}
        for m in dict.fromkeys(m for r in sets for m in r["methods"]):
            per_method[m] = {k: _rate([ok(r["methods"][m]) for r in sets if r["kind"] == k and m in r["methods"]])
                             for k in ("random", "class", "high_leverage")}
        out[crit] = {"retrain_indep": _rate([ok(r["methods"]["retrain_indep"]) for r in sets]),
                     "retrain_indep_interim_rejects": interim_rejects(sets, crit, budget),
                     "do_nothing_far": _rate([ok(r["methods"]["do_nothing"]) for r in sets
                                              if r["kind"] in FAR_KINDS and "do_nothing" in r["methods"]]),
                     "per_method": per_method}
    return out


AGG_OF = {"epsilon": "quantile", "epsilon_mean": "mean"}


def interim_rejects(sets: list[dict], crit: str, budget: float) -> int:
    """How many sets the core's loop rejected the independent retrain on at an interim look (a false reject of a
    true retrain before the last look)."""
    def interim(res):
        if crit == "difference":
            return not res["passed"] and res["look"] < res["looks_planned"]
        d = res["epsilon"][AGG_OF[crit]]["by_budget"][budget_key(budget)]
        return d["decision"] == "reject"
    return int(sum(interim(r["methods"]["retrain_indep"]) for r in sets))


def epsilon_budgets(sets: list[dict], grid=BUDGETS, how: str = "quantile") -> list[dict]:
    """The epsilon criterion at each budget (the core's loop run at each, on the same references): the
    independent retrain's acceptance (target >= 0.95), do_nothing's on far sets (target <= 0.05) and on random
    sets."""
    rows = []
    for b in grid:
        def acc(m, kinds):
            return _rate([eps_passed(r["methods"][m], b, how) for r in sets
                          if r["kind"] in kinds and m in r["methods"]])
        rows.append({"budget": b, "aggregate": how, "retrain_indep": acc("retrain_indep", ("random", *FAR_KINDS)),
                     "do_nothing_far": acc("do_nothing", FAR_KINDS), "do_nothing_random": acc("do_nothing", ("random",))})
    return rows


def final_statistics(sets: list[dict]) -> list[dict]:
    """Per method and kind of set: the median, smallest and largest over the sets of each aggregate's upper bound
    at the last look (the largest over the set's splits)."""
    out = []
    for m in dict.fromkeys(m for r in sets for m in r["methods"]):
        for k in ("random", "class", "high_leverage"):
            rs = [r["methods"][m] for r in sets if r["kind"] == k and m in r["methods"]]
            if not rs:
                continue
            row = {"method": m, "kind": k, "n": len(rs)}
            for how in AGGREGATES:
                xs = [max(res["epsilon"][how]["looks"][-1]["upper"].values()) for res in rs]
                row[how] = {"median": float(np.median(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}
            out.append(row)
    return out


def all_budgets(sets: list[dict], grid) -> list[dict]:
    return [row for how in AGGREGATES for row in epsilon_budgets(sets, grid, how)]


def epsilon_by_kind(sets: list[dict]) -> dict:
    """Per method, estimator, kind of set and split: the median and the max over sets of the batch-mean epsilon."""
    out: dict = {}
    for m in dict.fromkeys(m for r in sets for m in r["methods"]):
        for est in ("gaussian", "threshold"):
            for k in ("random", "class", "high_leverage"):
                vals = [r["methods"][m]["epsilon_rows"][est] for r in sets if r["kind"] == k and m in r["methods"]]
                if not vals:
                    continue
                for sp in EPS_SPLITS:
                    xs = [v[sp]["mean"] for v in vals if sp in v]
                    if xs:
                        out.setdefault(m, {}).setdefault(est, {}).setdefault(k, {})[sp] = {
                            "median": round(float(np.median(xs)), 3), "min": round(float(np.min(xs)), 3),
                            "max": round(float(np.max(xs)), 3), "n": len(xs)}
    return out


def licensing(sets: list[dict], budget: float, cuts=None) -> list[dict]:
    """The rule "do_nothing where the predicted gap is at most g" on these sets, per g (default: every set's own
    predicted gap, so each row licenses one more set): how many it licenses and how many of those fail their
    audit under each criterion (the rule's false accepts; precision = 1 - that rate)."""
    gaps = [r["facts"].get("predicted_gap_to_noise") for r in sets]
    cuts = cuts if cuts is not None else sorted({float(g) for g in gaps if g is not None and np.isfinite(g)})
    rows = []
    for g in cuts:
        lic = [r for r in sets if r["facts"].get("predicted_gap_to_noise", np.inf) <= g and "do_nothing" in r["methods"]]
        fail_eps = [not eps_passed(r["methods"]["do_nothing"], budget) for r in lic]
        fail_diff = [not r["methods"]["do_nothing"]["passed"] for r in lic]
        rows.append({"gap_below": round(g, 4), "licensed": len(lic), "kinds": sorted({r["kind"] for r in lic}),
                     "fail_epsilon": int(sum(fail_eps)), "fail_difference": int(sum(fail_diff)),
                     "false_accept_rate_epsilon": round(float(np.mean(fail_eps)), 3) if lic else None})
    return rows


def gap_vs_epsilon(sets: list[dict]) -> dict:
    """The predicted gap (noise units) against do_nothing's measured forget epsilon (gaussian, batch mean): a
    least-squares line of log(1 + epsilon) on log(1 + gap) (a class's epsilon runs to hundreds) and the rank
    correlation."""
    pts = [(r["facts"].get("predicted_gap_to_noise"), r["methods"]["do_nothing"]["epsilon_rows"]["gaussian"]["forget"]["mean"])
           for r in sets if "do_nothing" in r["methods"] and r["facts"].get("predicted_gap_to_noise") is not None]
    pts = [(g, e) for g, e in pts if np.isfinite(g) and np.isfinite(e)]
    if len(pts) < 3:
        return {"n": len(pts)}
    g, e = np.log1p(np.array([p[0] for p in pts])), np.log1p(np.array([p[1] for p in pts]))
    slope, icpt = np.polyfit(g, e, 1)
    rg, re = np.argsort(np.argsort(g)), np.argsort(np.argsort(e))
    return {"n": len(pts), "slope_log1p_eps_per_log1p_gap": round(float(slope), 3), "intercept": round(float(icpt), 3),
            "spearman": round(float(np.corrcoef(rg, re)[0, 1]), 3),
            "points": [[round(float(a), 4), round(float(b), 4)] for a, b in pts]}


DOCS_BEGIN, DOCS_END = "<!-- calibration-epsilon:begin -->", "<!-- calibration-epsilon:end -->"


def docs_tables(results: dict[str, dict]) -> str:
    """The calibration tables of docs/certificate.md from one calibration JSON per dataset."""
    lines = ["| dataset (N per role, sets) | criterion | independent retrain accepted (target >= 0.95) | "
             "retrain rejected at an interim look | do_nothing accepted on class / high-leverage sets (target <= "
             "0.05) | do_nothing on random sets |", "|---|---|---|---|---|---|"]
    fmt = lambda r: f"{r['rate']:.2f} ({r['accepted']}/{r['n']})" if r["n"] else "no set"  # noqa: E731
    for name, out in results.items():
        for crit, c in out["criteria"].items():
            rnd = c["per_method"].get("do_nothing", {}).get("random", {"n": 0})
            label = "difference" if crit == "difference" else (
                f"epsilon <= {out['epsilon_gate']['max']:g}, {AGG_OF[crit]} ({out['epsilon_gate']['estimator']})")
            lines.append(f"| {name} (N = {out['n']}, {out['n_sets']} sets) | {label} | {fmt(c['retrain_indep'])} | "
                         f"{c['retrain_indep_interim_rejects']} | {fmt(c['do_nothing_far'])} | {fmt(rnd)} |")
    lines += ["", "Each aggregate's statistic at the last look (the upper bound the budget is compared with, the "
              "largest over the splits of a set): the median over the sets, the smallest and the largest in brackets:",
              "", "| dataset | method | kind of set | quantile (0.95 of the rows' upper bounds) | mean (joint "
              "bootstrap, rows capped) |", "|---|---|---|---|---|"]
    for name, out in results.items():
        for row in final_statistics(out["sets"]):
            cells = " | ".join(f"{row[h]['median']:.2f} ({row[h]['min']:.2f}-{row[h]['max']:.2f})" for h in AGGREGATES)
            lines.append(f"| {name} | `{row['method']}` | {row['kind']} ({row['n']}) | {cells} |")
    lines += ["", "The epsilon criterion at other budgets (the same looks over the same references, judged by the "
              "core's loop at each budget):", "",
              "| dataset | aggregate | budget | independent retrain accepted | do_nothing on class / high leverage | "
              "do_nothing on random sets |", "|---|---|---|---|---|---|"]
    for name, out in results.items():
        for b in out["epsilon_budgets"]:
            lines.append(f"| {name} | {b['aggregate']} | {b['budget']:g} | {fmt(b['retrain_indep'])} | "
                         f"{fmt(b['do_nothing_far'])} | {fmt(b['do_nothing_random'])} |")
    lines += ["", "Batch-mean epsilon per kind of set and split (Gaussian estimator at full N): the median over "
              "sets, and the smallest and the largest in brackets:",
              "", "| dataset | method | kind of set | forget | retain | validation |", "|---|---|---|---|---|---|"]
    for name, out in results.items():
        for m, by_est in out["epsilon_by_kind"].items():
            for k, sp in by_est.get("gaussian", {}).items():
                cells = " | ".join(f"{sp[x]['median']:.2f} ({sp[x].get('min', float('nan')):.2f}-{sp[x]['max']:.2f})"
                                   if x in sp else "" for x in EPS_SPLITS)
                lines.append(f"| {name} | `{m}` | {k} ({sp['forget']['n']}) | {cells} |")
    lines += ["", "The rule \"do_nothing where the predicted gap is at most g\" on these sets (audited under epsilon at "
              "the default budget, and under difference):", "",
              "| dataset | g (noise units) | sets licensed | kinds | failed audit (epsilon) | failed audit (difference) |",
              "|---|---|---|---|---|---|"]
    for name, out in results.items():
        for r in out["licensing"]:
            lines.append(f"| {name} | {r['gap_below']:g} | {r['licensed']} | {', '.join(r['kinds']) or '-'} | "
                         f"{r['fail_epsilon']} | {r['fail_difference']} |")
    return "\n".join(lines)


def write_docs(paths: list[str], docs: str) -> None:
    from results_io import write_between

    results = {}
    for p in paths:
        if Path(p).exists():
            out = json.loads(Path(p).read_text())
            if "epsilon" not in out["sets"][0]["methods"]["retrain_indep"]:
                continue  # a calibration JSON from before the core's loop judged each budget
            # at params.yaml's budget when the run judged at it (every budget of the grid was judged by the core)
            sets, budget = out["sets"], load_params(ROOT / "params.yaml").gate.epsilon.max
            judged = {float(k) for k in sets[0]["methods"]["retrain_indep"]["epsilon"]["quantile"]["by_budget"]}
            budget = budget if budget in judged else out["epsilon_gate"]["max"]
            out["epsilon_gate"]["max"] = budget
            out.update(criteria=criteria_summary(sets, budget), epsilon_budgets=all_budgets(sets, sorted(judged)),
                       epsilon_by_kind=epsilon_by_kind(sets), licensing=licensing(sets, budget))
            results[out.get("dataset", "digits")] = out
    if results:
        write_between(docs, DOCS_BEGIN, DOCS_END, docs_tables(results))
        print(f"wrote the tables of {sorted(results)} into {docs}")


def main() -> None:
    params = load_params(ROOT / "params.yaml")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=params.validation.n_oracles, help="oracles per set (A and B) = shadows")
    ap.add_argument("--random-sets", type=int, default=21, help="random forget sets (sizes cycle 10, 50, 200)")
    ap.add_argument("--no-special", action="store_true", help="skip the class-level and high-self-leverage sets")
    ap.add_argument("--finetune-sets", type=int, default=2, help="also run finetune on the first k sets (~40 s each)")
    ap.add_argument("--newton-sets", type=int, default=0, help="also run newton_ggn on the first k sets (slow)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--n-permutations", type=int, default=params.gate.retrain_equivalence.n_permutations)
    ap.add_argument("--seed", type=int, default=params.base.seed)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="default bench/results/calibration.json (digits), "
                                                "calibration_<dataset>.json otherwise")
    ap.add_argument("--dataset", default="digits", choices=("digits", "fashion_mnist"))
    ap.add_argument("--rows", type=int, default=8000, help="training rows of Fashion-MNIST")
    ap.add_argument("--class-sets", type=int, default=1, help="whole-class forget sets")
    ap.add_argument("--leverage-sets", type=int, default=1, help="high-self-leverage forget sets (50 rows each)")
    ap.add_argument("--certificate-rows", type=int, default=None,
                    help="evaluate at most this many retain and validation rows (validation.certificate_rows)")
    ap.add_argument("--no-policy", action="store_true", help="skip the leverage diagnostics and the policy (no "
                                                             "predicted gap: the licensing table stays empty)")
    ap.add_argument("--tables-only", action="store_true", help="only (re)write docs/certificate.md's tables from "
                                                                 "bench/results/calibration*.json")
    a = ap.parse_args()
    results_files = [str(ROOT / "bench/results/calibration.json"),
                     str(ROOT / "bench/results/calibration_fashion_mnist.json")]
    if a.tables_only:
        write_docs(results_files, str(ROOT / "docs/certificate.md"))
        return
    a.out = a.out or str(ROOT / "bench/results" / ("calibration.json" if a.dataset == "digits"
                                                   else f"calibration_{a.dataset}.json"))
    torch.set_num_threads(a.threads)
    gate = params.gate.model_copy(deep=True)
    gate.retrain_equivalence.n_permutations = a.n_permutations
    eps_gate = gate.model_copy(update={"criterion": "epsilon"})
    eps_cfg = eps_gate.epsilon
    # the sequential certificate's looks at this N (unlearning/planning/plan.py, unlearning/sequential.py)
    validation = params.validation.model_copy(update={"n_oracles": a.n, "n_shadows": a.n})
    seq = sequential_step("bench", validation, gate, 1.0)
    looks = (seq.looks, seq.alphas, seq.permutations)
    budgets = sorted({*BUDGETS, eps_cfg.max})  # the grid, with params.yaml's budget on it
    t_start = time.perf_counter()

    prob = load_problem(params, a.dataset, a.rows)
    X_all, y_all, y_np, spec, recipe = prob.X, prob.y, prob.y_np, prob.spec, prob.recipe
    train_rows, val_rows = prob.train_rows, prob.val_rows
    XD, yD = X_all[train_rows], y_all[train_rows]
    t0 = time.perf_counter()
    # one step: a line every 10 s with the time so far (no ETA: nothing is done yet to estimate one from)
    with Progress(1, f"calibration {a.dataset}: the original and {a.n} shadows", unit="step", heartbeat_s=1.0) as bar:
        original = _train(spec, [original_seed(a.seed)], XD, yD, recipe)
        shadows = _train(spec, role_seeds(a.seed, "shadows", a.n), XD, yD, recipe)
        bar.update()
    seconds_shadows = time.perf_counter() - t0

    # "high self-leverage" rows: ranked by the original's training loss (self-influence grows with the residual;
    # a per-row exact self-leverage over all 1438 rows would cost more than the bench); the set's measured
    # self-leverage trace is in the JSON facts (`self_leverage_trace`) next to the random sets'.
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(predict_logits(original, XD)[0], yD, reduction="none").numpy()
    rank = np.argsort(-loss)
    rng = np.random.default_rng(a.seed + 12)
    sets = forget_sets(rng, train_rows, y_np, a.random_sets, None if a.no_special else rank, a.class_sets,
                       a.leverage_sets)
    if a.no_special:
        sets = [s for s in sets if not s[0].startswith("class")]
    methods = [s for s in a.methods.split(",") if s]

    rows_out = []
    # one line every 10 s (stderr) with the set and its phase; the ETA from the sets done so far
    with Progress(len(sets), f"calibration {a.dataset} N={a.n}", unit="forget sets", heartbeat_s=1.0) as bar:
        for k, (name, F) in enumerate(sets):
            bar.stage(f"{name}: oracles")
            ts = time.perf_counter()
            R = np.setdiff1d(train_rows, F)
            forget_classes = np.unique(y_np[F])
            adjacent_mask = np.isin(y_np[R], forget_classes)
            rows = BatchRows(before=train_rows, forget=F, retain=R, adjacent_mask=adjacent_mask, validation=val_rows)
            eval_rows, splits = sampled_for_certificate(rows, a.certificate_rows, a.seed).eval_rows()
            labels = y_np[eval_rows]
            XR, yR = X_all[R], y_all[R]
            oracles_a = _train(spec, role_seeds(a.seed, "oracles", a.n), XR, yR, recipe)
            oracles_b = _train(spec, role_seeds(a.seed, "oracles_b", a.n), XR, yR, recipe)
            seconds_oracles = (time.perf_counter() - ts) / 2
            Xe = X_all[eval_rows]
            la, lb = predict_logits(oracles_a, Xe), predict_logits(oracles_b, Xe)
            l_sh, l_orig = predict_logits(shadows, Xe), predict_logits(original, Xe)

            # do_nothing's true gap vs an independent N-vs-N floor (both sides of size N, disjoint seeds)
            floor_ab = klom_summary(klom(margins(lb.numpy(), labels), margins(la.numpy(), labels)), splits)
            gap_sb = klom_summary(klom(margins(l_sh.numpy(), labels), margins(lb.numpy(), labels)), splits)
            true_gap_ratio = max(gap_sb[s]["p95"] / max(floor_ab[s]["p95"], 1e-12) for s in gap_sb)

            bar.stage(f"{name}: certificates")
            results: dict[str, dict] = {}

            def judge(method, cand, shadow_unl, orc, acc_ref, seconds, is_retrain=False, sequential=True):
                """The flow's certificate, through the core's loop (unlearning/sequential.py run_looks): the sequential
                looks over prefixes of the reference sets (`acc_ref` is `orc` or an independent set of the same size);
                sequential=False: one look at full N, alpha whole (the audit of an exact retrain). Under `difference`
                (the gate of params.yaml) and under `epsilon` at every budget of the grid and both aggregates: each
                look is measured once per aggregate (`measure`), then judged by the core's criterion at each budget."""
                plan = looks if sequential else (((shadow_unl.shape[0], orc.shape[0]),), (gate.retrain_equivalence.alpha,),
                                                 (a.n_permutations,))

                def measure_with(how: str):
                    memo: dict = {}
                    cfg = eps_cfg.model_copy(update={"aggregate": how})

                    def measure(spec):
                        if spec not in memo:
                            n_a = acc_ref.shape[0] if not sequential else spec.n_oracles
                            ms, _ = certificate_measures(cand, shadow_unl[:spec.n_shadows], orc[:spec.n_oracles],
                                                         acc_ref[:n_a], labels, splits, n_permutations=spec.n_permutations,
                                                         seed=a.seed, epsilon=cfg, confidence=1 - spec.alpha)
                            memo[spec] = LookMeasures(ms, None)
                        return memo[spec]
                    return measure

                def criterion(g):
                    return Criterion.of(g, *plan, exact=is_retrain)

                measures = {how: measure_with(how) for how in AGGREGATES}
                done = run_looks(criterion(gate), measures["quantile"])  # the gate of params.yaml (difference)
                eps = {}
                for how in AGGREGATES:
                    by_budget = {}
                    for b in budgets:
                        g = eps_gate.model_copy(update={"epsilon": eps_gate.epsilon.model_copy(
                            update={"max": b, "aggregate": how})})
                        c = run_looks(criterion(g), measures[how])
                        by_budget[budget_key(b)] = {"passed": c.accepted, "look": len(c.looks), "decision": c.decision}
                    specs = criterion(eps_gate).looks
                    bounds = [{"refs": sp.n_shadows + sp.n_oracles, "alpha": sp.alpha,
                               **{k: {m.split: round(getattr(m.epsilon, k), 4) for m in measures[how](sp).measures
                                      if m.epsilon is not None} for k in ("lower", "upper", "point")}} for sp in specs]
                    eps[how] = {"by_budget": by_budget, "looks": bounds}
                mets = K.of_measures(done.result.measures)
                m_s, m_o = margins(shadow_unl, labels), margins(orc, labels)
                results[method] = {
                    "epsilon": eps,
                    "epsilon_rows": epsilon_distribution(m_s, m_o, splits, eps_cfg.delta, eps_cfg.quantile, a.seed),
                    "passed": done.verdict.passed, "failures": done.verdict.failures, "seconds": round(seconds, 3),
                    "look": len(done.looks), "looks_planned": len(plan[0]),
                    "references": int(done.looks[-1].n_shadows + done.looks[-1].n_oracles),
                    **{f"klom_p95/{s}": mets.get(f"klom_p95/{s}") for s in SPLITS},
                    **{f"klom_pvalue/{s}": mets.get(f"klom_pvalue/{s}") for s in SPLITS},
                    **{f"noise_floor_p95/{s}": mets.get(f"noise_floor_p95/{s}") for s in SPLITS},
                    "metrics": mets}

            judge("retrain_indep", lb[:1], lb, la, la, seconds_oracles, True)
            perm = np.random.default_rng(a.seed).permutation(np.arange(1, a.n))
            h = len(perm) // 2
            judge("retrain", la[:1], la[perm[:h]], la[perm[h:]], la[perm], seconds_oracles, True, sequential=False)

            ctx_of = lambda model: UnlearnContext(model=model, X_forget=X_all[F], y_forget=y_all[F], X_retain=XR,
                                                  y_retain=yR, adjacent_mask=torch.as_tensor(adjacent_mask),
                                                  recipe=recipe, seed=method_seed(a.seed))

            def run(method):
                bar.stage(f"{name}: {method}")
                tm = time.perf_counter()
                cand = run_method(method, ctx_of(original), params.deletion.method_args.get(method, {})).model
                sh = run_method(method, ctx_of(shadows), params.deletion.method_args.get(method, {})).model
                sec = time.perf_counter() - tm
                judge(method, predict_logits(cand, Xe), predict_logits(sh, Xe), la, la, sec)

            for method in (methods + (["finetune"] if k < a.finetune_sets and "finetune" not in methods else [])
                           + (["newton_ggn"] if k < a.newton_sets else [])):
                run(method)

            # the policy on this set's facts (leverage diagnostics of the original, as the flow computes them)
            bar.stage(f"{name}: policy")
            td = time.perf_counter()
            facts, sel = {}, {"candidates": [], "fired": []}
            if not a.no_policy:
                report = compute_diagnostics(original, X_all[F], y_all[F], XR, yR, X_all[val_rows], y_all[val_rows],
                                             lam=params.ggn_damping(len(train_rows)), solver=params.diagnostics.solver,
                                             device="cpu", proj_dim=params.diagnostics.proj_dim,
                                             check_subset=params.diagnostics.check_subset, seed=a.seed)
                facts = batch_facts(params.deletion, params.train.epochs, "retrain_equivalence", rows, report,
                                    oracle_forget_logits=predict_logits(oracles_a, X_all[F]))
                sel = candidate_methods(params.deletion, facts)
            seconds_diag = time.perf_counter() - td
            regret, first_passed, chosen = 0.0, None, None
            for c in sel["candidates"]:
                if c not in results:
                    run(c)
                if first_passed is None:
                    first_passed = results[c]["passed"]
                if results[c]["passed"]:
                    chosen = c
                    break
                regret += results[c]["seconds"]
            rows_out.append({"set": name, "kind": kind_of(name), "n_forget": int(len(F)), "true_gap_ratio": round(true_gap_ratio, 3),
                             "do_nothing_exceeds_floor": bool(true_gap_ratio > 1.5),
                             "facts": {k2: v for k2, v in facts.items() if isinstance(v, (int, float, bool, str))},
                             "policy": {"candidates": sel["candidates"], "fired": [f[0] for f in sel["fired"]],
                                        "first_passed": first_passed, "passed_with": chosen,
                                        "seconds_on_failed": round(regret, 2), "retrain_seconds": round(seconds_oracles, 2)},
                             "diagnostics_seconds": round(seconds_diag, 2), "methods": results,
                             "seconds": round(time.perf_counter() - ts, 2)})
            r = rows_out[-1]
            print(f"[{k + 1}/{len(sets)}] {name:22s} nF={len(F):4d} gap/floor={true_gap_ratio:6.2f} "
                  f"pred_gap/noise={facts.get('predicted_gap_to_noise', float('nan')):8.3g} "
                  + " ".join(f"{mm}={'P' if res['passed'] else 'F'}/{'P' if eps_passed(res, eps_cfg.max) else 'F'}"
                             f"(eps {res['epsilon_rows']['gaussian'].get('forget', {}).get('mean', float('nan')):.2f})"
                             for mm, res in results.items())
                  + f" policy={sel['candidates']} first={'P' if first_passed else 'F'} ({r['seconds']:.0f}s)", flush=True)
            bar.update()

    # summary per method
    summary = {}
    all_methods = list(dict.fromkeys(m2 for r in rows_out for m2 in r["methods"]))
    for mm in all_methods:
        rs = [r for r in rows_out if mm in r["methods"]]
        res = [r["methods"][mm] for r in rs]
        ratio = [x["klom_p95/forget"] / max(x["noise_floor_p95/forget"], 1e-12) for x in res
                 if x["klom_p95/forget"] is not None and x["noise_floor_p95/forget"] is not None]
        s = {"n_sets": len(res), "pass_rate": float(np.mean([x["passed"] for x in res])),
             "mean_references": float(np.mean([x["references"] for x in res])),
             "rejected_at_first_look": int(sum((not x["passed"]) and x["look"] == 1 for x in res)),
             "median_klom_forget_to_floor": float(np.median(ratio)) if ratio else None,
             "median_seconds": float(np.median([x["seconds"] for x in res]))}
        if mm == "do_nothing":
            big = [r["methods"][mm]["passed"] for r in rs if r["do_nothing_exceeds_floor"]]
            s["n_sets_gap_exceeds_floor"] = len(big)
            s["pass_rate_where_gap_exceeds_floor"] = float(np.mean(big)) if big else None
        summary[mm] = s
    pol = [r["policy"] for r in rows_out]
    pol = [p for p in pol if p["first_passed"] is not None] or [{"first_passed": False, "seconds_on_failed": 0.0,
                                                                 "retrain_seconds": 1.0, "passed_with": None}]
    policy = {"first_candidate_pass_rate": float(np.mean([p["first_passed"] for p in pol])),
              "median_seconds_on_failed": float(np.median([p["seconds_on_failed"] for p in pol])),
              "max_seconds_on_failed": float(max(p["seconds_on_failed"] for p in pol)),
              "max_failed_over_retrain": float(max(p["seconds_on_failed"] / max(p["retrain_seconds"], 1e-9) for p in pol)),
              "chosen": {c: sum(p["passed_with"] == c for p in pol) for c in {p["passed_with"] for p in pol}}}
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cores": torch.get_num_threads(),
           "machine": platform.machine(), "n": a.n, "n_permutations": a.n_permutations,
           "alpha": gate.retrain_equivalence.alpha, "accuracy_z": gate.retrain_equivalence.accuracy_z,
           "looks": [list(x) for x in looks[0]], "alphas": list(looks[1]), "permutations": list(looks[2]),
           "n_sets": len(rows_out), "shadow_train_seconds": round(seconds_shadows, 2),
           "wall_seconds": round(time.perf_counter() - t_start, 1), "summary": summary, "policy": policy,
           "dataset": a.dataset, "train_rows": int(len(train_rows)), "certificate_rows": a.certificate_rows,
           "epsilon_gate": eps_cfg.model_dump(),
           "criteria": criteria_summary(rows_out, eps_cfg.max), "epsilon_budgets": all_budgets(rows_out, budgets),
           "epsilon_by_kind": epsilon_by_kind(rows_out), "licensing": licensing(rows_out, eps_cfg.max),
           "gap_vs_epsilon": gap_vs_epsilon(rows_out), "sets": rows_out}
    for crit, c in out["criteria"].items():
        print(f"criterion {crit}: independent retrain accepted {c['retrain_indep']} (rejected at an interim look: "
              f"{c['retrain_indep_interim_rejects']}), do_nothing on class / high leverage {c['do_nothing_far']}")
    for b in out["epsilon_budgets"]:
        print(f"  {b['aggregate']} budget {b['budget']}: retrain {b['retrain_indep']['rate']}, do_nothing far {b['do_nothing_far']['rate']}, "
              f"random {b['do_nothing_random']['rate']}")
    print(f"\nN = {a.n}, {len(rows_out)} forget sets, alpha = {out['alpha']}, {a.n_permutations} permutations, "
          f"{out['cores']} threads, {out['wall_seconds']:.0f} s")
    print(f"looks (shadows, oracles) {looks[0]}, alpha per look {[round(x, 5) for x in looks[1]]}")
    print(f"{'method':16s} {'sets':>4s} {'pass rate':>9s} {'KLoM/floor (forget, median)':>28s} {'s (median)':>10s} "
          f"{'refs (mean)':>11s} {'rejected at look 1':>18s}")
    for mm, s in summary.items():
        extra = (f"  gap>floor: {s['pass_rate_where_gap_exceeds_floor']} of {s['n_sets_gap_exceeds_floor']} sets"
                 if mm == "do_nothing" else "")
        print(f"{mm:16s} {s['n_sets']:4d} {s['pass_rate']:9.2f} {s['median_klom_forget_to_floor'] or float('nan'):28.2f} "
              f"{s['median_seconds']:10.2f} {s['mean_references']:11.1f} {s['rejected_at_first_look']:18d}{extra}")
    print(f"policy: first candidate passed on {policy['first_candidate_pass_rate']:.2f} of sets; seconds on failing "
          f"candidates median {policy['median_seconds_on_failed']:.1f}, max {policy['max_seconds_on_failed']:.1f} "
          f"({policy['max_failed_over_retrain']:.2f} x a retrain); passed with {policy['chosen']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out}")
    write_docs(results_files, str(ROOT / "docs/certificate.md"))


if __name__ == "__main__":
    main()
