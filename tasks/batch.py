"""Tasks of a deletion batch: partition, candidate unlearning + validation against the oracles."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from prefect import task

from unlearning.batch import SPLITS, BatchRows, eval_logits, membership_metrics, retain_rows, unlearn_context
from unlearning.config import Params
from unlearning.data.store import Prepared
from unlearning.gate import Verdict, evaluate_gate
from unlearning.methods import run_method
from unlearning.methods.base import TrainRecipe
from unlearning.models import Ensemble
from unlearning.partition import partition_by_embedding, partition_by_group, partition_by_score
from unlearning import metrics as M


@task(name="partition-retain-set")
def partition_retain(params: Params, prepared: Prepared, state_manifest: pd.DataFrame, forget_ids: list[str],
                     model: Ensemble, cross_leverage: np.ndarray | None = None) -> pd.DataFrame:
    cfg = params.deletion.partition
    m = state_manifest
    r_rows = retain_rows(m, forget_ids)
    retain_ids = m["sample_id"].to_numpy()[r_rows]
    if cfg.mode == "group":
        forget_groups = m.set_index("sample_id").loc[forget_ids, "group"].to_numpy()
        return partition_by_group(retain_ids, m["group"].to_numpy()[r_rows], forget_groups)
    if cfg.mode == "leverage":
        if cross_leverage is None:
            raise ValueError("deletion.partition.mode = 'leverage' needs the leverage diagnostics, which did not run; "
                             "use mode 'group' or 'embedding'")
        return partition_by_score(retain_ids, cross_leverage, cfg.top_fraction)
    X = prepared.tensor()
    device = next(model.parameters()).device
    with torch.no_grad():
        feats_r = model.features(X[r_rows].to(device))[0].cpu()
        feats_f = model.features(X[prepared.rows(forget_ids)].to(device))[0].cpu()
    return partition_by_embedding(retain_ids, feats_r, feats_f, cfg.k_neighbors)


@dataclass
class CandidateOutcome:
    method: str
    model: Ensemble  # the unlearned production model (one member)
    metrics: dict[str, float]
    verdict: Verdict
    cost: dict
    per_sample: pd.DataFrame  # per evaluated sample: split, KLoM, margins summary
    worst: dict = field(default_factory=dict)  # margins of the worst forget samples, for plots


def _split_arrays(values: np.ndarray, splits: np.ndarray) -> dict[str, np.ndarray]:
    return {s: values[splits == s] for s in SPLITS}


@task(name="unlearn-and-validate")
def unlearn_and_validate(method: str, method_args: dict, params: Params, prepared: Prepared, rows: BatchRows,
                         production: Ensemble, shadows: Ensemble, oracles: Ensemble,
                         recipe: TrainRecipe, objective: str, device: str) -> CandidateOutcome:
    """Run `method` on the production model and on the N shadow originals, then compare with the oracles:
    per-split accuracy, KLoM (shadow-unlearned vs oracle margins), output gap, MIA; then the gate."""
    seed = params.base.seed
    t0 = time.perf_counter()
    if method == "retrain":
        # The oracles ARE exact retrains on R: promote member 0 and compare half of them with the other half.
        # The halves are those of the noise floor (metrics.oracle_half_klom), so retrain's KLoM IS the floor.
        candidate = oracles.select(0)
        perm, half = np.random.default_rng(seed).permutation(oracles.n_models), oracles.n_models // 2
        shadow_unlearned, oracle_ref = oracles.select(perm[:half].tolist()), oracles.select(perm[half:].tolist())
        cost = {"gradient_evals": 0, "steps": 0, "seconds": 0.0, "reused_oracle": True}
    else:
        res = run_method(method, unlearn_context(production.to(device), prepared, rows, recipe, seed), method_args)
        candidate = res.model
        shadow_res = run_method(method, unlearn_context(shadows.to(device), prepared, rows, recipe, seed), method_args)
        shadow_unlearned, oracle_ref = shadow_res.model, oracles
        cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds,
                "shadow_gradient_evals": shadow_res.cost.gradient_evals, "shadow_seconds": shadow_res.cost.seconds}
    eval_rows, splits = rows.eval_rows()
    labels = prepared.label[eval_rows]
    logits = {name: eval_logits(m, prepared, eval_rows) for name, m in
              (("candidate", candidate), ("original", production), ("oracles", oracles),
               ("shadow_unlearned", shadow_unlearned), ("oracle_ref", oracle_ref))}
    metrics: dict[str, float] = {}
    for prefix, key in (("acc", "candidate"), ("original_acc", "original"), ("oracle_acc", "oracles"),
                        ("shadow_acc", "shadow_unlearned")):
        for s, v in M.accuracy_by_split(logits[key], labels, splits).items():
            metrics[f"{prefix}/{s}"] = v
    oracle_member_acc = (logits["oracles"].argmax(-1) == torch.as_tensor(labels)).float().numpy()  # [N, n]
    for s in SPLITS:
        if (splits == s).any():
            metrics[f"oracle_acc_std/{s}"] = float(oracle_member_acc[:, splits == s].mean(1).std())
    m_unl = M.margins(logits["shadow_unlearned"].numpy(), labels)
    m_orc = M.margins(logits["oracle_ref"].numpy(), labels)
    klom_values = M.klom(m_unl, m_orc)
    for s, summ in M.klom_summary(klom_values, splits).items():
        metrics[f"klom_p95/{s}"], metrics[f"klom_mean/{s}"] = summ["p95"], summ["mean"]
    for s, summ in M.noise_floor(M.margins(logits["oracles"].numpy(), labels), splits, seed=seed).items():
        metrics[f"noise_floor_p95/{s}"], metrics[f"noise_floor_mean/{s}"] = summ["p95"], summ["mean"]
    gap = M.output_gap(logits["candidate"].numpy(), logits["oracles"].numpy())
    for s in SPLITS:
        if (splits == s).any():
            metrics[f"output_gap/{s}"] = float(gap[splits == s].mean())
    metrics.update(membership_metrics(logits["candidate"].numpy(), logits["shadow_unlearned"].numpy(),
                                        logits["oracle_ref"].numpy(), labels, splits))
    metrics["coverage/forget"] = M.oracle_coverage(M.margins(logits["candidate"].numpy(), labels)[0][splits == "forget"],
                                                   M.margins(logits["oracles"].numpy(), labels)[:, splits == "forget"])
    metrics["n_oracles"] = float(oracles.n_models)
    metrics["n_shadows"] = float(shadows.n_models)
    verdict = evaluate_gate(objective, metrics, params.gate)
    cost["wall_seconds"] = time.perf_counter() - t0
    per_sample = pd.DataFrame({"sample_id": prepared.manifest["sample_id"].to_numpy()[eval_rows], "split": splits,
                               "klom": klom_values, "output_gap": gap,
                               "margin_unlearned_mean": m_unl.mean(0), "margin_oracle_mean": m_orc.mean(0)})
    forget_idx = np.flatnonzero(splits == "forget")
    worst = forget_idx[np.argsort(-np.nan_to_num(klom_values[forget_idx], nan=np.inf))[:4]]
    return CandidateOutcome(method=method, model=candidate.cpu(), metrics=metrics, verdict=verdict, cost=cost,
                            per_sample=per_sample,
                            worst={"unlearned": m_unl[:, worst], "oracle": m_orc[:, worst],
                                   "names": list(per_sample["sample_id"].to_numpy()[worst])})
