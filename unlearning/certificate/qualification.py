"""Certify once, apply many: a model's qualification and the licensing rule of `validation.mode: qualified`
(docs/design.md §4.5; docs/certificate.md, "Two modes").

The per-batch certificate trains tens of reference models per batch. For a model that takes minutes to
train that costs far more than the retrain it is meant to avoid. Qualification measures, once per trained
model (recipe, data), which method passes the oracle certificate at which predicted gap:

- `draw_suite`: the suite of forget sets a team expects (random sets of several sizes, a group, a class, the
  highest and the lowest self-leverage rows), drawn deterministically from `qualify.suite`;
- `pass_rate_table`: per method, the pass rate of the oracle certificate per bin of the predicted gap in
  units of its noise, with a binomial confidence interval (Clopper and Pearson 1934, or Wilson 1927);
- `license_method`: the cheapest method whose qualified pass rate at this batch's predicted gap meets
  `validation.qualified_min_pass`, else exact retrain, with the row that licensed it;
- `audit_due`: which batches are audited by the full certificate (`validation.audit`), a deterministic
  function of the base seed and the batch index.

Pure: numpy and the standard library only. The shell runs the certificates (tasks/qualification.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

from unlearning.certificate import metric_keys as K
from unlearning.config import EXACT_RETRAIN
from unlearning.certificate.gate import BUSINESS, STATISTICAL, Check
from unlearning.stats import INTERVALS, clopper_pearson, wilson  # noqa: F401  (the intervals `interval` names)

EXACT = EXACT_RETRAIN  # always licensed: exact unlearning by construction
SUITE_KINDS = ("random", "group", "class", "high_self_leverage", "low_self_leverage")  # (+ gap_fill: drawn to fill bins)
AUDIT_STREAM = 0x417544  # the audit draw's own SeedSequence word ("AuD"): disjoint from every role stream
SUITE_STREAM = 0x517561  # the suite draw's ("Qua")


# --- the suite -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SuiteSet:
    """One forget set of the qualification suite: training-row indices (sorted)."""

    name: str
    kind: str
    rows: np.ndarray


def draw_suite(entries: Iterable, seed: int, train_rows: np.ndarray, labels: np.ndarray, groups: np.ndarray,
               self_leverage_score: np.ndarray | None) -> list[SuiteSet]:
    """The qualification suite's forget sets, deterministic in `seed`.

    `entries`: `qualify.suite` (each with `kind`, `size`, `count`); `train_rows`: the training rows D (indices
    into `labels`/`groups`); `self_leverage_score`: one score per row of `train_rows`, higher = more self-
    leverage (None: the leverage kinds are skipped). Kinds:
    - random: `count` sets of `size` rows drawn without replacement;
    - class / group: `count` distinct classes (groups) in a seeded order, every training row of each, or a
      seeded sample of `size` rows of it when `size` is set;
    - high_self_leverage / low_self_leverage: `count` consecutive windows of `size` rows down (up) the ranking.
    Sets smaller than 1 row, or that would leave no training row, are not drawn."""
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(SUITE_STREAM,)))
    train_rows = np.asarray(train_rows)
    out: list[SuiteSet] = []

    def add(name: str, kind: str, rows: np.ndarray) -> None:
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        if 0 < len(rows) < len(train_rows):
            out.append(SuiteSet(name, kind, rows))

    for e in entries:
        kind, size, count = e.kind, e.size, e.count
        if kind == "random":
            for k in range(count):
                add(f"random{size}_{k}", kind, rng.choice(train_rows, min(size, len(train_rows)), replace=False))
        elif kind in ("class", "group"):
            values = np.asarray(labels if kind == "class" else groups)[train_rows]
            uniq = np.unique(values)
            for v in rng.permutation(uniq)[:count]:
                members = train_rows[values == v]
                if size is not None and size < len(members):
                    members = rng.choice(members, size, replace=False)
                add(f"{kind}_{v}" + (f"_{size}" if size is not None else ""), kind, members)
        elif kind in ("high_self_leverage", "low_self_leverage"):
            if self_leverage_score is None:
                continue
            order = np.argsort(-np.asarray(self_leverage_score), kind="stable")
            if kind == "low_self_leverage":
                order = order[::-1]
            for k in range(count):
                add(f"{kind}{size}_{k}", kind, train_rows[order[k * size:(k + 1) * size]])
        else:
            raise ValueError(f"qualify.suite kind {kind!r} is not known; allowed: {list(SUITE_KINDS)}")
    return out


# --- filling the bins of predicted gap ----------------------------------------------------------------------------

def bin_deficits(gaps: Sequence[float], bins: Sequence[float], min_sets: int) -> list[tuple[float, float, int]]:
    """The bins of predicted gap holding fewer than `min_sets` sets: (lo, hi, sets missing), lowest bin first.
    A NaN gap falls in no bin."""
    out = []
    for lo, hi in bin_edges(bins):
        have = sum(1 for g in gaps if lo <= g < hi)
        if have < min_sets:
            out.append((lo, hi, min_sets - have))
    return out


def rank_position(rows: np.ndarray, train_rows: np.ndarray, score: np.ndarray) -> float:
    """Where a set sits on the self-leverage ranking of the training rows: the mean rank of its rows, in [0, 1]
    (0 = the lowest score). The predicted gap grows with it, which is how `window_for` aims a new set."""
    order = np.argsort(np.asarray(score), kind="stable")
    rank = np.empty(len(order))
    rank[order] = np.arange(len(order)) / max(len(order) - 1, 1)
    where = np.searchsorted(np.asarray(train_rows), np.asarray(rows))
    return float(rank[where].mean())


def window_for(observed: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """The ranking position at which a new set should land in the gap bin [lo, hi): interpolated on log(1 + gap)
    through the (position, gap) pairs seen so far, sorted by gap (ties and a flat relation fall back to the ends:
    0 below every gap seen, 1 above)."""
    pts = sorted((g, p) for p, g in observed if np.isfinite(g))
    if not pts:
        return 0.5
    target = math.log1p(lo if math.isinf(hi) else (lo + hi) / 2 if lo > 0 else hi / 2)
    g = np.log1p([x[0] for x in pts])
    pos = np.array([x[1] for x in pts])
    if target <= g[0]:
        return float(max(0.0, pos[0] - 0.1)) if pos[0] > 0.05 else 0.0
    if target >= g[-1]:
        return float(min(1.0, pos[-1] + 0.1)) if pos[-1] < 0.95 else 1.0
    return float(np.clip(np.interp(target, g, pos), 0.0, 1.0))


def draw_window_set(name: str, rng: np.random.Generator, train_rows: np.ndarray, score: np.ndarray,
                    position: float, size: int, width: float = 0.1) -> SuiteSet:
    """A set of `size` rows drawn at random from the window of the self-leverage ranking centred on `position`
    (`width` of the rows, at least `size`)."""
    order = np.argsort(np.asarray(score), kind="stable")
    n = len(order)
    half = max(int(width * n / 2), size // 2 + 1)
    centre = int(round(position * (n - 1)))
    a, b = max(0, centre - half), min(n, centre + half)
    if b - a < size:
        a, b = (0, size) if a == 0 else (n - size, n)
    pick = rng.choice(order[a:b], min(size, b - a), replace=False)
    return SuiteSet(name, "gap_fill", np.sort(np.asarray(train_rows)[pick]))


def gap_in_noise_units(predicted_gap_forget: np.ndarray, noise: float) -> float:
    """The forget set's predicted gap (mean of 0.5 x the squared Fisher norm per row, the KL it predicts:
    unlearning/policy/selection.py batch_facts) over the qualification's noise unit: the qualify stage and a qualified
    batch read every gap in the same unit, so a batch's gap falls in the bins its suite filled."""
    g = np.asarray(predicted_gap_forget, dtype=np.float64)
    return float(np.mean(0.5 * np.square(g))) / max(float(noise), 1e-12) if g.size else math.nan


# --- the table -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trial:
    """One oracle certificate of one method on one forget set (a qualification set, or an audited batch)."""

    set_name: str
    kind: str
    n_forget: int
    method: str
    gap_to_noise: float  # the predicted gap in units of its noise (`predicted_gap_to_noise`)
    passed: bool
    references: int = 0  # reference models the certificate used
    seconds: float = 0.0
    source: str = "suite"  # suite | audit


@dataclass(frozen=True)
class Row:
    """One row of the qualification table: a method in one bin of the predicted gap."""

    row_id: str  # "do_nothing gap [0, 0.25)"
    method: str
    gap_lo: float
    gap_hi: float  # inf for the last bin
    n: int
    passes: int
    rate: float  # NaN when n = 0
    lower: float
    upper: float

    def covers(self, gap: float) -> bool:
        return self.gap_lo <= gap < self.gap_hi


def bin_edges(bins: Sequence[float]) -> list[tuple[float, float]]:
    """[0, b1), [b1, b2), ..., [bk, inf) from the increasing upper edges `bins`."""
    edges = [0.0, *map(float, bins), math.inf]
    return list(zip(edges[:-1], edges[1:]))


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:g}"


def pass_rate_table(trials: Iterable[Trial], methods: Sequence[str], bins: Sequence[float], confidence: float,
                    interval: str = "clopper_pearson") -> list[Row]:
    """Per method (in `methods`' order) and per bin of the predicted gap, the certificate's pass rate and its
    interval at `confidence`. Every (method, bin) has a row, with n = 0 where no trial fell in it. A trial with
    a NaN gap falls in no bin."""
    ci = INTERVALS[interval]
    trials = list(trials)
    out = []
    for m in methods:
        for lo, hi in bin_edges(bins):
            hit = [t.passed for t in trials if t.method == m and lo <= t.gap_to_noise < hi]
            n, k = len(hit), int(sum(hit))
            low, up = ci(k, n, confidence)
            out.append(Row(f"{m} gap [{_fmt(lo)}, {_fmt(hi)})", m, lo, hi, n, k, k / n if n else math.nan, low, up))
    return out


# --- the licensing rule --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class License:
    """The method a qualified batch runs, and why: the row that licensed it (None: exact retrain, the
    fallback no row is needed for)."""

    method: str
    row: Row | None
    reason: str

    def to_dict(self) -> dict:
        return {"method": self.method, "row": asdict(self.row) if self.row else None, "reason": self.reason}


def qualified_rate(row: Row, bound: str) -> float:
    """What the rule compares with min_pass: the interval's lower end (`lower`) or the point estimate
    (`point`); NaN (never licensed) for an empty row."""
    if row.n == 0:
        return math.nan
    return row.lower if bound == "lower" else row.rate


def licenses_any(table: Sequence[Row], methods: Sequence[str], min_pass: float, bound: str = "lower") -> bool:
    """Whether some row of a method cheaper than the exact retrain clears `min_pass` at some gap. When none does,
    every qualified batch is an exact retrain whatever its predicted gap, so its diagnostics decide nothing and
    need not run (on the digits default they cost about one retrain of the MLP: docs/certificate.md)."""
    for m in methods:
        if m == EXACT:
            break
        if any(r.method == m and r.n and qualified_rate(r, bound) >= min_pass for r in table):
            return True
    return False


def license_method(table: Sequence[Row], gap_to_noise: float, methods: Sequence[str], min_pass: float,
                   bound: str = "lower") -> License:
    """The cheapest method (`methods` is in order of cost, cheapest first: Qualification.by_cost) whose row at this
    predicted gap has a
    qualified rate (`qualified_rate`) of at least `min_pass`; else exact retrain. A NaN gap (no diagnostics)
    licenses nothing but the retrain."""
    if not np.isfinite(gap_to_noise):
        return License(EXACT, None, "no predicted gap (diagnostics missing): exact retrain")
    best: tuple[float, Row] | None = None
    for m in methods:
        if m == EXACT:
            break
        row = next((r for r in table if r.method == m and r.covers(gap_to_noise)), None)
        if row is None:
            continue
        q = qualified_rate(row, bound)
        if q >= min_pass:
            return License(m, row, f"{row.row_id}: {row.passes}/{row.n} passed, {bound} "
                                   f"{q:.3f} >= qualified_min_pass {min_pass}")
        if row.n and (best is None or q > best[0]):
            best = (q, row)
    why = (f"best {best[1].row_id}: {best[1].passes}/{best[1].n} passed, {bound} {best[0]:.3f}"
           if best else "no qualification row holds a set at this gap")
    return License(EXACT, None, f"no method qualified at predicted gap {gap_to_noise:.3g} noise units "
                                f"(>= {min_pass} needed; {why}): exact retrain")


# --- the cheap checks of a qualified batch --------------------------------------------------------------------

def _auc_from_ranks(ranks: np.ndarray, is_val: np.ndarray, n_f: int, n_v: int) -> np.ndarray:
    """AUC of "member iff loss < tau" (unlearning/metrics/mia.py loss_threshold_auc) from the pooled rows'
    average ranks and one or more validation masks [..., n]."""
    return ((is_val * ranks).sum(-1) - n_v * (n_v + 1) / 2.0) / (n_f * n_v)


def membership_test(forget_losses: np.ndarray, forget_labels: np.ndarray, validation_losses: np.ndarray,
                    validation_labels: np.ndarray, n_permutations: int, seed: int) -> tuple[float, float]:
    """A membership test of the forget rows against the validation rows that needs no reference model: the
    loss-threshold AUC (forget losses lower = members), and its permutation p-value with the forget/validation
    labels permuted within each class (the classes present on both sides; a retrain never saw the forget rows,
    so within a class they are exchangeable with held-out rows). -> (AUC, p); (NaN, 1.0) when no class is on
    both sides. p = (1 + #{null AUC >= observed}) / (1 + n_permutations)."""
    fl, vl = np.asarray(forget_losses, np.float64), np.asarray(validation_losses, np.float64)
    fy, vy = np.asarray(forget_labels), np.asarray(validation_labels)
    shared = np.intersect1d(fy, vy)
    keep_f, keep_v = np.isin(fy, shared), np.isin(vy, shared)
    if not keep_f.any():
        return math.nan, 1.0
    losses = np.concatenate([fl[keep_f], vl[keep_v]])
    labels = np.concatenate([fy[keep_f], vy[keep_v]])
    is_val = np.concatenate([np.zeros(keep_f.sum()), np.ones(keep_v.sum())])
    n_f, n_v = int(keep_f.sum()), int(keep_v.sum())
    uniq, inverse, counts = np.unique(losses, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - counts + (counts + 1) / 2.0)[inverse]
    observed = float(_auc_from_ranks(ranks, is_val, n_f, n_v))
    rng = np.random.default_rng(seed)
    null_masks = np.tile(is_val, (n_permutations, 1))
    for c in shared:
        idx = np.flatnonzero(labels == c)
        null_masks[:, idx] = rng.permuted(null_masks[:, idx], axis=1)
    null = _auc_from_ranks(ranks, null_masks, n_f, n_v)
    return observed, float((1 + np.count_nonzero(null >= observed - 1e-12)) / (1 + n_permutations))


def largest_class_share(forget_labels: np.ndarray, before_labels: np.ndarray) -> float:
    """The largest share of one class's training rows (before the batch) that the forget rows take: 1.0 for a
    request of a whole class. 0 for no forget row."""
    fy, by = np.asarray(forget_labels), np.asarray(before_labels)
    if fy.size == 0:
        return 0.0
    classes, counts = np.unique(fy, return_counts=True)
    return float(max(c / max(int(np.count_nonzero(by == k)), 1) for k, c in zip(classes, counts)))


def cheap_checks(metrics: dict[str, float], max_drop: float | None, membership_p: float, alpha: float,
                 class_share: float | None = None, max_class_share: float | None = None
                 ) -> tuple[dict[str, Check], list[str]]:
    """The reference-free checks of a qualified batch's candidate: accuracy on each retained split and on
    validation at least the original's minus `max_drop` (gate.retrain_equivalence.max_validation_drop; None:
    not checked), the membership test's p-value at least `alpha`, and the forget rows' `largest_class_share` at
    most `max_class_share` (validation.qualified_max_class_share; None: not checked): a class-level request
    changes what a retrain predicts on the whole class, held-out rows included, so neither the accuracy against
    the original nor the membership test against validation rows of that class can see it.
    -> (checks, failures in words)."""
    checks: dict[str, Check] = {}
    failures: list[str] = []
    if max_class_share is not None and class_share is not None:
        ok = class_share <= max_class_share + 1e-12
        checks["class_share/forget"] = Check(class_share, "<=", max_class_share, ok, BUSINESS)
        if not ok:
            failures.append(f"the forget rows hold {class_share:.0%} of one class's training rows (> "
                            f"validation.qualified_max_class_share = {max_class_share}): a class-level request is "
                            f"never licensed")
    if max_drop is not None:
        for s in ("adjacent", "remote", "validation"):
            acc, orig = metrics.get(K.key("acc", s)), metrics.get(K.key("original_acc", s))
            if acc is None or orig is None or math.isnan(acc) or math.isnan(orig):
                continue
            ok = acc >= orig - max_drop - 1e-12
            checks[K.key("acc_vs_original", s)] = Check(acc, ">=", round(orig - max_drop, 6), ok, BUSINESS)
            if not ok:
                failures.append(f"acc/{s} = {acc:.4f} (needs >= the original's {orig:.4f} - {max_drop})")
    ok = not (membership_p < alpha)
    checks["membership_pvalue/forget_vs_validation"] = Check(membership_p, ">=", alpha, ok, STATISTICAL)
    if not ok:
        failures.append(f"membership test forget vs validation: p = {membership_p:.4g} < {alpha} (the forget rows "
                        f"still look like training rows)")
    return checks, failures


# --- which mode the model's size calls for --------------------------------------------------------------------

PER_BATCH_SECONDS = 600.0  # a per-batch certificate past 10 minutes a batch: qualify once instead


def advise_mode(certificate_retrains: float, retrain_seconds: float, mode: str,
                exact_only: tuple[str, ...] = ()) -> tuple[str, str]:
    """The mode a model of this size calls for, and why in words: per_batch while certifying one approximate
    candidate (`certificate_retrains`: its references, in retrains, all looks) takes at most PER_BATCH_SECONDS;
    qualified past it, where a batch's certificate costs far more than the retrain it is meant to avoid.
    `mode`: validation.mode as configured (the advice says whether it agrees). `exact_only`: the candidates,
    when every one is exact (sisa on a sharded original, retrain): no batch certifies anything, so the mode
    changes nothing and the advice is the configured mode."""
    if exact_only:
        return mode, (f"mode: {mode} as configured, and either mode does the same here: the only candidate(s) "
                      f"({', '.join(exact_only)}) are exact, so no batch certifies an approximate candidate")
    seconds = certificate_retrains * retrain_seconds
    advice = "per_batch" if seconds <= PER_BATCH_SECONDS else "qualified"
    from unlearning.planning.costs import sig

    why = (f"certifying an approximate candidate trains about {sig(certificate_retrains)} retrains' worth of "
           f"references ({sig(seconds)} s at {sig(retrain_seconds, 3)} s a retrain): "
           + ("cheap enough to certify every batch" if advice == "per_batch" else
              f"more than {PER_BATCH_SECONDS:.0f} s a batch: qualify the model once (`dvc repro qualify`) and audit "
              f"sampled batches"))
    agrees = "as configured" if advice == mode else f"validation.mode is {mode}"
    return advice, f"mode: {advice} suits this model ({agrees}): {why}"


# --- the audit schedule --------------------------------------------------------------------------------------

def audit_due(every: int | None, probability: float | None, seed: int, batch_index: int) -> bool:
    """Whether the batch at `batch_index` (0 = the first) is audited: every `every`-th batch (batch 0, k, 2k,
    ...), or with `probability`, drawn from the batch's own seeded stream, so a rerun audits the same batches."""
    if every is not None:
        return batch_index % int(every) == 0
    if probability is not None:
        u = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(AUDIT_STREAM, int(batch_index)))).random()
        return bool(u < probability)
    return False


def audit_status(records: list[dict]) -> dict:
    """What `unlearn status` says of the qualified mode, from state/audits.jsonl's records: the qualified versions
    no audit has looked at yet, and the audits (oldest first), each with what it changed."""
    audited = {r["version"] for r in records if r.get("kind") == "audit"}
    unaudited = [r["version"] for r in records if r.get("kind") == "promoted" and r["version"] not in audited]
    audits = [{"version": r["version"], "batch_id": r["batch_id"], "method": r["method"], "passed": r["passed"],
               "references": r.get("references"), "audited_at": r.get("audited_at"),
               "exact_retrain_version": (r.get("then") or {}).get("exact_retrain_version")}
              for r in records if r.get("kind") == "audit"]
    return {"unaudited_versions": unaudited, "audits": audits, "failed": sum(not a["passed"] for a in audits)}


def audit_lines(status: dict) -> list[str]:
    """`audit_status` in words."""
    if not status["audits"] and not status["unaudited_versions"]:
        return []
    un = status["unaudited_versions"]
    lines = [f"qualified versions not audited: {', '.join(f'v{v}' for v in un) if un else 'none'}; audits: "
             f"{len(status['audits'])}, {status['failed']} failed"]
    for a in status["audits"][-5:]:
        lines.append(f"  audit of v{a['version']} ({a['method']}, {a['references']} references, {a['audited_at']}): "
                     + ("passed" if a["passed"] else f"FAILED -> exact retrain v{a['exact_retrain_version']}"))
    return lines


# --- the stored qualification --------------------------------------------------------------------------------

@dataclass
class Qualification:
    """What the qualify stage stores (state/qualification.json): the trials, the table, how it was computed,
    and what it was computed for (the model's fingerprint)."""

    methods: list[str]
    bins: list[float]
    confidence: float
    interval: str
    noise: float  # the noise unit the gaps are read in (unlearning/policy/selection.py noise_floor of validation rows)
    trials: list[Trial] = field(default_factory=list)
    fingerprint: dict = field(default_factory=dict)
    skipped: str | None = None  # why nothing was qualified (validation.mode per_batch)
    unfilled: list[str] = field(default_factory=list)  # bins left under qualify.min_sets_per_bin, in words
    # a method's run on one model in retrains, timed on this model (tasks/planning.py probe); {} = not timed
    method_retrains: dict[str, float] = field(default_factory=dict)

    @property
    def table(self) -> list[Row]:
        return pass_rate_table(self.trials, self.methods, self.bins, self.confidence, self.interval)

    def by_cost(self) -> list[str]:
        """The methods cheapest first: by their timed cost on this model where it was measured (a count of
        gradient evaluations misprices them: a GGN solve or an autograd step against the fused retrain kernel),
        in the declared order otherwise (stable: the timed ones first, then the others as declared)."""
        timed = sorted((m for m in self.methods if m in self.method_retrains), key=lambda m: self.method_retrains[m])
        return timed + [m for m in self.methods if m not in self.method_retrains]

    def with_trial(self, trial: Trial) -> "Qualification":
        """The qualification with one more trial (a failed or passed audit counts as evidence)."""
        return Qualification(self.methods, self.bins, self.confidence, self.interval, self.noise,
                             [*self.trials, trial], dict(self.fingerprint), self.skipped, list(self.unfilled),
                             dict(self.method_retrains))

    def to_dict(self) -> dict:
        return {"methods": self.methods, "bins": self.bins, "confidence": self.confidence, "interval": self.interval,
                "noise": self.noise, "fingerprint": self.fingerprint, "skipped": self.skipped,
                "unfilled": self.unfilled,
                "method_retrains": self.method_retrains,
                "trials": [asdict(t) for t in self.trials],
                "table": [{**asdict(r), "gap_hi": None if math.isinf(r.gap_hi) else r.gap_hi,
                           "rate": None if math.isnan(r.rate) else r.rate} for r in self.table]}

    @classmethod
    def from_dict(cls, d: dict) -> "Qualification":
        return cls(list(d["methods"]), list(d["bins"]), float(d["confidence"]), d["interval"], float(d["noise"]),
                   [Trial(**t) for t in d.get("trials", [])], dict(d.get("fingerprint") or {}), d.get("skipped"),
                   list(d.get("unfilled") or []),
                   {k: float(v) for k, v in (d.get("method_retrains") or {}).items()})

    def tag(self) -> str:
        """A short name of this qualification, for the registered version's tag."""
        passes = {m: sum(t.passed for t in self.trials if t.method == m) for m in self.methods}
        n = {m: sum(t.method == m for t in self.trials) for m in self.methods}
        return "; ".join(f"{m} {passes[m]}/{n[m]}" for m in self.methods)
