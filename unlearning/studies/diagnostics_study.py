"""S5, "Loss is Not Behavior" on digits: the leverage diagnostics computed BEFORE unlearning (docs/design.md §4.1)
against what each method then does, over forget sets of different structure.

Per structure: the diagnostics of the original (predicted output gap, self-leverage trace; the policy's facts,
unlearning.policy.selection.batch_facts), then every method of `report.s5.methods` on the original and the N shadows,
its realised gap (mean |margin - oracle mean margin| on the forget set, oracle set A, averaged over the
shadows; the retrain is oracle set B: `unlearning.studies.digits.margin_gap`) and the gate's verdict (oracle set A).

Reported: the Spearman correlation across structures of the predicted gap with each method's gap, and with each
method's advantage over do_nothing (do_nothing's gap minus the method's: where moving away from the original
pays off); how often the policy's first pick (the rules of params.yaml) was the best method in hindsight (the
cheapest one the gate accepts; an exact retrain counts as accepted when gate.exact_retrain_overrides), and the
regret: seconds the policy spent until its accepted pick minus the best method's seconds.

Self-leverage per training row (for the high / low self-leverage structures): the trace of its block of
S = A G^-1 A^T with G the GGN of D minus the row's chunk of `LEVERAGE_CHUNK` rows (chunked so that S stays
small; leaving a chunk out instead of the row alone changes G by a few per cent of its rows).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from unlearning.config import Params, S5Diagnostics, method_traits
from unlearning.leverage import compute_diagnostics
from unlearning.leverage.diagnostics import spearman
from unlearning.models import predict_logits
from unlearning.progress import Progress
from unlearning.policy.selection import batch_facts, candidate_methods
from unlearning.studies.digits import DigitsProblem, make_forget_set, run_candidate, train_originals, digits_problem

LEVERAGE_CHUNK = 240


def row_self_leverage(params: Params, prob: DigitsProblem, original, seed: int) -> np.ndarray:
    """[n_train] self-leverage of every training row (module docstring), in prob.train_rows order."""
    rows = prob.train_rows
    out = np.empty(len(rows))
    lam = params.ggn_damping(len(rows))
    for start in range(0, len(rows), LEVERAGE_CHUNK):
        chunk = rows[start:start + LEVERAGE_CHUNK]
        rest = np.setdiff1d(rows, chunk)
        rep = compute_diagnostics(original, prob.X[chunk], prob.y[chunk], prob.X[rest], prob.y[rest], lam=lam,
                                  solver=params.diagnostics.solver, device="cpu", proj_dim=params.diagnostics.proj_dim,
                                  check_subset=0, seed=seed)
        out[start:start + len(chunk)] = rep.self_leverage
    return out


def structures(prob: DigitsProblem, cfg: S5Diagnostics, self_lev: np.ndarray | None) -> list[tuple[str, np.ndarray]]:
    """(name, forget rows) per structure of cfg.structures, deterministic in cfg.seed."""
    rng = np.random.default_rng(np.random.SeedSequence(cfg.seed, spawn_key=(5,)))
    tr, y = prob.train_rows, prob.y_np
    classes = np.unique(y[tr])
    whole, half = rng.choice(classes, 2, replace=False)
    out = []
    for name in cfg.structures:
        if name.startswith("random"):
            F = rng.choice(tr, int(name[len("random"):]), replace=False)
        elif name == "class":
            F = tr[y[tr] == whole]
        elif name == "half_class":
            members = tr[y[tr] == half]
            F = rng.choice(members, len(members) // 2, replace=False)
        elif name == "group":  # a sub-population: the structure_size nearest rows (pixels) of one random row
            centre = prob.X[rng.choice(tr)]
            dist = torch.cdist(prob.X[tr], centre[None]).ravel().numpy()
            F = tr[np.argsort(dist, kind="stable")[:cfg.structure_size]]
        elif name in ("high_self_leverage", "low_self_leverage"):
            order = np.argsort(self_lev, kind="stable")
            pick = order[-cfg.structure_size:] if name.startswith("high") else order[:cfg.structure_size]
            F = tr[pick]
        else:  # guarded by the config's Literal
            raise ValueError(f"report.s5.structures: unknown structure {name!r}")
        out.append((name, np.sort(F)))
    return out


def accepted(res: dict, params: Params) -> bool:
    """What the flow promotes: the gate passed, or an exact retrain with gate.exact_retrain_overrides."""
    return bool(res["passed"] or (method_traits(res["method"]).exact and params.gate.exact_retrain_overrides))


def policy_outcome(candidates: list[str], results: dict, params: Params) -> dict:
    """The policy walks its candidates until one is accepted; the best method in hindsight is the cheapest
    accepted one among every method run on the structure."""
    spent, accepted_with = 0.0, None
    for c in candidates:
        spent += results[c]["seconds"]
        if accepted(results[c], params):
            accepted_with = c
            break
    ok = {m: r["seconds"] for m, r in results.items() if accepted(r, params)}
    best = min(ok, key=ok.get) if ok else None
    return {"candidates": candidates, "first_pick": candidates[0], "accepted_with": accepted_with, "best": best,
            "first_pick_is_best": bool(best is not None and candidates[0] == best),
            "seconds_spent": spent, "regret_seconds": spent - (ok[best] if best else 0.0)}


def correlations(rows: list[dict], methods: list[str]) -> dict:
    """Spearman across structures of the predicted gap (and of the self-leverage trace) with each method's
    forget gap and with its advantage over do_nothing."""
    pred = [r["facts"]["predicted_gap"] for r in rows]
    trace = [r["facts"]["self_leverage_trace"] for r in rows]
    dn = [r["gaps"]["do_nothing"] for r in rows] if all("do_nothing" in r["gaps"] for r in rows) else None
    out = {}
    for m in methods:
        g = [r["gaps"][m] for r in rows]
        out[m] = {"predicted_gap_vs_gap": spearman(pred, g), "self_leverage_trace_vs_gap": spearman(trace, g)}
        if dn is not None and m != "do_nothing":
            adv = [a - b for a, b in zip(dn, g)]
            out[m]["predicted_gap_vs_advantage"] = spearman(pred, adv)
    return out


def run_s5(params: Params, cfg: S5Diagnostics | None = None, progress: bool | str | None = None) -> dict:
    cfg = cfg or params.report.s5
    gate, n_perm = params.gate, params.gate.retrain_equivalence.n_permutations
    t_start = time.perf_counter()
    prob = digits_problem(params)
    orig = train_originals(prob, cfg.seed, cfg.n_models)
    need_lev = any(s.endswith("self_leverage") for s in cfg.structures)
    t0 = time.perf_counter()
    self_lev = row_self_leverage(params, prob, orig.original, cfg.seed) if need_lev else None
    seconds_self_lev = time.perf_counter() - t0
    lam = params.ggn_damping(len(prob.train_rows))
    rows = []
    todo = structures(prob, cfg, self_lev)
    with Progress(len(todo), "S5 forget-set structures", unit="sets", enabled=progress) as bar:
        for name, F in todo:
            bar.stage(name)
            fs = make_forget_set(orig, name, F)
            td = time.perf_counter()
            report = compute_diagnostics(orig.original, prob.X[F], prob.y[F], prob.X[fs.R], prob.y[fs.R],
                                         prob.X[prob.val_rows], prob.y[prob.val_rows], lam=lam,
                                         solver=params.diagnostics.solver, device="cpu",
                                         proj_dim=params.diagnostics.proj_dim,
                                         check_subset=params.diagnostics.check_subset, seed=cfg.seed)
            seconds_diag = time.perf_counter() - td
            facts = batch_facts(params.deletion, params.train.epochs, "retrain_equivalence", fs.rows, report,
                                oracle_forget_logits=predict_logits(fs.oracles_a, prob.X[F]))
            sel = candidate_methods(params.deletion, facts)
            for m in dict.fromkeys([*cfg.methods, *sel["candidates"]]):
                run_candidate(orig, fs, m, dict(params.deletion.method_args.get(m, {})), gate, n_permutations=n_perm)
            res = fs.results
            rows.append({"structure": name, "n_forget": int(len(F)),
                         "facts": {k: v for k, v in facts.items() if isinstance(v, (bool, int, float, str))},
                         "diagnostics_seconds": seconds_diag,
                         "gaps": {m: r["gap"]["forget"] for m, r in res.items()},
                         "klom_p95_forget": {m: r["klom_p95/forget"] for m, r in res.items()},
                         "passed": {m: r["passed"] for m, r in res.items()},
                         "seconds": {m: r["seconds"] for m, r in res.items()},
                         "fired": [f[0] for f in sel["fired"]],
                         "policy": policy_outcome(sel["candidates"], res, params)})
            bar.update()
    methods = [m for m in dict.fromkeys(m for r in rows for m in r["gaps"]) if all(m in r["gaps"] for r in rows)]
    pol = [r["policy"] for r in rows]
    return {"study": "s5", "config": cfg.model_dump(), "n_models": cfg.n_models, "n_permutations": n_perm,
            "alpha": gate.retrain_equivalence.alpha, "n_train": int(len(prob.train_rows)),
            "seconds_self_leverage": seconds_self_lev, "structures": rows, "methods": methods,
            "spearman": correlations(rows, methods),
            "policy": {"first_pick_is_best": int(sum(p["first_pick_is_best"] for p in pol)), "n": len(pol),
                       "median_regret_seconds": float(np.median([p["regret_seconds"] for p in pol])),
                       "max_regret_seconds": float(max(p["regret_seconds"] for p in pol))},
            "wall_seconds": time.perf_counter() - t_start}
