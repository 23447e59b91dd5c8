"""The sequential certificate: references in looks, a rejection at the first decisive look, an acceptance only
at the last (docs/design.md §4.2; group-sequential testing with alpha spending, Pocock 1977, O'Brien and
Fleming 1979, here with a plain Bonferroni split that needs no independence between looks).

At look k the KLoM permutation test (unlearning/metrics/permutation.py) compares the candidate's
shadow-unlearned models with the oracles trained so far, and gives a p-value per split that is super-uniform
under H0 (the candidate is a retrain): P(p < a) <= a. Look k rejects when some split's p < alpha_k. With
alpha_1 + ... + alpha_K = alpha (`alpha_schedule`), the union bound keeps a true retrain's false-reject rate
at most alpha per split over all looks, whatever the dependence between looks. Interim looks test KLoM only;
the last look runs the whole gate (accuracy intervals, floors) at alpha_K.

A look can only reject when its permutation test can give p < alpha_k: `permutations_for` sizes it so that
its smallest p-value, 1 / (1 + P), is at most alpha_k / 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearning import metric_keys as K
from unlearning.resolution import permutations_for  # noqa: F401  (re-exported: the looks' relabelings)


def alpha_schedule(alpha: float, n_interim: int, interim_share: float) -> tuple[float, ...]:
    """alpha per look: `interim_share` x alpha split equally over the `n_interim` interim looks, the rest at
    the final look; the values sum to alpha. No interim look: (alpha,)."""
    if n_interim <= 0:
        return (alpha,)
    each = alpha * interim_share / n_interim
    return (*([each] * n_interim), alpha - each * n_interim)


@dataclass
class Look:
    """What one look saw: references per role, its alpha, the p-value per split, and its decision."""

    n_shadows: int
    n_oracles: int
    alpha: float
    pvalues: dict[str, float]
    decision: str  # reject | continue | final
    seconds: float = 0.0
    failing: list[str] = field(default_factory=list)
    budget: float | None = None  # gate.epsilon.max under the epsilon criterion: `pvalues` then holds lower bounds

    def line(self, method: str, index: int, total: int) -> str:
        from unlearning.gate import format_beside

        bound = float(f"{self.alpha:.4g}") if self.budget is None else self.budget
        ps = ", ".join(f"{s} {format_beside(p, bound)}" for s, p in self.pvalues.items())
        what_is = "KLoM p-values" if self.budget is None else f"epsilon lower bounds (budget {self.budget:g})"
        what = {"reject": f"rejected ({'; '.join(self.failing)})", "continue": "not decisive: more references",
                "final": "final look: the whole gate decides"}[self.decision]
        return (f"certificate of {method}: look {index + 1}/{total} with {self.n_shadows} shadows + "
                f"{self.n_oracles} oracles (alpha {self.alpha:.4g}): {what_is} {ps}: {what} "
                f"[{self.seconds:.1f} s]")


def interim_decision(pvalues: dict[str, float], alpha_k: float) -> tuple[str, list[str]]:
    """reject when some split's p-value is below alpha_k (NaN counts as below: nothing measured passes);
    otherwise continue. Returns (decision, the failing splits in words)."""
    from unlearning.gate import format_beside

    failing = [f"{s}: p = {format_beside(p, float(f'{alpha_k:.4g}'))} < {alpha_k:.4g}" for s, p in pvalues.items()
               if not (p >= alpha_k)]
    return ("reject" if failing else "continue"), failing


def interim_epsilon_decision(lowers: dict[str, float], budget: float) -> tuple[str, list[str]]:
    """Under the epsilon criterion: reject when some split's epsilon lower bound exceeds the budget (NaN counts
    as above: nothing measured passes); otherwise continue. Returns (decision, the failing splits in words)."""
    from unlearning.gate import format_beside

    failing = [f"{s}: epsilon lower bound {format_beside(e, budget)} > {budget:g}" for s, e in lowers.items()
               if not (e <= budget)]
    return ("reject" if failing else "continue"), failing


def interim_bounds(metrics: dict[str, float], gate) -> dict[str, float]:
    """What an interim look tests per split: the KLoM p-values, or the epsilon lower bounds (epsilon criterion)."""
    from unlearning.metrics.summary import SPLITS

    key = "epsilon_lower" if gate.criterion == "epsilon" else "klom_pvalue"
    return {s: metrics[f"{key}/{s}"] for s in SPLITS if f"{key}/{s}" in metrics}


def look_gate(gate, alpha: float, n_permutations: int):
    """The gate of one look (params.gate with the look's alpha and permutation count)."""
    re = gate.retrain_equivalence.model_copy(update={"alpha": alpha, "n_permutations": n_permutations})
    return gate.model_copy(update={"retrain_equivalence": re})


def look_verdict(metrics: dict[str, float], gate, objective: str, alpha: float, final: bool, look: int):
    """-> (Verdict, decision, failing) of one look over the certificate's metrics (unlearning/certificate.py,
    computed with the look's permutation count): the whole gate at alpha at the final look; at an interim look
    a rejection when some split's KLoM p-value is below alpha (under `gate.criterion: epsilon`: when some
    split's epsilon lower bound exceeds gate.epsilon.max), else "continue" (a passing verdict so far)."""
    from unlearning.gate import Verdict, evaluate_gate

    if final:
        return evaluate_gate(objective, metrics, look_gate(gate, alpha, gate.retrain_equivalence.n_permutations)), \
            "final", []
    if gate.criterion == "epsilon":
        budget = gate.epsilon.max
        lowers = interim_bounds(metrics, gate)
        decision, failing = interim_epsilon_decision(lowers, budget)
        checks = {K.key("epsilon_lower", s): {"value": e, "op": "<=", "limit": budget, "passed": bool(e <= budget)}
                  for s, e in lowers.items()}
    else:
        pvalues = interim_bounds(metrics, gate)
        decision, failing = interim_decision(pvalues, alpha)
        checks = {K.key("klom_pvalue", s): {"value": p, "op": ">=", "limit": alpha, "passed": bool(p >= alpha)}
                  for s, p in pvalues.items()}
    failures = [f"rejected at interim look {look + 1}: {f}" for f in failing]
    return Verdict(passed=not failing, objective=objective, failures=failures, checks=checks), decision, failing


class LookJudge:
    """The verdict of one look, evaluated once: unlearning/acceptance.py outcome_from_logits calls it with the
    look's metrics (its `judge`), and it keeps what `look_verdict` decided (`decision`, `failing`) for the
    certifier's Look record."""

    def __init__(self, gate, objective: str, alpha: float, final: bool, look: int):
        self.gate, self.objective, self.alpha, self.final, self.look = gate, objective, alpha, final, look
        self.decision: str | None = None
        self.failing: list[str] = []

    def __call__(self, metrics: dict[str, float]):
        verdict, self.decision, self.failing = look_verdict(metrics, self.gate, self.objective, self.alpha,
                                                            self.final, self.look)
        return verdict

