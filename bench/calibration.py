"""Calibration bench of the retrain-equivalence gate and of the selection policy, on digits with the
default model and recipe (train.* of params.yaml) and the gate of params.yaml.

Per forget set (random sets of sizes 10, 50 and 200, one whole class, the highest-self-leverage rows):
- oracle set A (role `oracles`, the gate's oracles) and an INDEPENDENT oracle set B (role `oracles_b`), N each,
  trained on R = D minus F; the shadow originals (role `shadows`) and the original (base.seed) on D, once;
- candidates, each judged exactly as the flow judges them (unlearning.certificate, the sequential looks of
  unlearning.sequential, unlearning.gate; the `retrain` row is the audit of an exact retrain, one look at N):
  `retrain_indep` (member 0 of B promoted, B's N models as the "shadow-unlearned" side vs A: the gate's
  false-reject rate on a true retrain), `retrain` (the flow's path: member 0 of A vs halves of A's others),
  `do_nothing`, `gradient_ascent`, `descent_ascent` (`finetune` on the first --finetune-sets sets, `newton_ggn` on
  the first --newton-sets sets: both slow),
  each run through unlearning.methods.run_method on the original and on the N shadows;
- `true_gap_ratio` of do_nothing: max over splits of KLoM P95(shadows vs B) / KLoM P95(A vs B), an independent
  N-vs-N measure of how far the original is from a retrain ("exceeds the floor" when > 1.5);
- the policy (unlearning.selection.candidate_methods over the leverage diagnostics): whether its first candidate
  passed, and the seconds spent on candidates that failed before the first passing one (regret).
Prints a table per method and writes bench/results/calibration.json.
Usage: python bench/calibration.py [--n 80] [--random-sets 21] [--finetune-sets 2] [--newton-sets 0] [--threads 2]
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
from unlearning.batch import BatchRows
from unlearning.certificate import retrain_equivalence_metrics
from unlearning.config import load_params
from unlearning.plan import sequential_step
from unlearning.sequential import look_verdict
from unlearning.leverage import compute_diagnostics
from unlearning.methods import run_method
from unlearning.methods.base import UnlearnContext
from unlearning.metrics import klom, klom_summary, margins
from unlearning.models import predict_logits
from unlearning.seeds import method_seed, original_seed, role_seeds
from unlearning.selection import batch_facts, candidate_methods

ROOT = Path(__file__).resolve().parents[1]
from unlearning.batch import SPLITS  # noqa: E402
METHODS = ("do_nothing", "gradient_ascent", "descent_ascent")


_train = train_members


def forget_sets(rng, train_rows, y, n_random, self_lev_rank) -> list[tuple[str, np.ndarray]]:
    sizes = (10, 50, 200)
    out = [(f"random{sizes[k % 3]}_{k // 3}", np.sort(rng.choice(train_rows, sizes[k % 3], replace=False)))
           for k in range(n_random)]
    out.append(("class_3", train_rows[y[train_rows] == 3]))
    if self_lev_rank is not None:
        out.append(("high_self_leverage50", np.sort(train_rows[self_lev_rank[:50]])))
    return out


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
    ap.add_argument("--out", default=str(ROOT / "bench/results/calibration.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gate = params.gate.model_copy(deep=True)
    gate.retrain_equivalence.n_permutations = a.n_permutations
    # the sequential certificate's looks at this N (unlearning/plan.py, unlearning/sequential.py)
    validation = params.validation.model_copy(update={"n_oracles": a.n, "n_shadows": a.n})
    seq = sequential_step("bench", validation, gate, 1.0)
    looks = (seq.looks, seq.alphas, seq.permutations)
    t_start = time.perf_counter()

    prob = digits_problem(params)
    X_all, y_all, y_np, spec, recipe = prob.X, prob.y, prob.y_np, prob.spec, prob.recipe
    train_rows, val_rows = prob.train_rows, prob.val_rows
    XD, yD = X_all[train_rows], y_all[train_rows]
    t0 = time.perf_counter()
    original = _train(spec, [original_seed(a.seed)], XD, yD, recipe)
    shadows = _train(spec, role_seeds(a.seed, "shadows", a.n), XD, yD, recipe)
    seconds_shadows = time.perf_counter() - t0

    # "high self-leverage" rows: ranked by the original's training loss (self-influence grows with the residual;
    # a per-row exact self-leverage over all 1438 rows would cost more than the bench); the set's measured
    # self-leverage trace is in the JSON facts (`self_leverage_trace`) next to the random sets'.
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(predict_logits(original, XD)[0], yD, reduction="none").numpy()
    rank = np.argsort(-loss)
    rng = np.random.default_rng(a.seed + 12)
    sets = forget_sets(rng, train_rows, y_np, a.random_sets, None if a.no_special else rank)
    if a.no_special:
        sets = [s for s in sets if not s[0].startswith("class")]
    methods = [s for s in a.methods.split(",") if s]

    rows_out = []
    for k, (name, F) in enumerate(sets):
        ts = time.perf_counter()
        R = np.setdiff1d(train_rows, F)
        forget_classes = np.unique(y_np[F])
        adjacent_mask = np.isin(y_np[R], forget_classes)
        rows = BatchRows(before=train_rows, forget=F, retain=R, adjacent_mask=adjacent_mask, validation=val_rows)
        eval_rows, splits = rows.eval_rows()
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

        results: dict[str, dict] = {}

        def judge(method, cand, shadow_unl, orc, acc_ref, seconds, is_retrain=False, sequential=True):
            """The flow's certificate: the sequential looks of unlearning/sequential.py over prefixes of the
            reference sets (`acc_ref` is `orc` or an independent set of the same size); sequential=False: one
            look at full N, alpha whole (the audit of an exact retrain)."""
            plan = looks if sequential else (((shadow_unl.shape[0], orc.shape[0]),), (gate.retrain_equivalence.alpha,),
                                             (a.n_permutations,))
            for k, ((n_s, n_o), alpha_k, perms) in enumerate(zip(*plan)):
                n_a = acc_ref.shape[0] if not sequential else n_o
                mets, _ = retrain_equivalence_metrics(cand, shadow_unl[:n_s], orc[:n_o], acc_ref[:n_a], labels,
                                                      splits, n_permutations=perms, seed=a.seed)
                mets["candidate_is_retrain"] = float(is_retrain)
                v, decision, _ = look_verdict(mets, gate, "retrain_equivalence", alpha_k, k == len(plan[0]) - 1, k)
                if decision != "continue":
                    break
            results[method] = {
                "passed": v.passed, "failures": v.failures, "seconds": round(seconds, 3),
                "look": k + 1, "references": int(n_s + n_o),
                **{f"klom_p95/{s}": mets.get(f"klom_p95/{s}") for s in SPLITS},
                **{f"klom_pvalue/{s}": mets.get(f"klom_pvalue/{s}") for s in SPLITS},
                **{f"noise_floor_p95/{s}": mets.get(f"noise_floor_p95/{s}") for s in SPLITS},
                "metrics": {k2: v2 for k2, v2 in mets.items() if isinstance(v2, float)}}

        judge("retrain_indep", lb[:1], lb, la, la, seconds_oracles, True)
        perm = np.random.default_rng(a.seed).permutation(np.arange(1, a.n))
        h = len(perm) // 2
        judge("retrain", la[:1], la[perm[:h]], la[perm[h:]], la[perm], seconds_oracles, True, sequential=False)

        ctx_of = lambda model: UnlearnContext(model=model, X_forget=X_all[F], y_forget=y_all[F], X_retain=XR,
                                              y_retain=yR, adjacent_mask=torch.as_tensor(adjacent_mask),
                                              recipe=recipe, seed=method_seed(a.seed))

        def run(method):
            tm = time.perf_counter()
            cand = run_method(method, ctx_of(original), params.deletion.method_args.get(method, {})).model
            sh = run_method(method, ctx_of(shadows), params.deletion.method_args.get(method, {})).model
            sec = time.perf_counter() - tm
            judge(method, predict_logits(cand, Xe), predict_logits(sh, Xe), la, la, sec)

        for method in (methods + (["finetune"] if k < a.finetune_sets and "finetune" not in methods else [])
                       + (["newton_ggn"] if k < a.newton_sets else [])):
            run(method)

        # the policy on this set's facts (leverage diagnostics of the original, as the flow computes them)
        td = time.perf_counter()
        report = compute_diagnostics(original, X_all[F], y_all[F], XR, yR, X_all[val_rows], y_all[val_rows],
                                     lam=params.ggn_damping(len(train_rows)), solver=params.diagnostics.solver, device="cpu",
                                     proj_dim=params.diagnostics.proj_dim,
                                     check_subset=params.diagnostics.check_subset, seed=a.seed)
        seconds_diag = time.perf_counter() - td
        facts = batch_facts(params.deletion, params.train.epochs, "retrain_equivalence", rows, report,
                            oracle_forget_logits=predict_logits(oracles_a, X_all[F]))
        sel = candidate_methods(params.deletion, facts)
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
        rows_out.append({"set": name, "n_forget": int(len(F)), "true_gap_ratio": round(true_gap_ratio, 3),
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
              + " ".join(f"{mm}={'P' if res['passed'] else 'F'}" for mm, res in results.items())
              + f" policy={sel['candidates']} first={'P' if first_passed else 'F'} ({r['seconds']:.0f}s)", flush=True)

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
           "sets": rows_out}
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


if __name__ == "__main__":
    main()
