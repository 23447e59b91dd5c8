"""The work inside two stages of a deletion batch (tasks/stages.py runs them as Prefect tasks): partition of
the retain set, and the audit of an exact retrain against the oracles (unlearn_and_validate). Each takes its
config slice. The certifier itself is in the core (unlearning/certificate/acceptance.py)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from unlearning.seeds import method_seed
from unlearning.batch.rows import BatchRows, retain_rows, unlearn_context
from unlearning.config import Gate, Partition, method_traits
from unlearning.data.store import Prepared
from unlearning.methods import run_method
from unlearning.methods.base import TrainRecipe
from unlearning.models import Ensemble, predict_logits
from unlearning.batch.partition import partition_by_embedding, partition_by_group, partition_by_score
from unlearning.certificate.acceptance import CandidateOutcome, outcome_from_logits  # the certifier lives in the core


def partition_retain(cfg: Partition, prepared: Prepared, state_manifest: pd.DataFrame, forget_ids: list[str],
                     model: Ensemble, cross_leverage: np.ndarray | None = None) -> pd.DataFrame:
    """Adjacent/remote label per retained training row (docs/design.md §4.4); `cfg`: params.deletion.partition."""
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


def unlearn_and_validate(method: str, method_args: dict, gate: Gate, seed: int, progress: bool, prepared: Prepared,
                         rows: BatchRows, production: Ensemble, shadows: Ensemble, oracles: Ensemble,
                         recipe: TrainRecipe, objective: str, device: str) -> CandidateOutcome:
    """Run `method` on the production model and on the N shadow originals, then compare with the oracles
    (`retrain`: oracle member 0 against the others; `shadows` may be None, no shadow is needed):
    per-split accuracy, KLoM (shadow-unlearned vs oracle margins), output gap, MIA; then the gate.
    `gate`: params.gate; `seed`: base.seed; `progress`: base.progress (passed explicitly: Dask workers do not
    share the flow's process default)."""
    m_seed = method_seed(seed)  # the "method" role's stream (unlearning/seeds.py)
    t0 = time.perf_counter()
    accuracy_ref = oracles
    if method_traits(method).exact:
        # The oracles ARE exact retrains on R: promote member 0 and judge it only against oracles it was not
        # drawn from: its accuracy against the spread of members 1..N-1, KLoM as a permutation test of one half
        # of members 1..N-1 against the other (retrain vs retrain: the p-value is uniform, a rejection is a
        # false reject of the gate, and the gate's verdict says so).
        candidate = oracles.select(0)
        others = np.random.default_rng(seed).permutation(np.arange(1, oracles.n_models)).tolist()
        if len(others) >= 2:
            half = len(others) // 2
            shadow_unlearned, oracle_ref = oracles.select(others[:half]), oracles.select(others[half:])
            accuracy_ref = oracles.select(others)
        else:  # 2 oracles: nothing independent left to judge against
            shadow_unlearned, oracle_ref = oracles.select(0), oracles.select(1)
        cost = {"gradient_evals": 0, "steps": 0, "seconds": 0.0, "reused_oracle": True}
    else:
        on = progress
        res = run_method(method, unlearn_context(production.to(device), prepared, rows, recipe, m_seed,
                                                 progress=f"{method} (production)" if on else False), method_args)
        candidate = res.model
        shadow_res = run_method(method, unlearn_context(shadows.to(device), prepared, rows, recipe, m_seed,
                                                        progress=f"{method} (x{shadows.n_models} shadows)" if on
                                                        else False), method_args)
        shadow_unlearned, oracle_ref = shadow_res.model, oracles
        cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds,
                "shadow_gradient_evals": shadow_res.cost.gradient_evals, "shadow_seconds": shadow_res.cost.seconds}
    eval_rows, _ = rows.eval_rows()
    X = torch.as_tensor(prepared.X[eval_rows], dtype=torch.float32).to(device)  # once, on base.device
    logits = {name: predict_logits(m.to(device), X) for name, m in
              (("candidate", candidate), ("original", production), ("oracles", oracles),
               ("shadow_unlearned", shadow_unlearned), ("oracle_ref", oracle_ref), ("accuracy_ref", accuracy_ref))}
    return outcome_from_logits(method, candidate, logits, prepared, rows, gate, objective, seed, cost, t0,
                               n_shadows=shadows.n_models if shadows is not None else 0)
