"""The promotion gate (docs/design.md §4.5): the certificate's per-split measurements against declared
per-objective thresholds.

Its input is typed (`SplitMeasures`, one per split, built by unlearning/certificate/equivalence.py and
unlearning/certificate/acceptance.py); whether the candidate is exact is an argument (the method's traits); each check says
whether it is statistical (a comparison with retrains that an exact retrain fails only by chance) or a business
rule (a floor, a cap: it binds an exact retrain too). Metric names are made only where these records become
MLflow metrics (unlearning/certificate/metric_keys.py). Torch-free: `unlearn status`, the planner and the qualification read
it without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Mapping

from unlearning.certificate import metric_keys as K
from unlearning.config import Gate
from unlearning.batch.records import ItemAccess
from unlearning.certificate.resolution import smallest_klom_pvalue  # noqa: F401  (re-exported)
from unlearning.stats import SPLITS, normal_cdf, student_t_quantile

if TYPE_CHECKING:  # the epsilon record is made by the metrics, which import torch
    from unlearning.metrics.epsilon import BatchEpsilon

STATISTICAL = "statistical"  # a comparison with retrains: an exact retrain fails it only by chance
BUSINESS = "business"  # a floor or a cap the declared objective sets: it binds an exact retrain too


@dataclass(frozen=True)
class Check(ItemAccess):
    """One bound the gate applied: the value, how it was compared (`<=`, `>=`, `in` an interval), the limit,
    whether it passed, and its kind (STATISTICAL or BUSINESS). Read-only item access (`check["passed"]`) serves
    the readers of its JSON form."""

    value: float
    op: str
    limit: float | list
    passed: bool
    kind: str = BUSINESS
    rows: str | None = None  # a subset of the split compared (validation_remote), None: the whole split


@dataclass(frozen=True)
class OracleAccuracy:
    """The accuracies of the reference oracles on one split: members the candidate was not drawn from."""

    mean: float
    std: float
    min: float
    max: float
    n: int


@dataclass(frozen=True)
class SplitMeasures:
    """What was measured on one split, the gate's input: the candidate's accuracy and the split's size, the
    original's accuracy, and what the certificate compared with the references (None: not measured, e.g. a
    candidate judged without references): the shadow-unlearned models' accuracy, the oracles' spread, the KLoM
    P95 and mean with the permutation test's p-value and its same-size floor (median and P95 of the null), and
    the split's epsilon under `gate.criterion: epsilon`."""

    split: str
    acc: float
    n: int | None = None
    original_acc: float | None = None
    shadow_acc: float | None = None
    oracle: OracleAccuracy | None = None
    klom_p95: float | None = None
    klom_mean: float | None = None
    pvalue: float | None = None
    floor: float | None = None
    floor_null_p95: float | None = None
    epsilon: "BatchEpsilon | None" = None

    def with_original(self, original_acc: float | None) -> "SplitMeasures":
        return replace(self, original_acc=original_acc)


def by_split(measures: "Iterable[SplitMeasures] | Mapping[str, SplitMeasures]") -> dict[str, SplitMeasures]:
    """{split: measures}, in SPLITS order, from a sequence of records or a mapping of them."""
    items = measures.values() if isinstance(measures, Mapping) else measures
    got = {m.split: m for m in items}
    return {s: got[s] for s in [*SPLITS, *sorted(set(got) - set(SPLITS))] if s in got}


@dataclass(frozen=True)
class Verdict:
    """The gate's verdict on one candidate: passed, and each check (`checks`: name -> Check; a check's name is
    `<metric>/<split>` or a floor's own name, e.g. `acc/validation_drop`)."""

    passed: bool
    objective: str
    failures: list[str] = field(default_factory=list)
    checks: dict[str, Check] = field(default_factory=dict)

    def checks_of(self, split: str) -> dict[str, Check]:
        """The checks that judge `split` (the validation floors judge the validation split)."""
        return {name: c for name, c in self.checks.items()
                if name.endswith(f"/{split}") or (split == "validation" and name.startswith("acc/validation"))}

    def passed_for(self, split: str) -> bool:
        """Every check of `split` passed (a split no check judges passes)."""
        return all(c.passed for c in self.checks_of(split).values())

    def failed_on_statistics_only(self) -> bool:
        """It failed, and only statistical checks failed: for an exact retrain, a false reject of the gate
        (gate.exact_retrain_overrides), since it IS a retrain; a business rule it misses still rejects it."""
        failed = [c for c in self.checks.values() if not c.passed]
        return bool(failed) and all(c.kind == STATISTICAL for c in failed)

    def with_checks(self, checks: dict[str, Check], failures: list[str]) -> "Verdict":
        """This verdict with more checks (e.g. qualified mode's cheap checks): passed only if they pass too."""
        return Verdict(self.passed and not failures, self.objective, [*self.failures, *failures],
                       {**self.checks, **checks})

    def to_dict(self) -> dict:
        return {"passed": self.passed, "objective": self.objective, "failures": list(self.failures),
                "checks": {name: c.to_dict() for name, c in self.checks.items()}}


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
           missing: str = "", kind: str = BUSINESS, rows: str | None = None) -> None:
    """One bound. A value that is missing (None) or NaN never passes: the failure says which. `rows`: the subset
    of the split it compared, when not the whole split (the words say which: batch_summary.check_in_words)."""
    value = float("nan") if value is None else value
    ok = (not math.isnan(value)) and (value <= limit if op == "<=" else value >= limit)
    checks[name] = Check(value, op, limit, ok, kind, rows)
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
        level = min(normal_cdf(z), 1 - 1e-12)
        half = student_t_quantile(level, n_oracles - 1) * s * math.sqrt(1 + 1 / n_oracles)
        lo, hi = min(lo, oracle_mean - half), max(hi, oracle_mean + half)
    se = math.sqrt((oracle_mean * (1 - oracle_mean) + 1 / (4 * n)) / n)
    return max(0.0, lo - z * se), min(1.0, hi + z * se)


def criterion_line(gate: Gate) -> str:
    """What retrain_equivalence asks, in one line (`unlearn plan`): the difference test and its alpha, or the
    epsilon budget with its delta, aggregate and estimator."""
    if gate.criterion == "epsilon":
        e = gate.epsilon
        what = (f"the {e.quantile:g}-quantile of each split's per-row epsilon upper bounds" if e.aggregate == "quantile"
                else f"the upper bound of each split's mean epsilon (rows capped at {e.row_cap:g}, joint bootstrap)")
        return (f"gate criterion: epsilon: accepted when {what} is <= {e.max:g} (delta {e.delta:g}, {e.estimator} "
                f"estimator), rejected early when its bias-corrected lower bound exceeds it")
    return (f"gate criterion: difference: accepted when no split's KLoM permutation p-value is below alpha "
            f"{gate.retrain_equivalence.alpha:g} (gate.criterion: epsilon asks for a budget instead)")


def _pvalue_text(p: float, alpha: float) -> str:
    return format_beside(p, alpha, f"{p:.3f}")


def verdict_summary(verdict: Verdict, alpha: float) -> str:
    """The verdict in one line, naming what was gated: retrain_equivalence by the epsilon upper bounds or the
    KLoM permutation p-values (against alpha), suppression by its absolute bounds."""
    outcome = "passed" if verdict.passed else "failed: " + "; ".join(verdict.failures)
    of = lambda name: {n.split("/", 1)[1]: c for n, c in verdict.checks.items() if n.startswith(f"{name}/")}  # noqa: E731
    bounds, which = of("epsilon_upper"), "upper"
    if not bounds:  # an interim look's verdict tests the lower bounds
        bounds, which = of("epsilon_lower"), "lower"
    pvalues = of("klom_pvalue")
    if verdict.objective == "retrain_equivalence" and bounds:
        eps = ", ".join(f"{s} {c.value:.3g}" for s, c in bounds.items())
        return f"gate {outcome} (epsilon {which} bounds: {eps}; budget {next(iter(bounds.values())).limit})"
    if verdict.objective == "retrain_equivalence" and pvalues:
        pvals = ", ".join(f"{s} {_pvalue_text(c.value, alpha)}" for s, c in pvalues.items())
        return f"gate {outcome} (KLoM permutation p-values: {pvals}; alpha {alpha})"
    listed = ", ".join(f"{name} {c.value:.3f} {c.op} {c.limit}" for name, c in verdict.checks.items())
    what = ("no reference models, checked against the original" if verdict.objective == "retrain_equivalence"
            else f"{verdict.objective} checks")
    return f"gate {outcome} ({what}: {listed or 'no check applies'})"


def _validation_floors(checks: dict, failures: list, g, validation: SplitMeasures | None,
                       absolute_name: str) -> None:
    """The validation-accuracy floors of a gate section `g`: relative to the original (`max_validation_drop`:
    at least the original's accuracy minus it, check `acc/validation_drop`) and absolute
    (`min_validation_accuracy`, check `absolute_name`). Both are business rules: they bind an exact retrain too.
    They compare the validation rows the batch does not entangle (`validation_remote`: unlearning/certificate/acceptance.py
    entangled_measures) where it has any: a batch that erases a class loses that class's validation rows by
    construction, a drop reported with the run, never a reason to keep serving the rows (docs/erasure.md).
    `validation`: those rows' measures, or the whole validation split's."""
    acc = None if validation is None else validation.acc
    rows = None if validation is None or validation.split == "validation" else validation.split
    if g.max_validation_drop is not None and validation is not None and validation.original_acc is not None:
        floor = round(validation.original_acc - g.max_validation_drop, 6)
        _check(checks, failures, "acc/validation_drop", acc, ">=", floor, NO_VALIDATION, rows=rows)
    if g.min_validation_accuracy is not None:
        _check(checks, failures, absolute_name, acc, ">=", g.min_validation_accuracy, NO_VALIDATION, rows=rows)


def _floored_validation(splits: dict[str, SplitMeasures]) -> SplitMeasures | None:
    """What the validation floors compare: the rows the batch does not entangle when it has any, else every
    validation row."""
    return splits.get("validation_remote") or splits.get("validation")


def _accuracy_within_oracles(checks: dict, failures: list, m: SplitMeasures, z: float) -> None:
    """The candidate's accuracy within `accuracy_interval` of the oracles' (statistical)."""
    o = m.oracle
    lo, hi = accuracy_interval(o.min, o.max, o.mean, int(m.n), z, o.std, o.n)
    # a tolerance of float rounding: with N identical oracles at 1.0 on 3 rows, lo is 0.6666666666666667 and an
    # accuracy of 2/3, printed as the bound itself, failed it
    ok = lo - ACC_TOLERANCE <= m.acc <= hi + ACC_TOLERANCE
    checks[K.key("acc", m.split)] = Check(m.acc, "in", [round(lo, 6), round(hi, 6)], ok, STATISTICAL)
    if not ok:
        failures.append(f"acc/{m.split} = {m.acc:.4f} (needs within the oracles' accuracy range "
                        f"[{lo:.4f}, {hi:.4f}], n = {int(m.n)})")


def _retrain_equivalence(checks: dict, failures: list, splits: dict[str, SplitMeasures], gate: Gate) -> None:
    """Per split measured against references: the epsilon upper bound within the budget (`gate.criterion:
    epsilon`), or the KLoM permutation p-value and the accuracy interval (`difference`); the optional extra
    bounds; the validation floors."""
    g = gate.retrain_equivalence
    by_epsilon = gate.criterion == "epsilon"
    for split, m in splits.items():
        if m.acc is None or math.isnan(m.acc):
            continue
        if by_epsilon:
            # the equivalence question replaces both difference tests: the split's epsilon upper bound within the
            # budget; compared with references (a KLoM p-value) but without an epsilon, nothing measured passes
            if m.epsilon is not None or m.pvalue is not None:
                _check(checks, failures, K.key("epsilon_upper", split), None if m.epsilon is None else m.epsilon.upper,
                       "<=", gate.epsilon.max, "not measured: the certificate computed no epsilon for this split",
                       STATISTICAL)
        elif m.oracle is not None and m.n is not None:
            _accuracy_within_oracles(checks, failures, m, g.accuracy_z)
        if g.max_accuracy_gap is not None and m.oracle is not None:
            _check(checks, failures, K.key("accuracy_gap", split), abs(m.acc - m.oracle.mean), "<=", g.max_accuracy_gap)
        if m.pvalue is not None and not by_epsilon:
            _check(checks, failures, K.key("klom_pvalue", split), m.pvalue, ">=", g.alpha, kind=STATISTICAL)
    _validation_floors(checks, failures, g, _floored_validation(splits), "acc/validation_min")
    forget = splits.get("forget")
    if g.max_klom_p95_forget is not None and forget is not None and forget.klom_p95 is not None:
        _check(checks, failures, "klom_p95/forget", forget.klom_p95, "<=", g.max_klom_p95_forget)
    if g.max_klom_to_noise_floor is not None:
        # Optional extra bound over the same-size floor (median of the permutation null).
        for split, m in splits.items():
            if m.floor is not None and m.klom_p95 is not None and not math.isnan(m.floor):
                _check(checks, failures, K.key("klom_p95", split), m.klom_p95, "<=",
                       round(g.max_klom_to_noise_floor * m.floor, 6))


def _suppression(checks: dict, failures: list, splits: dict[str, SplitMeasures], gate: Gate) -> None:
    """Absolute bounds and the original (every check a business rule): forget accuracy at most
    max_forget_accuracy, adjacent accuracy kept at min_adjacent_retention x the original's, the validation
    floors."""
    g = gate.suppression
    forget, adjacent = splits.get("forget"), splits.get("adjacent")
    _check(checks, failures, "acc/forget", None if forget is None else forget.acc, "<=", g.max_forget_accuracy,
           NO_FORGET)
    if adjacent is not None and not math.isnan(adjacent.acc):
        original = adjacent.original_acc
        retention = float("nan") if original is None else adjacent.acc / max(original, 1e-12)
        _check(checks, failures, "adjacent_retention", retention, ">=", g.min_adjacent_retention,
               "not measured: the original model's adjacent accuracy (original_acc/adjacent) is missing")
    _validation_floors(checks, failures, g, _floored_validation(splits), "acc/validation")


OBJECTIVES = {"retrain_equivalence": _retrain_equivalence, "suppression": _suppression}


def evaluate_gate(objective: str, measures: "Iterable[SplitMeasures] | Mapping[str, SplitMeasures]", gate: Gate,
                  exact: bool = False) -> Verdict:
    """The verdict of `gate` on the candidate's per-split `measures` (SplitMeasures).

    retrain_equivalence checks, per split measured against references:
      * `klom_pvalue/<split>` >= alpha: the permutation test of metrics/permutation.py (known false-reject
        rate <= alpha per split);
      * `acc/<split>` within `accuracy_interval` of the oracle accuracies;
      * optional extra bounds: max_accuracy_gap, max_klom_p95_forget, max_klom_to_noise_floor (null = off).
    Under `gate.criterion: epsilon` the KLoM p-value and the accuracy interval give way to the split's epsilon
    upper bound <= `gate.epsilon.max` (unlearning/metrics/epsilon.py); floors and extra bounds stay.
    suppression: absolute bounds (every check a business rule).
    `exact`: the candidate is an exact retrain (its method's trait `exact`): a failure of statistical checks only
    then also says it is a gate defect."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not known; allowed: {sorted(OBJECTIVES)}")
    checks: dict[str, Check] = {}
    failures: list[str] = []
    OBJECTIVES[objective](checks, failures, by_split(measures), gate)
    verdict = Verdict(passed=not failures, objective=objective, failures=failures, checks=checks)
    if exact and verdict.failed_on_statistics_only():
        # an absolute floor (acc/validation_min, a KLoM P95 bound) binds a retrain too: only a failure of the
        # statistical checks alone is the gate's false reject
        return replace(verdict, failures=[*failures, RETRAIN_DEFECT])
    return verdict
