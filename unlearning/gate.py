"""The promotion gate (DESIGN §4.5): validation metrics against declared per-objective thresholds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from unlearning.config import Gate


@dataclass
class Verdict:
    passed: bool
    objective: str
    failures: list[str] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "objective": self.objective, "failures": self.failures, "checks": self.checks}


def _check(checks: dict, failures: list, name: str, value: float, op: str, limit: float) -> None:
    ok = (not math.isnan(value)) and (value <= limit if op == "<=" else value >= limit)
    checks[name] = {"value": value, "op": op, "limit": limit, "passed": ok}
    if not ok:
        failures.append(f"{name} = {value:.4f} (needs {op} {limit})")


RETRAIN_DEFECT = ("gate defect: the candidate is an exact retrain (an oracle member judged against oracles it was "
                  "not drawn from), so this rejection is a false reject of the gate, not an unlearning failure")


def accuracy_interval(oracle_min: float, oracle_max: float, oracle_mean: float, n: int, z: float) -> tuple[float, float]:
    """[min, max] of the N oracle accuracies on a split, widened by z binomial standard errors of an n-sample
    accuracy: se = sqrt((pbar (1 - pbar) + 1 / (4 n)) / n) (the 1/(4n) term keeps the width > 0 at pbar = 0 or 1,
    where one flipped sample of a tiny split is still within the noise: n = 3 gives se = 0.17)."""
    se = math.sqrt((oracle_mean * (1 - oracle_mean) + 1 / (4 * n)) / n)
    return max(0.0, oracle_min - z * se), min(1.0, oracle_max + z * se)


def evaluate_gate(objective: str, metrics: dict[str, float], gate: Gate) -> Verdict:
    """`metrics` holds candidate accuracies `acc/<split>`, oracle mean accuracies `oracle_acc/<split>` and
    the original model's `original_acc/<split>`.

    retrain_equivalence checks, per split present:
      * `klom_pvalue/<split>` >= alpha: the permutation test of metrics/permutation.py (known false-reject
        rate <= alpha per split);
      * `acc/<split>` within `accuracy_interval` of the oracle accuracies (`oracle_acc_min/<split>`,
        `oracle_acc_max/<split>`, split size `n/<split>`), when those keys are given;
      * optional extra bounds: max_accuracy_gap, max_klom_p95_forget, max_klom_to_noise_floor (null = off).
    `candidate_is_retrain` = 1 marks exact retrain: a failure then also says it is a gate defect."""
    checks: dict[str, dict] = {}
    failures: list[str] = []
    if objective == "retrain_equivalence":
        g = gate.retrain_equivalence
        for split in ("forget", "adjacent", "remote", "validation"):
            acc = metrics.get(f"acc/{split}")
            if acc is None or math.isnan(acc):
                continue
            if f"oracle_acc_min/{split}" in metrics and f"n/{split}" in metrics:
                lo, hi = accuracy_interval(metrics[f"oracle_acc_min/{split}"], metrics[f"oracle_acc_max/{split}"],
                                           metrics[f"oracle_acc/{split}"], int(metrics[f"n/{split}"]), g.accuracy_z)
                ok = lo <= acc <= hi
                checks[f"acc/{split}"] = {"value": acc, "op": "in", "limit": [round(lo, 6), round(hi, 6)], "passed": ok}
                if not ok:
                    failures.append(f"acc/{split} = {acc:.4f} (needs within the oracles' accuracy range "
                                    f"[{lo:.4f}, {hi:.4f}], n = {int(metrics[f'n/{split}'])})")
            if g.max_accuracy_gap is not None:
                gap = abs(acc - metrics[f"oracle_acc/{split}"])
                _check(checks, failures, f"accuracy_gap/{split}", gap, "<=", g.max_accuracy_gap)
            if f"klom_pvalue/{split}" in metrics:
                _check(checks, failures, f"klom_pvalue/{split}", metrics[f"klom_pvalue/{split}"], ">=", g.alpha)
        if g.min_validation_accuracy is not None:
            _check(checks, failures, "acc/validation_min", metrics["acc/validation"], ">=", g.min_validation_accuracy)
        if g.max_klom_p95_forget is not None and "klom_p95/forget" in metrics:
            _check(checks, failures, "klom_p95/forget", metrics["klom_p95/forget"], "<=", g.max_klom_p95_forget)
        if g.max_klom_to_noise_floor is not None:
            # Optional extra bound over the same-size floor (median of the permutation null).
            for split in ("forget", "adjacent", "remote", "validation"):
                floor = metrics.get(f"noise_floor_p95/{split}")
                if floor is not None and f"klom_p95/{split}" in metrics and not math.isnan(floor):
                    _check(checks, failures, f"klom_p95/{split}", metrics[f"klom_p95/{split}"], "<=",
                           round(g.max_klom_to_noise_floor * floor, 6))
        if failures and metrics.get("candidate_is_retrain"):
            failures.append(RETRAIN_DEFECT)
    elif objective == "suppression":
        g = gate.suppression
        _check(checks, failures, "acc/forget", metrics["acc/forget"], "<=", g.max_forget_accuracy)
        if not math.isnan(metrics.get("acc/adjacent", float("nan"))):
            retention = metrics["acc/adjacent"] / max(metrics["original_acc/adjacent"], 1e-12)
            _check(checks, failures, "adjacent_retention", retention, ">=", g.min_adjacent_retention)
        if g.min_validation_accuracy is not None:
            _check(checks, failures, "acc/validation", metrics["acc/validation"], ">=", g.min_validation_accuracy)
    else:
        raise ValueError(f"objective {objective!r} is not known; allowed: ['retrain_equivalence', 'suppression']")
    return Verdict(passed=not failures, objective=objective, failures=failures, checks=checks)
