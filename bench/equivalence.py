"""How close each unlearning method comes to a retrain on digits: forget, retain and validation rows.

For each forget set F (random sets of 10, 50 and 200 training rows, one whole class, and the 50 rows of highest
self-leverage), N oracles (oracle set A: retrains on R = D minus F) are the reference. Each method runs on N
shadow originals (trained on D, unlearned member-wise), and per row the margins (log(p/(1-p)) of the true label,
unlearning.metrics.margins) of the N unlearned shadows U are compared with the N oracles' margins R through a
Gaussian fit:

    mu_i = |mean(U_i) - mean(R_i)| / sqrt((var(U_i) + var(R_i)) / 2),

converted to eps(delta) on the Gaussian-DP curve delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
(Dong, Roth and Su 2019; inverted by bisection). Reported per method and kind of set: the batch-mean eps over the
forget, retain and validation rows. References: `do_nothing` (the shadows as they are) and the independent
retrain (oracle set B, N more retrains on R: the floor the estimator reads for a perfect method). Cost: seconds
of the method on the production original (one model) over seconds of one retrain of that model (both the
median of `--repeats` runs), and the same on the N-member ensembles (method on N shadows over training N oracles,
vectorized).

"further than doing nothing": a method whose batch-mean eps on a split is above do_nothing's on the same sets.
The Gaussian fit reads a wider spread as closeness (a larger pooled sd lowers mu): the table also reports each
candidate's validation accuracy next to the retrain's, so noise bought with accuracy shows.

`newton_finetune` and `newton_ggn` are not in the default method list: their dense GGN solve per member takes
about 15-20 s on this machine, so N = 32 over 11 sets would take hours (`--methods`, a smaller `--n` and
`--section` run them into their own section of the page).

`--sweep` runs the presets' tuning grid (SWEEP) on one set of each kind instead and writes
bench/results/equivalence_sweep.json and its table (how the defaults were chosen).

Writes bench/results/equivalence.json and the table between the markers of docs/methods-equivalence.md.
Usage: nice python bench/equivalence.py [--n 32] [--sets-per-size 3] [--threads 1] [--sweep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
sys.path.insert(0, str(ROOT / "bench"))

from digits_problem import digits_problem, train_members  # noqa: E402  (bench/ is on sys.path as a script)
from results_io import write_between, write_json  # noqa: E402
from unlearning.config import load_params  # noqa: E402
from unlearning.methods import run_method  # noqa: E402
from unlearning.methods.base import UnlearnContext  # noqa: E402
from unlearning.metrics import margins  # noqa: E402
from unlearning.metrics.epsilon import gaussian_mu, gdp_epsilon  # noqa: E402
from unlearning.models import predict_logits  # noqa: E402
from unlearning.seeds import method_seed, role_seeds  # noqa: E402
from unlearning.studies.diagnostics_study import row_self_leverage  # noqa: E402
from unlearning.studies.digits import make_forget_set, train_originals  # noqa: E402

DOC = ROOT / "docs/methods-equivalence.md"
BEGIN, END = "<!-- bench:equivalence:begin -->", "<!-- bench:equivalence:end -->"
SWEEP_BEGIN, SWEEP_END = "<!-- bench:equivalence-sweep:begin -->", "<!-- bench:equivalence-sweep:end -->"
METHODS = ["do_nothing", "finetune", "noisy_finetune", "scrub", "salun", "descent_ascent", "gradient_ascent"]
SPLIT_GROUPS = {"forget": ("forget",), "retain": ("adjacent", "remote"), "validation": ("validation",)}
# The tuning grid: settings merged over each method's defaults ("(default)": the defaults as they are). The first
# setting of each method is its default before this bench (kept so the page shows before and after).
SWEEP = {
    "finetune": [{"optimizer": "adam", "lr": 1e-3, "epochs": 5}, {"lr": 1e-2, "epochs": 1}, {"lr": 1e-3},
                 {"optimizer": "adam", "lr": 1e-4}],
    "noisy_finetune": [{"sigma": 1e-2}, {"sigma": 3e-2}, {"sigma": 5e-2}, {"sigma": 2e-1},
                       {"sigma": 5e-2, "output_noise": 2e-2}],
    "scrub": [{"epochs": 4}, {"epochs": 1, "max_epochs": 1}, {"lr": 2e-3}],
    "salun": [{"lr": 1e-3, "epochs": 10}, {"lr": 1e-4}, {"lr": 3e-4, "epochs": 10}],
    "descent_ascent": [{"lr": 1e-3, "epochs": 2, "forget_weight": 0.5}, {"lr": 2e-4}, {"forget_weight": 0.5}],
    "gradient_ascent": [{"epochs": 10}, {"epochs": 2}, {"epochs": 5}],
}


# Each tuned preset's defaults before this bench chose them: run next to the defaults, labelled "(before)".
BEFORE = {
    "finetune": {"optimizer": "adam", "lr": 1e-3, "epochs": 5},
    "scrub": {"epochs": 4},
    "salun": {"lr": 1e-3, "epochs": 10},
    "descent_ascent": {"lr": 1e-3, "epochs": 2, "forget_weight": 0.5},
    "gradient_ascent": {"epochs": 10},
}


def _gaussian_eps_per_row(u: np.ndarray, r: np.ndarray, delta: float = 1e-3) -> np.ndarray:
    """[n] eps(delta) per row: the core's Gaussian fit (unlearning/metrics/epsilon.py: mu = mean difference over the
    pooled sd, read through the mu-GDP curve of Dong, Roth and Su 2019), mu capped at 1e6 so a row with no spread
    (both samples constant, different) counts as far, not infinite, in a batch mean."""
    return gdp_epsilon(np.minimum(gaussian_mu(u, r), 1e6), delta)


def split_means(eps: np.ndarray, splits: np.ndarray) -> dict[str, float]:
    return {g: float(eps[np.isin(splits, parts)].mean()) for g, parts in SPLIT_GROUPS.items()
            if np.isin(splits, parts).any()}


def accuracies(logits: torch.Tensor, labels: np.ndarray, splits: np.ndarray) -> dict[str, float]:
    """Mean over members of the accuracy per split group; logits [N, n_eval, C]."""
    hit = (logits.argmax(-1).numpy() == labels[None, :]).mean(0)
    return {g: float(hit[np.isin(splits, parts)].mean()) for g, parts in SPLIT_GROUPS.items()
            if np.isin(splits, parts).any()}


def forget_sets(prob, seed: int, sets_per_size: int, self_lev: np.ndarray) -> list[tuple[str, str, np.ndarray]]:
    """(kind, name, rows) per forget set, deterministic in the seed."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(47,)))
    tr, y = prob.train_rows, prob.y_np
    out = [(f"random{k}", f"random{k}_{i}", np.sort(rng.choice(tr, k, replace=False)))
           for k in (10, 50, 200) for i in range(sets_per_size)]
    cls = int(rng.choice(np.unique(y[tr])))
    out.append(("class", f"class_{cls}", tr[y[tr] == cls]))
    out.append(("high_leverage50", "high_leverage50", np.sort(tr[np.argsort(self_lev, kind="stable")[-50:]])))
    return out


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Bench:
    def __init__(self, params, n: int, seed: int, repeats: int):
        self.prob = digits_problem(params)
        self.params, self.n, self.seed, self.repeats = params, n, seed, repeats
        self.orig = train_originals(self.prob, seed, n)

    def ctx(self, fs, model) -> UnlearnContext:
        p = self.prob
        return UnlearnContext(model=model, X_forget=p.X[fs.F], y_forget=p.y[fs.F], X_retain=p.X[fs.R],
                              y_retain=p.y[fs.R], adjacent_mask=torch.as_tensor(fs.rows.adjacent_mask),
                              recipe=p.recipe, seed=method_seed(self.seed))

    def one_retrain_seconds(self, fs) -> float:
        p = self.prob
        XR, yR = p.X[fs.R], p.y[fs.R]
        return median_seconds(lambda: train_members(p.spec, role_seeds(self.seed, "bench", 1), XR, yR, p.recipe),
                              self.repeats)

    def candidate(self, fs, logits: torch.Tensor, delta: float) -> dict:
        m = margins(logits.numpy(), fs.labels)
        eps = _gaussian_eps_per_row(m, fs.margins_a, delta)
        return {"eps": split_means(eps, fs.splits), "acc": accuracies(logits, fs.labels, fs.splits)}

    def run_method(self, fs, method: str, args: dict, delta: float, retrain_s: float) -> dict:
        Xe = self.prob.X[fs.eval_rows]
        t0 = time.perf_counter()
        res = run_method(method, self.ctx(fs, self.orig.shadows), args)
        ens_s = time.perf_counter() - t0
        one_s = median_seconds(lambda: run_method(method, self.ctx(fs, self.orig.original), args), self.repeats)
        out = self.candidate(fs, predict_logits(res.model, Xe), delta)
        out.update(cost_retrains=one_s / retrain_s, cost_retrains_ensemble=ens_s / fs.seconds_oracles,
                   seconds=one_s, gradient_evals_per_member=res.cost.gradient_evals / self.n)
        return out

    def references(self, fs, delta: float) -> dict:
        retrain = self.candidate(fs, fs.logits_b, delta)
        retrain.update(cost_retrains=1.0, cost_retrains_ensemble=1.0)
        return {"retrain": retrain, "oracle_acc": accuracies(fs.logits_a, fs.labels, fs.splits)}


def self_leverage(params, bench: Bench, seed: int) -> np.ndarray:
    """Every training row's self-leverage under the production original (the S5 study's), cached in bench/results/
    under a key of the seed, the model spec and the recipe (the original is a function of them)."""
    key = hashlib.blake2b(json.dumps([seed, bench.prob.spec, vars(bench.prob.recipe)], sort_keys=True).encode(),
                          digest_size=6).hexdigest()
    path = ROOT / "bench/results" / f"equivalence_self_leverage_{key}.npy"
    if path.exists():
        return np.load(path)
    t0 = time.perf_counter()
    out = row_self_leverage(params, bench.prob, bench.orig.original, seed)
    print(f"self-leverage of {len(out)} rows: {time.perf_counter() - t0:.0f} s", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


def run_sets(bench: Bench, sets, runs: dict[str, tuple[str, dict]], delta: float) -> list[dict]:
    """runs: label -> (method, args). One record per set: kind, name, size, each label's result."""
    rows = []
    for kind, name, F in sets:
        t0 = time.perf_counter()
        fs = make_forget_set(bench.orig, name, F)
        retrain_s = bench.one_retrain_seconds(fs)
        refs = bench.references(fs, delta)
        results = {"retrain": refs["retrain"]}
        for label, (method, args) in runs.items():
            results[label] = bench.run_method(fs, method, args, delta, retrain_s)
        rows.append({"kind": kind, "name": name, "size": int(len(F)), "retrain_seconds": retrain_s,
                     "oracle_acc": refs["oracle_acc"], "results": results, "seconds": time.perf_counter() - t0})
        f = {k: round(v["eps"]["forget"], 2) for k, v in results.items()}
        print(f"{name} (|F| = {len(F)}): forget eps {f} [{time.perf_counter() - t0:.0f} s]", flush=True)
    return rows


KINDS = ["random10", "random50", "random200", "class", "high_leverage50"]


def summarize(rows: list[dict], labels: list[str]) -> dict:
    """Per label and kind: the mean over sets of the batch-mean eps per split, validation accuracy, cost; and
    whether it beats do_nothing (forget eps below do_nothing's, retain and validation eps not above the
    retrain's floor + do_nothing's gap)."""
    out = {}
    for label in ["retrain", *labels]:
        out[label] = {}
        for kind in KINDS:
            rs = [r["results"][label] for r in rows if r["kind"] == kind and label in r["results"]]
            if not rs:
                continue
            avg = lambda f: float(np.mean([f(r) for r in rs]))  # noqa: E731
            out[label][kind] = {"sets": len(rs), **{f"eps_{g}": avg(lambda r, g=g: r["eps"][g]) for g in SPLIT_GROUPS},
                                "val_acc": avg(lambda r: r["acc"]["validation"]),
                                "cost_retrains": avg(lambda r: r["cost_retrains"]),
                                "cost_retrains_ensemble": avg(lambda r: r["cost_retrains_ensemble"])}
            out[label][kind]["worst_eps"] = max(out[label][kind][f"eps_{g}"] for g in SPLIT_GROUPS)
    return out


def verdict(s: dict, label: str, kind: str) -> str:
    """Where the method is further from a retrain than doing nothing: the splits whose batch-mean eps is above
    do_nothing's on the same sets ("closer on every split" when none is)."""
    if label in ("do_nothing", "retrain") or kind not in s.get(label, {}):
        return ""
    worse = [g for g in SPLIT_GROUPS if s[label][kind][f"eps_{g}"] > s["do_nothing"][kind][f"eps_{g}"]]
    if not worse:
        return "closer on every split"
    return "further than doing nothing" + ("" if len(worse) == len(SPLIT_GROUPS) else " on " + ", ".join(worse))


def geo_ratio(s: dict, label: str) -> float:
    """The presets' tuning score: the geometric mean, over the kinds of set and the three splits, of the batch-mean
    eps over do_nothing's (below 1: closer to a retrain than doing nothing; the retain and validation rows weigh
    as much as the forget rows, so a method that forgets by moving every row scores badly)."""
    logs = [np.log(s[label][k][f"eps_{g}"] / s["do_nothing"][k][f"eps_{g}"]) for k in KINDS if k in s[label]
            for g in SPLIT_GROUPS]
    return float(np.exp(np.mean(logs)))


def table(s: dict, labels: list[str]) -> str:
    lines = ["| method | set | ε forget | ε retain | ε validation | val. acc. | cost (retrains) | "
             "cost, N members | vs do_nothing |", "|---|---|---|---|---|---|---|---|---|"]
    for label in ["retrain", *labels]:
        for kind in KINDS:
            if kind not in s.get(label, {}) or label.endswith("(before)"):
                continue
            r = s[label][kind]
            name = "independent retrain (floor)" if label == "retrain" else label
            lines.append(f"| {name} | {kind} ({r['sets']}) | {r['eps_forget']:.2f} | {r['eps_retain']:.2f} | "
                         f"{r['eps_validation']:.2f} | {r['val_acc']:.3f} | {r['cost_retrains']:.2f} | "
                         f"{r['cost_retrains_ensemble']:.2f} | {verdict(s, label, kind)} |")
    return "\n".join(lines)


def before_after_table(s: dict, labels: list[str]) -> str:
    """Per tuned preset and kind of set: eps forget / retain / validation at the old defaults and at the new."""
    lines = ["| method | set | before: ε forget / retain / validation (val. acc.) | now | score before → now |",
             "|---|---|---|---|---|"]
    for label in labels:
        old = f"{label} (before)"
        if old not in s:
            continue
        for kind in KINDS:
            cells = [" / ".join(f"{s[x][kind][f'eps_{g}']:.2f}" for g in SPLIT_GROUPS)
                     + f" ({s[x][kind]['val_acc']:.3f})" for x in (old, label)]
            score = f"{geo_ratio(s, old):.2f} → {geo_ratio(s, label):.2f}" if kind == KINDS[0] else ""
            lines.append(f"| {label} | {kind} | {cells[0]} | {cells[1]} | {score} |")
    return "\n".join(lines)


def sweep_table(s: dict, labels: list[str]) -> str:
    """One row per setting: eps forget / retain / validation per kind of set, and the tuning score."""
    lines = ["| setting | " + " | ".join(KINDS) + " | score (geo. mean of ε / do_nothing's) |",
             "|---|" + "---|" * (len(KINDS) + 1)]
    for label in ["retrain", *labels]:
        cells = [" / ".join(f"{s[label][k][f'eps_{g}']:.2f}" for g in SPLIT_GROUPS) if k in s[label] else ""
                 for k in KINDS]
        name = "independent retrain (floor)" if label == "retrain" else label
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {geo_ratio(s, label):.2f} |")
    return "\n".join(lines)


def sweep_runs() -> dict[str, tuple[str, dict]]:
    runs = {"do_nothing": ("do_nothing", {})}
    for method, grid in SWEEP.items():
        runs[method + " (default)"] = (method, {})
        for args in grid:
            runs[method + " " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in args.items())] = (method, args)
    return runs


def write_doc(result: dict, labels: list[str], sweep: bool, write: bool = True) -> str:
    """The page's generated section (between its markers) from a result; returns the table's text."""
    s = result["summary"]
    text = sweep_table(s, labels) if sweep else table(s, labels)
    if not sweep and any(k.endswith("(before)") for k in labels):
        text += "\n\nThe tuned presets at their old defaults (bench/equivalence.py BEFORE) on the same sets:\n\n" \
            + before_after_table(s, labels)
    if write:
        n = result["n"]
        k = result["sets_per_size"]
        sets = "one set of each kind" if sweep or k == 1 else f"{k} random sets of each size"
        head = (f"N = {n} oracles, {n} independent retrains and {n} shadow originals per set; {sets}; "
                f"δ = {result['delta']:g}; {result['threads']} torch thread(s); {result['seconds'] / 60:.1f} min; "
                f"{result['date'][:10]}. Generated by `bench/equivalence.py{' --sweep' if sweep else ''}`.\n\n")
        b, e = (SWEEP_BEGIN, SWEEP_END) if sweep else (BEGIN, END)
        if result.get("section"):
            b, e = f"<!-- bench:{result['section']}:begin -->", f"<!-- bench:{result['section']}:end -->"
        if write_between(DOC, b, e, head + text):
            print(f"wrote the table into {DOC.relative_to(ROOT)}")
    return text


def main() -> None:
    params = load_params(ROOT / "params.yaml")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="oracles (A and B) and shadow originals per set")
    ap.add_argument("--sets-per-size", type=int, default=3, help="random sets of each size (10, 50, 200)")
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--delta", type=float, default=1e-3)
    ap.add_argument("--repeats", type=int, default=3, help="timing runs per cost (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=params.base.seed)
    ap.add_argument("--sweep", action="store_true", help="the presets' tuning grid on one set of each kind")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-before", action="store_true", help="skip the tuned presets' old defaults")
    ap.add_argument("--no-doc", action="store_true", help="do not write the table into docs/methods-equivalence.md")
    ap.add_argument("--section", default=None, help="write between <!-- bench:SECTION:begin/end --> instead")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the page's table from a result file")
    a = ap.parse_args()
    if a.render:
        result = json.loads(Path(a.render).read_text())
        labels = [k for k in result["runs"]]
        write_doc(result, labels, result["sweep"])
        return
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    bench = Bench(params, a.n, a.seed, a.repeats)
    self_lev = self_leverage(params, bench, a.seed)
    sets = forget_sets(bench.prob, a.seed, 1 if a.sweep else a.sets_per_size, self_lev)
    runs = sweep_runs() if a.sweep else {m: (m, {}) for m in a.methods}
    if not a.sweep and not a.no_before:
        runs.update({f"{m} (before)": (m, BEFORE[m]) for m in a.methods if m in BEFORE})
    rows = run_sets(bench, sets, runs, a.delta)
    labels = list(runs)
    s = summarize(rows, labels)
    result = {"benchmark": "equivalence", "sweep": a.sweep, "section": a.section, "n": a.n, "sets_per_size": a.sets_per_size,
              "delta": a.delta, "seed": a.seed, "threads": a.threads, "machine": platform.platform(),
              "model": bench.prob.spec, "recipe": vars(bench.prob.recipe),
              "runs": {k: list(v) for k, v in runs.items()}, "summary": s,
              "score": {k: geo_ratio(s, k) for k in ["retrain", *labels]}, "sets": rows,
              "seconds": time.perf_counter() - t_start,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    name = "equivalence_sweep.json" if a.sweep else "equivalence.json"
    write_json(a.out or ROOT / "bench/results" / name, result)
    text = write_doc(result, labels, a.sweep, write=not a.no_doc)
    print(text)
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
