"""Stream bench of the qualified mode (docs/certificate.md, "Two modes"; bench/stream.py is licensed inaction's):
qualify once, then 20 consecutive deletion batches, each licensed by the qualification, checked cheaply, promoted,
and then AUDITED by the full certificate, so that the qualified path's error rate is measured, not assumed.

Per dataset (digits, and Fashion-MNIST at 8,000 training rows; the MLP and recipe of params.yaml):
1. qualification (unlearning/certificate/qualification.py): the qualify.suite of params.yaml (counts scaled by --suite-scale),
   each set's predicted gap from the leverage diagnostics of the original, in the noise unit of the shadow
   originals on the validation rows; `do_nothing` judged by the sequential certificate (unlearning/sequential.py
   looks, unlearning/certificate/equivalence.py metrics, unlearning/certificate/gate.py) against N oracles retrained without the set;
   the pass-rate table and its intervals as params.yaml declares them;
2. the stream: 20 forget sets held here (random sets of 5-50 rows and structured ones: part of a class, the
   nearest neighbours of a row, the highest-loss rows), drawn from the rows still retained; per batch:
   diagnostics of the production model (skipped, as in the flow, while no row of the table licenses at any
   gap) -> the licensing rule (validation.qualified_min_pass and _bound) ->
   do_nothing with the cheap checks (accuracy per split against the production model, the membership test of
   forget against validation), or an exact retrain -> promoted. Timed from the request to the promoted model.
3. the audit of every batch promoted by the qualified path: the full certificate of the production model
   against N retrains on the rows now retained (its shadows: N models trained like the production model, on
   the rows it was trained on, so the audit sees the debt of every batch since the last retrain). A failed audit
   is a false accept: an exact retrain follows at once, and the audit's trial joins the qualification table.

Cost per batch in units of one retrain (the measured seconds of one retrain of the production model on the
current rows): diagnostics + the method + the cheap checks, plus 1 for a retrain. Audits are reported apart (they
are off the batch's critical path). The bench drives the core functions directly, not the Prefect flows (2
shared cores); the flow path is the one tests/flow/test_qualify_flow.py runs.

Usage: python bench/qualified_stream.py [--datasets digits,fashion_mnist] [--n 32] [--looks 16] [--suite-scale 1]
       [--batches 20] [--threads 1] [--diagnostics-solver S] [--out bench/results/qualified_stream.json]
       python bench/qualified_stream.py --tables A.json [B.json ...]   # README table (between the bench:qualified_stream markers)
                                                               # and the full one in docs/evidence.md
"""

from __future__ import annotations

import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import torch

from unlearning.batch.rows import BatchRows, sampled_for_certificate
from unlearning.certificate import metric_keys as K
from unlearning.config import load_params
from unlearning.data import load_dataset
from unlearning.leverage import compute_diagnostics
from unlearning.metrics import accuracy_by_split
from unlearning.models import build_model, fit, predict_logits
from unlearning.models.training import recipe_from
from unlearning.models.zoo import spec_from
from unlearning.planning.plan import sequential_step
from unlearning.certificate.qualification import (EXACT, License, Qualification, Trial, cheap_checks, draw_suite,
                                      gap_in_noise_units, largest_class_share, license_method, licenses_any,
                                      membership_test)
from unlearning.policy.selection import noise_floor
from unlearning.seeds import batch_role_seeds, original_seed, role_seeds
from unlearning.sequential import Criterion, certify_logits, permutations_for, reference_prefixes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_io import dataset_parser, read_runs, write_between  # noqa: E402

METHOD = "do_nothing"


def problem(name: str, params, rows: int | None):
    kw = {"fashion_mnist_dir": params.prepare.fashion_mnist_dir, "max_train": rows, "max_val": 2000} \
        if name == "fashion_mnist" else {}
    ds = load_dataset(name, seed=params.base.seed, val_fraction=params.prepare.val_fraction, **kw)
    spec = spec_from(params.train.model, ds.in_shape, ds.n_classes)
    recipe = recipe_from(params.train)
    split = np.asarray(ds.split)
    y = np.asarray(ds.label).astype(np.int64)
    return NS(X=torch.as_tensor(np.asarray(ds.X), dtype=torch.float32), y=torch.as_tensor(y), y_np=y,
              train=np.flatnonzero(split == "train"), val=np.flatnonzero(split == "val"), spec=spec, recipe=recipe)


def train(p, seeds, rows):
    model = build_model(p.spec, list(seeds))
    fit(model, p.X[rows], p.y[rows], p.recipe)
    return model


def batch_rows(p, before, forget) -> BatchRows:
    retain = np.setdiff1d(before, forget)
    return BatchRows(before=before, forget=np.sort(forget), retain=retain,
                     adjacent_mask=np.isin(p.y_np[retain], np.unique(p.y_np[forget])), validation=p.val)


def diagnostics(p, params, model, rows: BatchRows, seed: int):
    d = params.diagnostics  # (--diagnostics-solver overrides d.solver in main)
    return compute_diagnostics(model, p.X[rows.forget], p.y[rows.forget], p.X[rows.retain], p.y[rows.retain],
                               p.X[p.val], p.y[p.val], lam=d.damping(len(rows.before), params.train.weight_decay),
                               solver=d.solver, device="cpu", proj_dim=d.proj_dim, check_subset=d.check_subset,
                               seed=seed, cross_sample=d.cross_sample, check_rows=d.check_rows,
                               last_layer_above=d.last_layer_above, budget_retrains=d.max_retrains,
                               head_rank=d.head_rank, epochs=params.train.epochs)


def certify(p, params, candidate, shadows, oracles, rows: BatchRows, validation, seed: int) -> dict:
    """The per-batch sequential certificate of `candidate` (shadow-unlearned = `shadows`, as do_nothing leaves
    them) against `oracles`: looks, alpha per look, whole gate at the last look."""
    step = sequential_step(METHOD, validation, params.gate, 1.0)
    ev = sampled_for_certificate(rows, params.validation.certificate_rows, seed)
    eval_rows, splits = ev.eval_rows()
    labels, Xe = p.y_np[eval_rows], p.X[eval_rows]
    lc, ls, lo = predict_logits(candidate, Xe), predict_logits(shadows, Xe), predict_logits(oracles, Xe)
    criterion = Criterion.of_step(params.gate, step)  # the deletion flow's loop and rules (unlearning/sequential.py)
    done = certify_logits(criterion, lc, reference_prefixes(ls, lo), labels, splits, seed=seed)
    last = done.looks[-1]
    return {"passed": bool(done.accepted), "look": len(done.looks), "references": int(last.n_shadows + last.n_oracles),
            "failures": done.verdict.failures[:3],
            "epsilon": {key: round(v, 4) for key, v in K.of_measures(done.result.measures).items()
                        if key.startswith("epsilon")}}


def cheap(p, params, candidate, rows: BatchRows, seed: int, a_class_share: bool = True
          ) -> tuple[bool, list[str], float]:
    """The qualified batch's cheap checks (tasks/qualified.py does the same in the flow): accuracy per split
    against the production model (do_nothing: the same model), membership test of forget vs validation."""
    ev = sampled_for_certificate(rows, params.validation.certificate_rows, seed)
    eval_rows, splits = ev.eval_rows()
    labels = p.y_np[eval_rows]
    logits = predict_logits(candidate, p.X[eval_rows])
    metrics = {f"acc/{s}": v for s, v in accuracy_by_split(logits, labels, splits).items()}
    metrics.update({f"original_acc/{s}": v for s, v in accuracy_by_split(logits, labels, splits).items()})
    losses = torch.nn.functional.cross_entropy(logits[0].double(), torch.as_tensor(labels), reduction="none").numpy()
    f, v = splits == "forget", splits == "validation"
    g = params.gate.retrain_equivalence
    _, pval = membership_test(losses[f], labels[f], losses[v], labels[v], permutations_for(g.alpha, g.n_permutations),
                              seed)
    share = largest_class_share(p.y_np[rows.forget], p.y_np[rows.before])
    _, failures = cheap_checks(metrics, g.max_validation_drop, pval, g.alpha, share,
                               params.validation.qualified_max_class_share if a_class_share else None)
    return not failures, failures, pval


def stream_sets(p, rng, retained: np.ndarray, k: int, model, requests: str = "mixed", class_at: int | None = None
                ) -> tuple[str, np.ndarray]:
    """The k-th request of the stream (held in the bench, not in the qualification suite), drawn from the rows
    still retained: `mixed`, 13 random sets of 5 to 50 rows and 7 structured ones; `random`, random sets of 10 to
    100 rows, and every retained row of one class at batch `class_at` (None: never)."""
    plan = ["random5", "random10", "random20", "near20", "random10", "class30", "random5", "highloss10", "random50",
            "random10", "near10", "random20", "random5", "class15", "random10", "random20", "highloss20", "random5",
            "random50", "near30"]
    if requests == "random":  # random requests of 10-100 rows, one whole class at batch `class_at`
        kind = "class_all" if k == class_at else f"random{int(rng.integers(10, 101))}"
    else:
        kind = plan[k % len(plan)]
    if kind == "class_all":  # a class-level request: every retained row of one class
        c = rng.choice(np.unique(p.y_np[retained]))
        return f"class_all(class {c})", retained[p.y_np[retained] == c]
    size = int("".join(c for c in kind if c.isdigit()))
    if kind.startswith("random"):
        return kind, rng.choice(retained, size, replace=False)
    if kind.startswith("class"):
        c = rng.choice(np.unique(p.y_np[retained]))
        return f"{kind}(class {c})", rng.choice(retained[p.y_np[retained] == c], size, replace=False)
    if kind.startswith("near"):
        anchor = rng.choice(retained)
        d = ((p.X[retained] - p.X[anchor]) ** 2).flatten(1).sum(1).numpy()
        return kind, retained[np.argsort(d)[:size]]
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(predict_logits(model, p.X[retained])[0], p.y[retained],
                                                 reduction="none").numpy()
    return kind, retained[np.argsort(-loss)[:size]]


def run_dataset(name: str, params, a) -> dict:
    t_start = time.perf_counter()
    seed = params.base.seed
    p = problem(name, params, a.rows if name == "fashion_mnist" else None)
    validation = params.validation.model_copy(update={"n_oracles": a.n, "n_shadows": a.n,
                                                      "looks": [x for x in a.looks if x < a.n]})
    D0 = p.train
    t0 = time.perf_counter()
    original = train(p, [original_seed(seed)], D0)
    retrain_seconds0 = time.perf_counter() - t0
    shadows0 = train(p, role_seeds(seed, "shadows", a.n), D0)
    noise = noise_floor(predict_logits(shadows0, p.X[p.val]))
    print(f"[{name}] {len(D0)} training rows; one retrain {retrain_seconds0:.2f} s; noise unit {noise:.3g}", flush=True)

    # 1. qualification
    q = params.qualify
    suite_cfg = [NS(kind=e.kind, size=e.size, count=max(1, round(e.count * a.suite_scale))) for e in q.suite]
    with torch.no_grad():
        loss0 = torch.nn.functional.cross_entropy(predict_logits(original, p.X[D0])[0], p.y[D0],
                                                  reduction="none").numpy()
    suite = draw_suite(suite_cfg, seed, D0, p.y_np, p.y_np, loss0)
    trials, tq = [], time.perf_counter()
    for i, s in enumerate(suite):
        rows = batch_rows(p, D0, s.rows)
        rep = diagnostics(p, params, original, rows, seed)
        gap = gap_in_noise_units(rep.predicted_gap_forget, noise)
        oracles = train(p, batch_role_seeds(seed, "oracles", a.n, i), rows.retain)
        res = certify(p, params, original, shadows0, oracles, rows, validation, seed)
        trials.append(Trial(s.name, s.kind, len(s.rows), METHOD, gap, res["passed"], res["references"]))
        print(f"  qualify {s.name:24s} gap {gap:9.3g} -> {'pass' if res['passed'] else 'FAIL'}", flush=True)
    qual = Qualification([METHOD], list(q.bins), q.confidence, q.interval, noise, trials)
    qualify_seconds = time.perf_counter() - tq
    table0 = [{"row": r.row_id, "sets": r.n, "passed": r.passes, "rate": r.rate, "lower": r.lower, "upper": r.upper}
              for r in qual.table]

    # 2-3. the stream, every batch audited
    v = params.validation
    rng = np.random.default_rng(seed + 2026)
    production, base_rows, retained = original, D0, D0.copy()
    shadows_of = {D0.tobytes(): shadows0}
    batches = []
    for k in range(a.batches):
        t_req = time.perf_counter()
        set_name, F = stream_sets(p, rng, retained, k, production, a.requests, a.class_at)
        rows = batch_rows(p, retained, F)
        td = time.perf_counter()
        if licenses_any(qual.table, [METHOD], v.qualified_min_pass, v.qualified_bound):
            rep = diagnostics(p, params, production, rows, seed)
            gap = gap_in_noise_units(rep.predicted_gap_forget, noise)
            lic = license_method(qual.table, gap, [METHOD], v.qualified_min_pass, v.qualified_bound)
        else:  # as the flow (tasks/batch_path.py wants_diagnostics): no gap could license, none is computed
            gap, lic = float("nan"), License(EXACT, None, "nothing licensed at any gap: diagnostics skipped")
        diag_s = time.perf_counter() - td
        probe = None
        if a.probe_all:  # the cheap checks AND the audit of do_nothing on every batch, whatever was licensed
            ok_p, fail_p, p_p = cheap(p, params, production, rows, seed, a_class_share=False)  # as before
            key = base_rows.tobytes()
            if key not in shadows_of:
                shadows_of[key] = train(p, batch_role_seeds(seed, "shadows", a.n, 500 + k), base_rows)
            probe_oracles = train(p, batch_role_seeds(seed, "oracles", a.n, 2000 + k), rows.retain)
            res_p = certify(p, params, production, shadows_of[key], probe_oracles,
                            batch_rows(p, base_rows, np.setdiff1d(base_rows, rows.retain)), validation, seed)
            probe = {"cheap_passed": ok_p, "cheap_failures": fail_p, "membership_p": p_p,
                     "class_share": largest_class_share(p.y_np[rows.forget], p.y_np[rows.before]),
                     "audit_passed": res_p["passed"], "audit_epsilon": res_p["epsilon"]}
        tm = time.perf_counter()
        ok, failures, pval = (cheap(p, params, production, rows, seed) if lic.method != EXACT else (False, [], None))
        check_s = time.perf_counter() - tm
        tr = time.perf_counter()
        retrain_model = train(p, [batch_role_seeds(seed, "oracles", 1, 1000 + k)[0]], rows.retain)
        retrain_s = time.perf_counter() - tr
        promoted_method = METHOD if (lic.method != EXACT and ok) else EXACT
        spent = diag_s + check_s + (retrain_s if promoted_method == EXACT else 0.0)
        cost = spent / retrain_s  # in units of one retrain on this batch's rows
        seconds_to_promoted = time.perf_counter() - t_req - (0.0 if promoted_method == EXACT else retrain_s)
        before_rows = base_rows
        if promoted_method == EXACT:
            production, base_rows = retrain_model, rows.retain
        retained = rows.retain
        audit = None
        if promoted_method == METHOD:  # the audit: full certificate of the promoted model, off the critical path
            ta = time.perf_counter()
            key = before_rows.tobytes()
            if key not in shadows_of:
                shadows_of[key] = train(p, batch_role_seeds(seed, "shadows", a.n, 500 + k), before_rows)
            oracles = train(p, batch_role_seeds(seed, "oracles", a.n, 2000 + k), rows.retain)
            debt_rows = batch_rows(p, before_rows, np.setdiff1d(before_rows, rows.retain))
            res = certify(p, params, production, shadows_of[key], oracles, debt_rows, validation, seed)
            audit = {"passed": res["passed"], "references": res["references"], "look": res["look"],
                     "seconds": round(time.perf_counter() - ta, 2), "failures": res["failures"]}
            qual = qual.with_trial(Trial(f"batch{k}", "audit", len(F), METHOD, gap, res["passed"],
                                         res["references"], source="audit"))
            if not res["passed"]:  # a false accept: exact retrain now, on the rows retained
                production, base_rows = retrain_model, rows.retain
                audit["then"] = "exact retrain promoted"
        batches.append({"batch": k, "set": set_name, "n_forget": int(len(F)), "gap_to_noise": gap,
                        "licensed": lic.method, "row": lic.row.row_id if lic.row else None,
                        "cheap_checks_passed": ok if lic.method != EXACT else None, "membership_p": pval,
                        "cheap_failures": failures, "promoted": promoted_method, "cost_retrains": round(cost, 3),
                        "diagnostics_seconds": round(diag_s, 3), "retrain_seconds": round(retrain_s, 3),
                        "seconds_to_promoted": round(seconds_to_promoted, 3), "audit": audit, "probe": probe})
        b = batches[-1]
        print(f"  batch {k:2d} {set_name:22s} nF={len(F):3d} gap {gap:9.3g} licensed {lic.method:10s} "
              f"promoted {promoted_method:10s} cost {cost:5.2f} to-promoted {seconds_to_promoted:5.2f} s"
              + (f" audit {'pass' if audit['passed'] else 'FAIL -> retrain'}" if audit else ""), flush=True)

    audited = [b for b in batches if b["audit"]]
    failed = [b for b in audited if not b["audit"]["passed"]]
    summary = {
        "batches": len(batches), "qualified_promotions": len(audited),
        "mean_cost_retrains": float(np.mean([b["cost_retrains"] for b in batches])),
        "false_accepts": len(failed), "false_accept_rate": len(failed) / len(audited) if audited else None,
        "median_seconds_to_promoted": float(np.median([b["seconds_to_promoted"] for b in batches])),
        "max_seconds_to_promoted": float(np.max([b["seconds_to_promoted"] for b in batches])),
        "retrains": sum(b["promoted"] == EXACT for b in batches),
        "audit_retrains": len(failed), "every_failed_audit_retrained": all(b["audit"].get("then") for b in failed),
        "cheap_check_fallbacks": sum(b["licensed"] != EXACT and b["promoted"] == EXACT for b in batches),
        "mean_audit_seconds": float(np.mean([b["audit"]["seconds"] for b in audited])) if audited else None,
        # what per_batch would train to accept one approximate candidate (members of the final look)
        "per_batch_certificate_members": int(sum(sequential_step(METHOD, validation, params.gate, 1.0).references)),
        "cheap_checks_vs_audit": cheap_vs_audit([b["probe"] for b in batches if b.get("probe")]),
        "table_rows_changed_by_audits": sum(
            (r.n, r.passes) != (t["sets"], t["passed"]) for r, t in zip(qual.table, table0))}
    return {"dataset": name, "n_train": int(len(D0)), "n": a.n, "looks": validation.looks,
            "retrain_seconds": round(retrain_seconds0, 3), "noise_unit": noise, "qualify_seconds": round(qualify_seconds, 1),
            "qualification_table": table0, "table_after_audits": [
                {"row": r.row_id, "sets": r.n, "passed": r.passes, "rate": r.rate, "lower": r.lower} for r in qual.table],
            "suite": [t.__dict__ for t in trials], "summary": summary, "batches": batches,
            "wall_seconds": round(time.perf_counter() - t_start, 1)}


def cheap_vs_audit(probes: list[dict]) -> dict | None:
    """The cheap checks against the audit on the batches probed (`--probe-all`): how often they pass a batch whose
    audit fails (false pass), at the gate's alpha and, replayed from the stored membership p-values, at stricter
    levels (the accuracy checks unchanged)."""
    if not probes:
        return None
    failing = [x for x in probes if not x["audit_passed"]]
    acc_ok = lambda x: not any(f.startswith("acc/") for f in x["cheap_failures"])  # noqa: E731
    out = {"batches": len(probes), "audit_failed": len(failing),
           "cheap_passed": sum(x["cheap_passed"] for x in probes),
           "false_pass": sum(x["cheap_passed"] for x in failing),
           "false_pass_rate": round(sum(x["cheap_passed"] for x in failing) / len(failing), 3) if failing else None,
           "false_reject": sum((not x["cheap_passed"]) and x["audit_passed"] for x in probes)}
    share = lambda x: x.get("class_share", 0.0) <= 0.5  # noqa: E731  (validation.qualified_max_class_share)
    out["false_pass_with_class_share_check"] = sum(x["cheap_passed"] and share(x) for x in failing)
    out["passes_with_class_share_check"] = sum(x["cheap_passed"] and share(x) for x in probes)
    for level in (0.05, 0.2, 0.5):
        fp = sum(acc_ok(x) and x["membership_p"] >= level for x in failing)
        out[f"false_pass_at_membership_alpha_{level}"] = fp
        out[f"passes_at_membership_alpha_{level}"] = sum(acc_ok(x) and x["membership_p"] >= level for x in probes)
    return out


CHEAP_BEGIN, CHEAP_END = "<!-- cheap-checks:begin -->", "<!-- cheap-checks:end -->"


def audit_passes_at(probe: dict, budget: float) -> bool:
    """The probe's audit replayed at another epsilon budget: every split's upper bound (last look) within it."""
    ups = [v for k, v in probe["audit_epsilon"].items() if k.startswith("epsilon_upper/")]
    return bool(ups) and all(v <= budget for v in ups)


def cheap_checks_table(run: dict, budgets=(2.5, 4.0, 6.0, 10.0)) -> str:
    """docs/certificate.md: per dataset of a `--probe-all` run, every batch's cheap checks against its audit, and
    the false passes at several epsilon budgets, with and without the class-share check."""
    lines = []
    for d in run["datasets"]:
        probes = [b for b in d["batches"] if b.get("probe")]
        if not probes:
            continue
        flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {' '.join(map(str, v)) if isinstance(v, list) else v}")
                         for k, v in run["argv"].items() if v not in (None, False, []) and k != "out")
        lines += [f"`python bench/qualified_stream.py {flags}`"
                  f" ({run['date'][:10]}, {d['dataset']}, {d['n_train']} rows, N = {d['n']}; the audit under "
                  f"`{run.get('criterion')}`):", "",
                  "| batch | request | rows | class share | membership p | cheap checks (without / with class share) | "
                  "audit forget epsilon (point, upper) | audit passes at " + " / ".join(f"{b:g}" for b in budgets) + " |",
                  "|---|---|---|---|---|---|---|---|"]
        for b in probes:
            x = b["probe"]
            e = x["audit_epsilon"]
            with_share = x["cheap_passed"] and x.get("class_share", 0.0) <= 0.5
            lines.append(f"| {b['batch']} | {b['set']} | {b['n_forget']} | {x.get('class_share', float('nan')):.2f} | "
                         f"{x['membership_p']:.3f} | {'pass' if x['cheap_passed'] else 'fail'} / "
                         f"{'pass' if with_share else 'fail'} | {e.get('epsilon/forget', float('nan')):.2f}, "
                         f"{e.get('epsilon_upper/forget', float('nan')):.2f} | "
                         + " / ".join("yes" if audit_passes_at(x, bb) else "no" for bb in budgets) + " |")
        lines += ["", "| epsilon budget | audits failed | cheap checks passed them (false passes, without / with class "
                  "share) | membership test alone at alpha 0.2 |", "|---|---|---|---|"]
        for bb in budgets:
            failing = [b["probe"] for b in probes if not audit_passes_at(b["probe"], bb)]
            fp = sum(x["cheap_passed"] for x in failing)
            fp2 = sum(x["cheap_passed"] and x.get("class_share", 0.0) <= 0.5 for x in failing)
            fp3 = sum(x["membership_p"] >= 0.2 and x.get("class_share", 0.0) <= 0.5 for x in failing)
            lines.append(f"| {bb:g} | {len(failing)} of {len(probes)} | {fp} / {fp2} | {fp3} |")
        lines.append("")
    return "\n".join(lines)


BEGIN, END = "<!-- bench:qualified_stream:begin -->", "<!-- bench:qualified_stream:end -->"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def compact_table(runs: list[dict]) -> str:
    """The README's table: one row per dataset."""
    lines = ["| dataset (rows) | licensing rule | certificate N | qualified promotions | mean cost / batch (retrains) "
             "| false accepts (audited) | request -> promoted (median s) | audits changed |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        rule = f"{run['qualified_bound']} >= {run['qualified_min_pass']}"
        for d in run["datasets"]:
            s = d["summary"]
            lines.append(f"| {d['dataset']} ({d['n_train']}) | {rule} | {d['n']} | "
                         f"{s['qualified_promotions']}/{s['batches']} | "
                         f"{s['mean_cost_retrains']:.2f} | {s['false_accepts']}/{s['qualified_promotions']} "
                         f"({_pct(s['false_accept_rate'])}) | {s['median_seconds_to_promoted']:.2f} | "
                         f"{s['audit_retrains']} retrain(s), {s['table_rows_changed_by_audits']} table row(s) |")
    dates = sorted({r["date"][:10] for r in runs})
    return (f"Measured {', '.join(dates)} on this 2-core machine (shared) by `python bench/qualified_stream.py`; targets: "
            f"mean cost <= 0.5 retrain, false accepts <= 5 %, every failed audit followed by an exact retrain.\n\n"
            + "\n".join(lines))


def full_tables(runs: list[dict]) -> str:
    """docs/evidence.md: per dataset, the qualification table and every batch."""
    out = []
    for run in runs:
        for d in run["datasets"]:
            s = d["summary"]
            out += [f"### {d['dataset']}, {d['n_train']} training rows ({run['date'][:10]}, "
                    f"`{' '.join(f'--{k.replace(chr(95), chr(45))} {v}' for k, v in run.get('argv', {}).items() if v not in (None, []))}`"
                    f", diagnostics solver {run.get('diagnostics_solver')})", "",
                    f"One retrain {d['retrain_seconds']} s; noise unit {d['noise_unit']:.3g}; qualification "
                    f"{d['qualify_seconds']} s; every failed audit retrained: {s['every_failed_audit_retrained']}; "
                    f"cheap-check fallbacks to retrain: {s['cheap_check_fallbacks']}; mean audit "
                    f"{s['mean_audit_seconds'] if s['mean_audit_seconds'] is None else round(s['mean_audit_seconds'], 1)} s; "
                    f"per_batch would train {s['per_batch_certificate_members']} references to accept.", "",
                    "| qualification row | sets | passed | rate | lower | after the audits (sets, passed) |",
                    "|---|---|---|---|---|---|"]
            for r0, r1 in zip(d["qualification_table"], d["table_after_audits"]):
                rate = "-" if r0["rate"] is None or r0["rate"] != r0["rate"] else f"{r0['rate']:.2f}"
                out.append(f"| {r0['row']} | {r0['sets']} | {r0['passed']} | {rate} | {r0['lower']:.2f} | "
                           f"{r1['sets']}, {r1['passed']} |")
            out += ["", "| batch | set | rows | gap (noise units) | licensed | promoted | cost (retrains) | "
                        "request -> promoted (s) | audit |", "|---|---|---|---|---|---|---|---|---|"]
            for b in d["batches"]:
                au = b["audit"]
                audit = "-" if au is None else ("passed" if au["passed"] else "FAILED: exact retrain")
                out.append(f"| {b['batch']} | {b['set']} | {b['n_forget']} | {b['gap_to_noise']:.3g} | {b['licensed']} | "
                           f"{b['promoted']} | {b['cost_retrains']:.2f} | {b['seconds_to_promoted']:.2f} | {audit} |")
            out.append("")
    return "\n".join(out)


def main() -> None:
    params = load_params(ROOT / "params.yaml")
    if len(sys.argv) > 2 and sys.argv[1] == "--cheap-table":
        write_between(ROOT / "docs" / "certificate.md", CHEAP_BEGIN, CHEAP_END,
                      cheap_checks_table(json.loads(Path(sys.argv[2]).read_text())))
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--tables":
        runs = read_runs(sys.argv[2:])
        write_between(ROOT / "README.md", BEGIN, END, compact_table(runs))
        write_between(ROOT / "docs" / "evidence.md", BEGIN, END, full_tables(runs))
        return
    ap = dataset_parser(__doc__)
    ap.add_argument("--n", type=int, default=32, help="oracles (and shadows) per certificate")
    ap.add_argument("--looks", type=int, nargs="*", default=[16])
    ap.add_argument("--suite-scale", type=float, default=1.0, help="multiplies every qualify.suite count")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bound", choices=["lower", "point"], default=None,
                    help="validation.qualified_bound (default: params.yaml's)")
    ap.add_argument("--min-pass", type=float, default=None, help="validation.qualified_min_pass (default: params.yaml's)")
    ap.add_argument("--diagnostics-solver", default=None, help="diagnostics.solver for the qualification and the "
                                                                "stream alike (default: params.yaml's)")
    ap.add_argument("--criterion", choices=["difference", "epsilon"], default=None,
                    help="gate.criterion of every certificate and audit (default: params.yaml's)")
    ap.add_argument("--epsilon-max", type=float, default=None, help="gate.epsilon.max (default: params.yaml's)")
    ap.add_argument("--requests", choices=["mixed", "random"], default="mixed",
                    help="mixed: random and structured sets of 5-50 rows; random: random sets of 10-100 rows")
    ap.add_argument("--class-at", type=int, default=None, help="with --requests random: a whole-class request at "
                                                               "this batch")
    ap.add_argument("--probe-all", action="store_true", help="run the cheap checks and the audit of do_nothing on "
                                                             "every batch (their false-pass rate)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/qualified_stream.json"))
    a = ap.parse_args()
    if a.criterion:
        params.gate.criterion = a.criterion
    if a.epsilon_max is not None:
        params.gate.epsilon.max = a.epsilon_max
    torch.set_num_threads(a.threads)
    if a.diagnostics_solver:
        params.diagnostics.solver = a.diagnostics_solver
    if a.bound:
        params.validation.qualified_bound = a.bound
    if a.min_pass is not None:
        params.validation.qualified_min_pass = a.min_pass
    out = {"diagnostics_solver": params.diagnostics.solver, "argv": vars(a),"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
           "threads": a.threads, "qualified_min_pass": params.validation.qualified_min_pass,
           "qualified_bound": params.validation.qualified_bound, "confidence": params.qualify.confidence,
           "interval": params.qualify.interval, "criterion": params.gate.criterion,
           "epsilon": params.gate.epsilon.model_dump(), "datasets": []}
    for name in a.datasets.split(","):
        out["datasets"].append(run_dataset(name, params, a))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    for d in out["datasets"]:
        s = d["summary"]
        print(f"{d['dataset']}: mean cost {s['mean_cost_retrains']:.2f} retrains/batch; qualified promotions "
              f"{s['qualified_promotions']}/{s['batches']}; false accepts {s['false_accepts']} "
              f"({s['false_accept_rate']}); median request->promoted {s['median_seconds_to_promoted']:.2f} s; "
              f"audit retrains {s['audit_retrains']}; {d['wall_seconds']:.0f} s")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
