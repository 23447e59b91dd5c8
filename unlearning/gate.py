"""The promotion gate (docs/design.md §4.5): validation metrics against declared per-objective thresholds."""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field

from unlearning import metric_keys as K
from unlearning.config import Gate
from unlearning.resolution import smallest_klom_pvalue  # noqa: F401  (re-exported)
from unlearning.metrics.summary import SPLITS


@dataclass(frozen=True)
class Verdict:
    """The gate's verdict on one candidate: passed, and each check (`checks`: name -> value, op, limit, passed;
    a check's name is `<metric>/<split>` or a floor's own name, e.g. `acc/validation_drop`)."""

    passed: bool
    objective: str
    failures: list[str] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)

    def checks_of(self, split: str) -> dict[str, dict]:
        """The checks that judge `split` (the validation floors judge the validation split)."""
        return {name: c for name, c in self.checks.items()
                if name.endswith(f"/{split}") or (split == "validation" and name.startswith("acc/validation"))}

    def passed_for(self, split: str) -> bool:
        """Every check of `split` passed (a split no check judges passes)."""
        return all(c.get("passed", True) for c in self.checks_of(split).values())

    def with_checks(self, checks: dict[str, dict], failures: list[str]) -> "Verdict":
        """This verdict with more checks (e.g. qualified mode's cheap checks): passed only if they pass too."""
        return Verdict(self.passed and not failures, self.objective, [*self.failures, *failures],
                       {**self.checks, **checks})

    def to_dict(self) -> dict:
        return {"passed": self.passed, "objective": self.objective, "failures": self.failures, "checks": self.checks}


def _side(a: float, b: float) -> int:
    return (a > b) - (a < b)


def format_beside(value: float, bound: float, text: str | None = None) -> str:
    """`value` as printed next to `bound`: `text` (default: 4 decimals), with as many more decimals as it takes
    for the printed number to lie on the same side of `bound` as the value itself. A p-value of 2/201 =
    0.00995 below alpha = 0.01 reads 0.00995, never "0.0100 (needs >= 0.01)"."""
    text = f"{value:.4f}" if text is None else text
    if not (isinstance(value, (int, float)) and isinstance(bound, (int, float))
            and math.isfinite(value) and math.isfinite(bound)):
        return text
    decimals = 4
    while _side(float(text), bound) != _side(value, bound) and decimals < 17:
        decimals += 1
        text = f"{value:.{decimals}f}"
    return text if _side(float(text), bound) == _side(value, bound) else repr(float(value))


def _check(checks: dict, failures: list, name: str, value: float | None, op: str, limit: float,
           missing: str = "") -> None:
    """One bound. A value that is missing (None) or NaN never passes: the failure says which."""
    value = float("nan") if value is None else value
    ok = (not math.isnan(value)) and (value <= limit if op == "<=" else value >= limit)
    checks[name] = {"value": value, "op": op, "limit": limit, "passed": ok}
    if not ok:
        failures.append(f"{name} = {format_beside(value, limit)} (needs {op} {limit})" + (
            f"; {missing}" if missing and math.isnan(value) else ""))


NO_VALIDATION = "not measured: the dataset has no validation rows to measure it on (set the floor to null, or add a 'val' split)"
NO_FORGET = "not measured: the batch has no forget rows"


ACC_TOLERANCE = 1e-9  # accuracies are k/n: far coarser than this

RETRAIN_DEFECT = ("gate defect: the candidate is an exact retrain (an oracle member judged against oracles it was "
                  "not drawn from), so this rejection is a false reject of the gate, not an unlearning failure")


def accuracy_interval(oracle_min: float, oracle_max: float, oracle_mean: float, n: int, z: float,
                      oracle_std: float | None = None, n_oracles: int | None = None) -> tuple[float, float]:
    """Where the accuracy of one more exact retrain falls, from N oracle accuracies on an n-sample split.

    The larger of two intervals, then widened by z binomial standard errors of an n-sample accuracy,
    se = sqrt((pbar (1 - pbar) + 1 / (4 n)) / n) (the 1/(4n) term keeps the width > 0 at pbar = 0 or 1):
    - [min, max] of the N oracles: a new retrain falls outside it with probability 2 / (N + 1), which is
      small at N = 80 but 0.4 at N = 4;
    - the normal-theory prediction interval mean +- t_{N-1} s sqrt(1 + 1/N) (s: the oracles' standard
      deviation, ddof 1; t at the two-sided level of z), which is right at small N.
    With `oracle_std`/`n_oracles` absent only the first is used."""
    lo, hi = oracle_min, oracle_max
    if oracle_std is not None and n_oracles is not None and n_oracles >= 2:
        s = oracle_std * math.sqrt(n_oracles / (n_oracles - 1))  # the population std given -> ddof 1
        # (for z beyond ~8 the normal CDF rounds to 1.0 in float64: such a z asks for the whole range)
        level = min(_normal_cdf(z), 1 - 1e-12)
        half = student_t_quantile(level, n_oracles - 1) * s * math.sqrt(1 + 1 / n_oracles)
        lo, hi = min(lo, oracle_mean - half), max(hi, oracle_mean + half)
    se = math.sqrt((oracle_mean * (1 - oracle_mean) + 1 / (4 * n)) / n)
    return max(0.0, lo - z * se), min(1.0, hi + z * se)


def _normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


@lru_cache(maxsize=256)
def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (p >= 0.5) of Student's t with `df` degrees of freedom: bisection on the CDF, which is
    0.5 + the integral of the density from 0 (Simpson's rule on the substitution x = tan u, which keeps the
    heavy tails of df = 1, 2 finite). Accurate to ~1e-6; the core has no scipy."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p = {p} must be in [0.5, 1)")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float) -> float:
        top, m = math.atan(t), 400  # integrate pdf(tan u) / cos(u)^2 over u in [0, atan t]
        f = lambda u: c * (1 + math.tan(u) ** 2 / df) ** (-(df + 1) / 2) / math.cos(u) ** 2  # noqa: E731
        h = top / m
        total = f(0) + f(top) + sum((4 if k % 2 else 2) * f(k * h) for k in range(1, m))
        return 0.5 + total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:  # bracket first: df = 1 at p = 0.99997 is past 1e4
        lo, hi = hi, hi * 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def criterion_line(gate: Gate) -> str:
    """What retrain_equivalence asks, in one line (`unlearn plan`): the difference test and its alpha, or the
    epsilon budget with its delta, quantile and estimator."""
    if gate.criterion == "epsilon":
        e = gate.epsilon
        return (f"gate criterion: epsilon: accepted when the {e.quantile:g}-quantile of each split's per-row epsilon "
                f"upper bound is <= {e.max:g} (delta {e.delta:g}, {e.estimator} estimator), rejected early when its "
                f"lower bound exceeds it")
    return (f"gate criterion: difference: accepted when no split's KLoM permutation p-value is below alpha "
            f"{gate.retrain_equivalence.alpha:g} (gate.criterion: epsilon asks for a budget instead)")


def _pvalue_text(p: float, alpha: float) -> str:
    return format_beside(p, alpha, f"{p:.3f}")


def verdict_summary(verdict: Verdict, metrics: dict[str, float], alpha: float) -> str:
    """The verdict in one line, naming what was gated: retrain_equivalence by the KLoM permutation p-values
    (against alpha), suppression by its absolute bounds (KLoM is not gated there, so it is not quoted)."""
    outcome = "passed" if verdict.passed else "failed: " + "; ".join(verdict.failures)
    bounds = {name.split("/", 1)[1]: c for name, c in verdict.checks.items() if name.startswith("epsilon_upper/")}
    if verdict.objective == "retrain_equivalence" and bounds:
        eps = ", ".join(f"{s} {c['value']:.3g}" for s, c in bounds.items())
        return f"gate {outcome} (epsilon upper bounds: {eps}; budget {next(iter(bounds.values()))['limit']})"
    if verdict.objective == "retrain_equivalence" and any(k.startswith("klom_pvalue/") for k in metrics):
        pvals = ", ".join(f"{s} {_pvalue_text(metrics[K.key('klom_pvalue', s)], alpha)}" for s in SPLITS
                          if K.key("klom_pvalue", s) in metrics)
        return f"gate {outcome} (KLoM permutation p-values: {pvals}; alpha {alpha})"
    bounds = ", ".join(f"{name} {c['value']:.3f} {c['op']} {c['limit']}" for name, c in verdict.checks.items())
    what = ("no reference models, checked against the original" if verdict.objective == "retrain_equivalence"
            else f"{verdict.objective} checks")
    return f"gate {outcome} ({what}: {bounds or 'no check applies'})"


# The checks that compare a candidate with the oracles statistically: an exact retrain fails them only by
# chance (at the measured false-reject rate). The absolute bounds (floors, gaps, KLoM caps) are business rules.
STATISTICAL_CHECKS = ("klom_pvalue/", "epsilon_upper/", "acc/forget", "acc/adjacent", "acc/remote", "acc/validation")


def only_statistical_failures(verdict: "Verdict") -> bool:
    """True when the verdict failed, and only on statistical checks (see STATISTICAL_CHECKS). Only the
    retrain_equivalence gate has such checks: every suppression check is an absolute bound (its `acc/forget`
    is `max_forget_accuracy`, its `acc/validation` the floor), whatever the names share."""
    if verdict.objective != "retrain_equivalence":
        return False
    return _failed_statistical_checks_only(verdict.checks)


def _failed_statistical_checks_only(checks: dict) -> bool:
    failed = [name for name, c in checks.items() if not c["passed"]]
    return bool(failed) and all(name.startswith(("klom_pvalue/", "epsilon_upper/")) or name in STATISTICAL_CHECKS
                                for name in failed)


def _validation_floors(checks: dict, failures: list, g, metrics: dict[str, float], absolute_name: str) -> None:
    """The validation-accuracy floors of a gate section `g`: relative to the original (`max_validation_drop`:
    at least the original's accuracy minus it, check `acc/validation_drop`) and absolute
    (`min_validation_accuracy`, check `absolute_name`). Both are business rules: they bind an exact retrain too.
    They compare the validation rows the batch does not entangle (`acc/validation_remote`: unlearning/quality.py
    entangled_accuracies) where it has any: a batch that erases a class loses that class's validation rows by
    construction, a drop reported with the run, never a reason to keep serving the rows (docs/erasure.md)."""
    split = "validation_remote" if "original_acc/validation_remote" in metrics else "validation"
    if g.max_validation_drop is not None and f"original_acc/{split}" in metrics:
        floor = round(metrics[f"original_acc/{split}"] - g.max_validation_drop, 6)
        _check(checks, failures, "acc/validation_drop", metrics.get(f"acc/{split}"), ">=", floor,
               NO_VALIDATION)
        if split != "validation":
            checks["acc/validation_drop"]["rows"] = split  # the words say which rows (batch_summary.check_in_words)
    if g.min_validation_accuracy is not None:
        _check(checks, failures, absolute_name, metrics.get(f"acc/{split}"), ">=", g.min_validation_accuracy,
               NO_VALIDATION)
        if split != "validation":
            checks[absolute_name]["rows"] = split


def evaluate_gate(objective: str, metrics: dict[str, float], gate: Gate) -> Verdict:
    """`metrics` holds candidate accuracies `acc/<split>`, oracle mean accuracies `oracle_acc/<split>` and
    the original model's `original_acc/<split>`.

    retrain_equivalence checks, per split present:
      * `klom_pvalue/<split>` >= alpha: the permutation test of metrics/permutation.py (known false-reject
        rate <= alpha per split);
      * `acc/<split>` within `accuracy_interval` of the oracle accuracies (`oracle_acc_min/<split>`,
        `oracle_acc_max/<split>`, split size `n/<split>`), when those keys are given;
      * optional extra bounds: max_accuracy_gap, max_klom_p95_forget, max_klom_to_noise_floor (null = off).
    Under `gate.criterion: epsilon` the KLoM p-value and the accuracy interval give way to
    `epsilon_upper/<split>` <= `gate.epsilon.max` (unlearning/metrics/epsilon.py); floors and extra bounds stay.
    `candidate_is_retrain` = 1 marks exact retrain: a failure of statistical checks only then also says it is a
    gate defect."""
    checks: dict[str, dict] = {}
    failures: list[str] = []
    if objective == "retrain_equivalence":
        g = gate.retrain_equivalence
        by_epsilon = gate.criterion == "epsilon"
        for split in SPLITS:
            acc = metrics.get(K.key("acc", split))
            if acc is None or math.isnan(acc):
                continue
            if by_epsilon:
                # the equivalence question replaces both difference tests (KLoM p-value, accuracy interval): the
                # split's epsilon upper bound (the quantile over its rows) within the budget; compared with
                # references (a KLoM p-value) but without an epsilon, nothing measured passes
                if K.key("epsilon_upper", split) in metrics or K.key("klom_pvalue", split) in metrics:
                    _check(checks, failures, K.key("epsilon_upper", split), metrics.get(K.key("epsilon_upper", split)), "<=",
                           gate.epsilon.max, "not measured: the certificate computed no epsilon for this split")
            elif K.key("oracle_acc_min", split) in metrics and K.key("n", split) in metrics:
                lo, hi = accuracy_interval(metrics[K.key("oracle_acc_min", split)], metrics[K.key("oracle_acc_max", split)],
                                           metrics[K.key("oracle_acc", split)], int(metrics[K.key("n", split)]), g.accuracy_z,
                                           metrics.get(K.key("oracle_acc_std", split)),
                                           int(metrics[K.key("oracle_n", split)]) if K.key("oracle_n", split) in metrics else None)
                # a tolerance of float rounding: with N identical oracles at 1.0 on 3 rows, lo is
                # 0.6666666666666667 and an accuracy of 2/3, printed as the bound itself, failed it
                ok = lo - ACC_TOLERANCE <= acc <= hi + ACC_TOLERANCE
                checks[K.key("acc", split)] = {"value": acc, "op": "in", "limit": [round(lo, 6), round(hi, 6)], "passed": ok}
                if not ok:
                    failures.append(f"acc/{split} = {acc:.4f} (needs within the oracles' accuracy range "
                                    f"[{lo:.4f}, {hi:.4f}], n = {int(metrics[K.key('n', split)])})")
            if g.max_accuracy_gap is not None:
                gap = abs(acc - metrics[K.key("oracle_acc", split)])
                _check(checks, failures, K.key("accuracy_gap", split), gap, "<=", g.max_accuracy_gap)
            if K.key("klom_pvalue", split) in metrics and not by_epsilon:
                _check(checks, failures, K.key("klom_pvalue", split), metrics[K.key("klom_pvalue", split)], ">=", g.alpha)
        _validation_floors(checks, failures, g, metrics, "acc/validation_min")
        if g.max_klom_p95_forget is not None and "klom_p95/forget" in metrics:
            _check(checks, failures, "klom_p95/forget", metrics["klom_p95/forget"], "<=", g.max_klom_p95_forget)
        if g.max_klom_to_noise_floor is not None:
            # Optional extra bound over the same-size floor (median of the permutation null).
            for split in SPLITS:
                floor = metrics.get(K.key("noise_floor_p95", split))
                if floor is not None and K.key("klom_p95", split) in metrics and not math.isnan(floor):
                    _check(checks, failures, K.key("klom_p95", split), metrics[K.key("klom_p95", split)], "<=",
                           round(g.max_klom_to_noise_floor * floor, 6))
        # an absolute floor (acc/validation_min, a KLoM P95 bound) binds a retrain too: only a failure of the
        # statistical checks alone is the gate's false reject
        if failures and metrics.get("candidate_is_retrain") and _failed_statistical_checks_only(checks):
            failures.append(RETRAIN_DEFECT)
    elif objective == "suppression":
        g = gate.suppression
        _check(checks, failures, "acc/forget", metrics.get("acc/forget"), "<=", g.max_forget_accuracy, NO_FORGET)
        adjacent, original = metrics.get("acc/adjacent", float("nan")), metrics.get("original_acc/adjacent")
        if not math.isnan(adjacent):
            retention = float("nan") if original is None else adjacent / max(original, 1e-12)
            _check(checks, failures, "adjacent_retention", retention, ">=", g.min_adjacent_retention,
                   "not measured: the original model's adjacent accuracy (original_acc/adjacent) is missing")
        _validation_floors(checks, failures, g, metrics, "acc/validation")
    else:
        raise ValueError(f"objective {objective!r} is not known; allowed: ['retrain_equivalence', 'suppression']")
    return Verdict(passed=not failures, objective=objective, failures=failures, checks=checks)
