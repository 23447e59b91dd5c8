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


def evaluate_gate(objective: str, metrics: dict[str, float], gate: Gate) -> Verdict:
    """`metrics` holds candidate accuracies `acc/<split>`, oracle mean accuracies `oracle_acc/<split>` and
    the original model's `original_acc/<split>`; optional KLoM keys are checked when thresholds are set."""
    checks: dict[str, dict] = {}
    failures: list[str] = []
    if objective == "retrain_equivalence":
        g = gate.retrain_equivalence
        for split in ("forget", "adjacent", "remote", "validation"):
            if f"acc/{split}" in metrics and not math.isnan(metrics[f"acc/{split}"]):
                gap = abs(metrics[f"acc/{split}"] - metrics[f"oracle_acc/{split}"])
                _check(checks, failures, f"accuracy_gap/{split}", gap, "<=", g.max_accuracy_gap)
        if g.min_validation_accuracy is not None:
            _check(checks, failures, "acc/validation", metrics["acc/validation"], ">=", g.min_validation_accuracy)
        if g.max_klom_p95_forget is not None and "klom_p95/forget" in metrics:
            _check(checks, failures, "klom_p95/forget", metrics["klom_p95/forget"], "<=", g.max_klom_p95_forget)
        if g.max_klom_to_noise_floor is not None:
            # Indistinguishable from retraining = shadow-unlearned vs oracle margins no further apart than
            # oracle vs oracle (DESIGN §4.2 noise floor), up to the declared factor.
            for split in ("forget", "adjacent", "remote", "validation"):
                floor = metrics.get(f"noise_floor_p95/{split}")
                if floor is not None and f"klom_p95/{split}" in metrics and not math.isnan(floor):
                    _check(checks, failures, f"klom_p95/{split}", metrics[f"klom_p95/{split}"], "<=",
                           round(g.max_klom_to_noise_floor * floor, 6))
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
