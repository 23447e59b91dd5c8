"""Which unlearners a batch tries, in order (docs/design.md §4.5).

`deletion.method` names one method, or `auto` to walk the ordered rule list `deletion.rules`
(unlearning/policy/selection_policy.py) over the batch's facts: objective, partition, leverage diagnostics, oracle noise
floor and compute budget. `deletion.fallback` follows; exact `retrain` is always the last candidate.
"""

from __future__ import annotations

import numpy as np
import torch

from unlearning.batch.rows import BatchRows
from unlearning.config import AUTO, ConfigError, Deletion
from unlearning.batch.records import Selection


def _mean_kl_to_mean(logits: torch.Tensor) -> float:
    """Oracle noise floor in output space: mean over members and samples of KL(oracle_k || oracle mean),
    logits [N, n, C]. A method cannot be told apart from retraining below this."""
    logp = torch.log_softmax(logits.double(), -1)  # [N, n, C]
    log_mean = torch.logsumexp(logp, 0) - np.log(logp.shape[0])  # [n, C]
    return float((logp.exp() * (logp - log_mean)).sum(-1).mean())


def noise_floor(oracle_forget_logits: torch.Tensor, oracle_floor_logits: torch.Tensor | None = None) -> float:
    """The oracles' noise on the forget rows, floored by their noise on a same-size sample of validation rows.

    On well-learned (low self-leverage) forget rows every retrain agrees, so their spread, and any predicted gap
    read in its units, loses its scale: a predicted gap of 6e-6 read as 5.4 times its noise there. Validation
    rows are held out from the oracles exactly as the forget rows are, so their spread is the noise a held-out
    row of that size shows: the forget rows' noise is not allowed below it. Logits [N, n, C]."""
    noise = _mean_kl_to_mean(oracle_forget_logits)
    if oracle_floor_logits is not None and oracle_floor_logits.shape[0] >= 2 and oracle_floor_logits.shape[1]:
        noise = max(noise, _mean_kl_to_mean(oracle_floor_logits))
    return noise


def batch_facts(deletion: Deletion, epochs: int, objective: str, rows: BatchRows, report=None,
                oracle_forget_logits: torch.Tensor | None = None, device: str = "cpu",
                oracle_floor_logits: torch.Tensor | None = None, sharded: bool = False) -> dict:
    """The facts the selection rules test (names: unlearning.policy.selection_policy.FACTS). Facts that need the leverage
    report are absent without it, so the rules that use them are skipped with a reason; so are the facts that
    need oracles (the noise floor), when the batch trains none.
    `deletion`: params.deletion (the budget); `epochs`: train.epochs (a retrain's cost in passes);
    `oracle_floor_logits`: the oracles on a same-size sample of validation rows (`noise_floor`); `sharded`: the
    original was trained in shards (train.sharding; the `sharded_original` rule picks `sisa`)."""
    n_forget, n_retain = len(rows.forget), len(rows.retain)
    retrain_cost = n_retain * epochs
    facts = {"objective": objective, "n_forget": n_forget, "n_retain": n_retain,
             "forget_fraction": n_forget / max(n_forget + n_retain, 1),
             "adjacent_fraction": float(rows.adjacent_mask.mean()) if n_retain else 0.0,
             "retrain_cost": retrain_cost, "budget": deletion.budget_gradient_evals,
             "retrain_cost_lt_budget": retrain_cost < deletion.budget_gradient_evals,
             "has_gpu": device == "cuda", "sharded": bool(sharded)}
    if oracle_forget_logits is not None and oracle_forget_logits.shape[0] >= 2:
        facts["noise_floor"] = noise_floor(oracle_forget_logits, oracle_floor_logits)
    if report is not None:
        # The report's gap is the Fisher norm of the predicted output change; KL ~ 0.5 * Fisher norm^2 for
        # small changes, which puts it in the units of the noise floor above.
        facts["predicted_gap"] = float(np.mean(0.5 * np.square(report.predicted_gap_forget)))
        facts["leakage_ratio"] = float(report.leakage_ratio)
        facts["self_leverage_trace"] = float(report.self_leverage_trace)
        facts["self_leverage_norm"] = float(report.self_leverage_spectral_norm)
        retain_gap = float(np.mean(0.5 * np.square(report.predicted_gap_retain))) if report.predicted_gap_retain.size else 0.0
        if "noise_floor" in facts:
            facts["predicted_gap_lt_noise_floor"] = facts["predicted_gap"] < facts["noise_floor"]
            # Gaps relative to their own noise (gate calibration): the raw leakage ratio ||C_RF g_F|| / ||S_F g_F|| is a
            # ratio of two norms that both vanish on low-leverage sets (66 there, where newton_ggn was worst);
            # these read each predicted gap in units of the oracle noise floor, so they cannot fire on noise.
            noise = max(facts["noise_floor"], 1e-12)
            facts["predicted_gap_to_noise"] = facts["predicted_gap"] / noise
            facts["retain_gap_to_noise"] = retain_gap / noise
    return facts


def check_method_config(deletion: Deletion) -> None:
    """Every method params.deletion names, checked against the registry before a batch trains anything (its
    oracles take minutes): `deletion.method`, `deletion.fallback`, each rule's `method`, and
    `deletion.method_args` (a registered name each, with arguments its args model accepts). Raises ConfigError
    naming the key, the value and the allowed values. (params.yaml's own validation cannot do it: the registry
    is filled by importing the methods, which needs torch, and a bad params key must answer before that.)"""
    from unlearning.methods import REGISTRY
    from unlearning.methods.registry import parse_args

    allowed = sorted(REGISTRY)
    named = [("deletion.method", deletion.method), *[(f"deletion.fallback[{i}]", m) for i, m in
                                                     enumerate(deletion.fallback)],
             *[(f"deletion.rules[{i}].method (rule {r.name!r})", r.method) for i, r in enumerate(deletion.rules)]]
    for key, name in named:
        if name not in REGISTRY and not (key == "deletion.method" and deletion.walks_rules):
            extra = f" or {AUTO!r}" if key == "deletion.method" else ""
            raise ConfigError(f"{key} = {name!r} is not a registered method; allowed: {allowed}{extra} "
                              f"(`unlearn methods` lists them)")
    for name, args in deletion.method_args.items():
        if name not in REGISTRY:
            raise ConfigError(f"deletion.method_args has arguments for {name!r}, which is not a registered method; "
                              f"allowed: {allowed}")
        try:
            parse_args(name, args)
        except ValueError as e:
            raise ConfigError(f"deletion.method_args.{name}: {e}") from None


def candidate_methods(deletion: Deletion, facts: dict) -> Selection:
    """The ordered candidate list for `deletion` (params.deletion) over the batch's facts."""
    from unlearning.methods import REGISTRY

    d = deletion
    check_method_config(d)  # also for callers that did not check first (the benches)
    fired, skipped = [], []
    from unlearning.policy.selection_policy import nearest_miss, retrain_last

    if d.walks_rules:
        from unlearning.policy.selection_policy import select_methods

        sel = select_methods(d.rules, facts, known_methods=REGISTRY)
        first, fired, skipped = list(sel.candidates), list(sel.fired), list(sel.skipped)
    else:
        first = [d.method]
        fired = [("explicit", f"deletion.method = {d.method!r}")]
    ordered = retrain_last([*first, *d.fallback])
    miss = nearest_miss(d.rules, facts, ordered) if d.walks_rules else None
    return Selection(ordered, fired, skipped, facts, {r.name: r.method for r in d.rules}, miss,
                     explicit=not d.walks_rules)


def selection_with_debt(deletion: Deletion, facts: dict, ledger, n_train: int,
                        n_forget: int) -> tuple[Selection, dict, list[str]]:
    """The batch's candidates (`candidate_methods`), overridden by the retraining debt (`deletion.debt`): exact
    retrain alone when it is due. Returns (selection, debt, the reasons the debt forced a retrain)."""
    from unlearning.policy.history import debt_reasons, force_retrain, retraining_debt

    selection = candidate_methods(deletion, facts)
    debt = retraining_debt(ledger, n_train)
    forced = debt_reasons(debt, n_forget, deletion.debt.max_forgotten_fraction,
                          deletion.debt.max_batches_since_retrain)
    return (force_retrain(selection, forced) if forced else selection), debt, forced
