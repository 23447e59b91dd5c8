"""The sequential certificate, one loop for every caller: references in looks, a rejection at the first decisive
look, an acceptance only at the last (docs/design.md §4.2, §4.6, §4.7; group-sequential testing with alpha
spending, Pocock 1977, O'Brien and Fleming 1979, here with a plain Bonferroni split that needs no independence
between looks).

`Criterion.of(gate, step)` is built once per candidate from params.gate and the plan's step (its looks, alpha per
look, relabelings per look); `run_looks(criterion, measure)` is the loop. It is pure: the work that needs the
shell (grow the reference pool to (n_shadows, n_oracles), run the method on the new shadows, evaluate logits) is
the `measure` callable, so tasks/certify.py, unlearning/certificate/acceptance.py and the benches all judge alike.
`certify_logits` is the loop over logits already in hand (the benches'). Nothing else holds a rule of the looks.

At look k the KLoM permutation test (unlearning/metrics/permutation.py) gives a p-value per split that is
super-uniform under H0 (the candidate is a retrain): P(p < a) <= a. Look k rejects when some split's p < alpha_k.
With alpha_1 + ... + alpha_K = alpha (`alpha_schedule`), the union bound keeps a true retrain's false-reject rate
at most alpha per split over all looks, whatever the dependence between looks. Under `gate.criterion: epsilon` an
interim look rejects when some split's epsilon lower bound, one-sided at 1 - alpha_k, exceeds the budget: the
bias-corrected bound of unlearning/metrics/epsilon.py, valid at small N (docs/certificate.md, "Bounds at every
look"). Interim looks test that alone; the last look runs the whole gate at alpha_K.

A look can only reject when its permutation test can give p < alpha_k: `permutations_for` sizes it so that its
smallest p-value, 1 / (1 + P), is at most alpha_k / 2.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from unlearning.certificate import metric_keys as K
from unlearning.config import Gate
from unlearning.certificate.gate import STATISTICAL, Check, SplitMeasures, Verdict, by_split, evaluate_gate, format_beside
from unlearning.certificate.resolution import permutations_for  # noqa: F401  (re-exported: the looks' relabelings)

REJECT, CONTINUE, FINAL = "reject", "continue", "final"  # what a look decides


def alpha_schedule(alpha: float, n_interim: int, interim_share: float) -> tuple[float, ...]:
    """alpha per look: `interim_share` x alpha split equally over the `n_interim` interim looks, the rest at
    the final look; the values sum to alpha. No interim look: (alpha,)."""
    if n_interim <= 0:
        return (alpha,)
    each = alpha * interim_share / n_interim
    return (*([each] * n_interim), alpha - each * n_interim)


@dataclass(frozen=True)
class LookSpec:
    """One planned look: its place (`index` of `total`), the references per role it judges on, its alpha and
    the permutation test's relabelings."""

    index: int
    total: int
    n_shadows: int
    n_oracles: int
    alpha: float
    n_permutations: int

    @property
    def final(self) -> bool:
        return self.index == self.total - 1


@dataclass(frozen=True)
class Look:
    """What one look saw: references per role, its alpha, what it tested per split (KLoM p-values, or under the
    epsilon criterion the epsilon lower bounds: `budget` is then gate.epsilon.max), its decision (reject |
    continue | final), its seconds and the failing splits in words."""

    n_shadows: int
    n_oracles: int
    alpha: float
    tested: dict[str, float]
    decision: str
    seconds: float = 0.0
    failing: tuple[str, ...] = ()
    budget: float | None = None

    def line(self, method: str, index: int, total: int) -> str:
        """The look in one line (the batch's log): look `index + 1` of `total`."""
        bound = float(f"{self.alpha:.4g}") if self.budget is None else self.budget
        ps = ", ".join(f"{s} {format_beside(p, bound)}" for s, p in self.tested.items())
        what_is = "KLoM p-values" if self.budget is None else f"epsilon lower bounds (budget {self.budget:g})"
        what = {REJECT: f"rejected ({'; '.join(self.failing)})", CONTINUE: "not decisive: more references",
                FINAL: "final look: the whole gate decides"}[self.decision]
        return (f"certificate of {method}: look {index + 1}/{total} with {self.n_shadows} shadows + "
                f"{self.n_oracles} oracles (alpha {self.alpha:.4g}): {what_is} {ps}: {what} [{self.seconds:.1f} s]")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Criterion:
    """What the certificate asks of one candidate, built once (`of`): params.gate, the planned looks, the
    objective, and whether the candidate is exact (its method's trait: a statistical-only failure is then the
    gate's false reject)."""

    gate: Gate
    looks: tuple[LookSpec, ...]
    objective: str = "retrain_equivalence"
    exact: bool = False

    @classmethod
    def of(cls, gate: Gate, looks: Sequence[tuple[int, int]], alphas: Sequence[float] | None = None,
           permutations: Sequence[int] | None = None, *, objective: str = "retrain_equivalence",
           exact: bool = False) -> "Criterion":
        """The criterion over `looks` ((n_shadows, n_oracles) each; unlearning/planning/plan.py Step.looks) with their
        alphas and relabelings (Step.alphas, Step.permutations). Without them: one look at gate.retrain_equivalence's
        alpha and n_permutations (an audit at full N)."""
        g = gate.retrain_equivalence
        alphas = tuple(alphas) if alphas is not None else (g.alpha,) * len(looks)
        perms = tuple(permutations) if permutations is not None else (g.n_permutations,) * len(looks)
        if not looks or not len(looks) == len(alphas) == len(perms):
            raise ValueError(f"a certificate needs at least one look, with one alpha and one relabeling count each; "
                             f"got looks {list(looks)}, alphas {list(alphas)}, permutations {list(perms)}")
        specs = tuple(LookSpec(k, len(looks), int(n_s), int(n_o), float(a), int(p))
                      for k, ((n_s, n_o), a, p) in enumerate(zip(looks, alphas, perms)))
        return cls(gate, specs, objective, exact)

    @classmethod
    def of_step(cls, gate: Gate, step, *, objective: str = "retrain_equivalence",
                exact: bool = False) -> "Criterion":
        """The criterion of a plan's sequential step (unlearning/planning/plan.py Step)."""
        return cls.of(gate, step.looks, step.alphas, step.permutations, objective=objective, exact=exact)

    @property
    def by_epsilon(self) -> bool:
        return self.gate.criterion == "epsilon"

    def gate_at(self, spec: LookSpec) -> Gate:
        """params.gate with the look's alpha and relabelings: what the last look's whole gate applies."""
        re = self.gate.retrain_equivalence.model_copy(update={"alpha": spec.alpha,
                                                              "n_permutations": spec.n_permutations})
        return self.gate.model_copy(update={"retrain_equivalence": re})

    def measure_args(self, spec: LookSpec) -> dict[str, Any]:
        """How a look measures (unlearning/certificate/equivalence.py certificate_measures): the look's relabelings, epsilon
        under the epsilon criterion, one-sided bounds at the look's 1 - alpha."""
        return {"n_permutations": spec.n_permutations, "epsilon": self.gate.epsilon if self.by_epsilon else None,
                "confidence": 1 - spec.alpha}

    def tested(self, measures: Iterable[SplitMeasures]) -> dict[str, float]:
        """What an interim look tests per split: the epsilon lower bounds (epsilon criterion) or the KLoM
        p-values; NaN where it was not measured."""
        nan = float("nan")
        if self.by_epsilon:
            return {s: nan if m.epsilon is None else m.epsilon.lower for s, m in by_split(measures).items()
                    if m.pvalue is not None or m.epsilon is not None}
        return {s: m.pvalue for s, m in by_split(measures).items() if m.pvalue is not None}

    def judge(self, measures: Iterable[SplitMeasures], spec: LookSpec) -> Verdict:
        """The look's verdict: the whole gate at the look's alpha at the last look; before it, a rejection when
        some split's epsilon lower bound exceeds the budget (epsilon criterion) or its KLoM p-value is below
        alpha_k (NaN counts as failing: nothing measured passes); else a passing verdict so far."""
        measures = tuple(measures)
        if spec.final:
            return evaluate_gate(self.objective, measures, self.gate_at(spec), exact=self.exact)
        checks, failures = {}, []
        for split, value in self.tested(measures).items():
            if self.by_epsilon:
                budget = self.gate.epsilon.max
                ok = bool(value <= budget)
                checks[K.key("epsilon_lower", split)] = Check(value, "<=", budget, ok, STATISTICAL)
                words = f"{split}: epsilon lower bound {format_beside(value, budget)} > {budget:g}"
            else:
                ok = bool(value >= spec.alpha)
                checks[K.key("klom_pvalue", split)] = Check(value, ">=", spec.alpha, ok, STATISTICAL)
                words = f"{split}: p = {format_beside(value, float(f'{spec.alpha:.4g}'))} < {spec.alpha:.4g}"
            if not ok:
                failures.append(words)
        return Verdict(not failures, self.objective, [f"{interim_prefix(spec)}{f}" for f in failures], checks)

    def decision(self, verdict: Verdict, spec: LookSpec) -> str:
        """final at the last look; before it, continue while the verdict passes, else reject."""
        return FINAL if spec.final else CONTINUE if verdict.passed else REJECT


def interim_prefix(spec: LookSpec) -> str:
    """How an interim look's failures begin in the verdict (the look's own record lists them without it)."""
    return f"rejected at interim look {spec.index + 1}: "


T = TypeVar("T")


@dataclass(frozen=True)
class Certified(Generic[T]):
    """The certificate's end: what the deciding look measured (`result`, the caller's record), its verdict,
    and every look taken."""

    result: T
    verdict: Verdict
    looks: tuple[Look, ...]

    @property
    def decision(self) -> str:
        return self.looks[-1].decision

    @property
    def alpha(self) -> float:
        """The alpha the deciding look applied."""
        return self.looks[-1].alpha

    @property
    def accepted(self) -> bool:
        """Passed at the last look (an interim look only rejects)."""
        return self.decision == FINAL and self.verdict.passed


def run_looks(criterion: Criterion, measure: Callable[[LookSpec], T], *,
              measures_of: Callable[[T], Iterable[SplitMeasures]] = lambda r: r.measures,
              on_look: Callable[[Look, LookSpec], None] | None = None) -> Certified[T]:
    """The sequential certificate: for each planned look, `measure(spec)` (the caller's work: references grown to
    (spec.n_shadows, spec.n_oracles), the method on the new shadows, logits, unlearning/certificate/equivalence.py with
    `criterion.measure_args(spec)`), then the criterion's verdict; stop at the first look that does not continue.
    `measures_of`: the per-split records in what `measure` returns; `on_look`: told each look as it ends (the
    batch's log line)."""
    looks: list[Look] = []
    for spec in criterion.looks:
        start = time.perf_counter()
        result = measure(spec)
        measures = tuple(measures_of(result))
        verdict = criterion.judge(measures, spec)
        decision = criterion.decision(verdict, spec)
        failing = tuple(f.removeprefix(interim_prefix(spec)) for f in verdict.failures) if decision == REJECT else ()
        look = Look(spec.n_shadows, spec.n_oracles, spec.alpha, criterion.tested(measures), decision,
                    time.perf_counter() - start, failing, criterion.gate.epsilon.max if criterion.by_epsilon else None)
        looks.append(look)
        if on_look is not None:
            on_look(look, spec)
        if decision != CONTINUE:
            return Certified(result, verdict, tuple(looks))
    raise AssertionError("Criterion.of refuses a certificate without looks")


@dataclass(frozen=True)
class References:
    """The logits a look judges on: the shadow-unlearned models [n_shadows, n, C] and the oracles [n_oracles, n, C];
    `accuracy_ref` [N_a, n, C]: oracles the candidate was not drawn from (default: `oracles`)."""

    shadow_unlearned: Any
    oracles: Any
    accuracy_ref: Any = None


def reference_prefixes(shadow_unlearned: Any, oracles: Any) -> Callable[[LookSpec], References]:
    """Each look's references as the first (n_shadows, n_oracles) of models already evaluated ([N, n, C] each):
    the `references` of `certify_logits` when every reference model is trained before the first look."""
    return lambda spec: References(shadow_unlearned[:spec.n_shadows], oracles[:spec.n_oracles])


@dataclass(frozen=True)
class LookMeasures:
    """What `certify_logits` measured at a look: the per-split records and the certificate's other outputs
    (unlearning/certificate/equivalence.py CertificateData)."""

    measures: tuple[SplitMeasures, ...]
    data: Any


def certify_logits(criterion: Criterion, candidate: Any, references: Callable[[LookSpec], References], labels: Any,
                   splits: Any, *, seed: int = 0,
                   on_look: Callable[[Look, LookSpec], None] | None = None) -> Certified[LookMeasures]:
    """The certificate of a candidate whose logits are in hand ([1, n, C] on the evaluated rows, labels and split
    names [n]): `references(spec)` gives each look's logits (e.g. prefixes of models already evaluated). The
    benches' entry point (bench/calibration.py, bench/gpu_batch.py, bench/stream.py): the same loop and rules as
    the deletion flow's."""
    from unlearning.certificate.equivalence import certificate_measures  # numerical: imports torch, which the gate does not

    def measure(spec: LookSpec) -> LookMeasures:
        refs = references(spec)
        acc_ref = refs.oracles if refs.accuracy_ref is None else refs.accuracy_ref
        measures, data = certificate_measures(candidate, refs.shadow_unlearned, refs.oracles, acc_ref, labels, splits,
                                              seed=seed, **criterion.measure_args(spec))
        return LookMeasures(measures, data)

    return run_looks(criterion, measure, on_look=on_look)
