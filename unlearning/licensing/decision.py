"""Licensed inaction, row by row (docs/design.md §4.9; docs/certificate.md, "Licensed inaction"): the rule that
lets an erasure request leave the model unchanged because the model never memorized its rows.

A request of k training rows is licensed when
- every row's map score (unlearning/licensing/memorization.py: its IN-versus-OUT epsilon upper bound) is at most the cut
  fitted for requests of k rows, on calibration rows, before any request arrives (never on the request itself);
- it is not a class: its rows take at most `max_class_share` of any class's training rows;
- it is not a cluster: at most `max_adjacent_share` of its rows have another of its rows among their
  `k_neighbors` nearest training rows (a cluster's joint effect is larger than any of its rows');
- and the licensed rows since the last exact retrain stay within the licensing debt.
Everything else takes the exact path.

The cut. An audit (the gate with fresh oracles at the gate's budget) fails a licensed request when one of its
rows' epsilon upper bound exceeds the budget (the gate's quantile over a few rows is their largest). For a row
whose IN and OUT statistics are Gaussians mu apart, the chance of that is the gate's operating characteristic
f(mu) (`audit_operating_characteristic`: the gate's own estimator run on simulated Gaussians at the audit's
references, confidence and budget). A calibration row's failure probability is f at its map mu (half-data
members memorize a little more than full-data ones: conservative), a real audit's outcome (0 or 1) where one
was run. The cut for k rows is the largest calibration score t whose licensed rows (score <= t) keep the
request's predicted false-accept rate 1 - (1 - p(t))^k at most the target, p(t) their mean failure
probability (`fit_cuts`). A failed audit lowers the cut below the failing rows (`lowered`).

Pure: numpy (and the metrics' estimators), no shell.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from unlearning.licensing.memorization import quiet_cpu
from unlearning.metrics.epsilon import gdp_epsilon, row_epsilon
from unlearning.certificate.qualification import largest_class_share

def operating_grid(budget: float, delta: float, points: int = 31) -> np.ndarray:
    """The mu values the operating characteristic is simulated at: 0 to 1.5 mu_b + 0.5, mu_b the separation whose
    epsilon is the budget (past it a row's bound exceeds the budget whatever the noise)."""
    lo, hi = 0.0, 1.0
    while gdp_epsilon(hi, delta)[0] < budget:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gdp_epsilon(mid, delta)[0] < budget else (lo, mid)
    return np.linspace(0.0, 1.5 * hi + 0.5, points)


def audit_operating_characteristic(mu_grid, n_references: int, budget: float, delta: float, confidence: float,
                                   estimator: str, *, n_bootstrap: int = 200, sims: int = 200,
                                   seed: int = 0) -> np.ndarray:
    """f(mu) [len(mu_grid)]: the probability that the gate's per-row epsilon upper bound (its `estimator` at
    one-sided `confidence`, `n_references` shadows against as many oracles) exceeds `budget` for a row whose
    shadow and oracle statistics are N(mu, 1) and N(0, 1); `sims` simulated rows per mu, seeded."""
    grid = np.asarray(mu_grid, dtype=np.float64)
    if grid.ndim != 1 or (grid < 0).any():
        raise ValueError(f"mu_grid: expected non-negative values, got {grid}")
    rng = np.random.default_rng(seed)
    shift = np.repeat(grid, sims)  # [G * sims]: one simulated row per column
    u = rng.standard_normal((n_references, shift.size)) + shift
    r = rng.standard_normal((n_references, shift.size))
    with quiet_cpu():
        upper = row_epsilon(u, r, estimator, delta, confidence, n_bootstrap=n_bootstrap, seed=seed).upper
    return (upper > budget).reshape(grid.size, sims).mean(1)


def debiased_mu(mu, n_in: int, n_out: int) -> np.ndarray:
    """mu with the upward bias of |mean difference| removed: for unit-variance samples of n_in and n_out values,
    E[d^2] = mu^2 + 1/n_in + 1/n_out, so sqrt(max(d^2 - 1/n_in - 1/n_out, 0)) (0 for a row indistinguishable
    from noise)."""
    mu = np.asarray(mu, dtype=np.float64)
    return np.sqrt(np.maximum(mu * mu - (1.0 / n_in + 1.0 / n_out), 0.0))


def fail_probability(mu, mu_grid, oc) -> np.ndarray:
    """f at each row's mu, read off the operating characteristic (linear between grid points; past the grid, or
    a NaN mu: certain failure)."""
    mu = np.asarray(mu, dtype=np.float64)
    grid = np.asarray(mu_grid, float)
    p = np.interp(np.nan_to_num(mu, nan=np.inf), grid, np.asarray(oc, float))
    return np.where(np.isfinite(mu) & (mu <= grid[-1]), p, 1.0)


def request_false_accept(row_fail: float, k: int) -> float:
    """The chance that a request of k rows, each failing its audit independently with `row_fail`, fails."""
    return 1.0 - (1.0 - row_fail) ** k


@dataclass(frozen=True)
class Cuts:
    """The cut per request size: `by_rows[k - 1]` for a request of k rows (None: no cut keeps the target, such a
    request is never licensed); requests of more than len(by_rows) rows are never licensed. `target`: the
    false-accept rate fitted for; `calibration_rows`: rows it was fitted on; `lowered_by`: how many failed
    audits lowered it."""

    by_rows: tuple[float | None, ...]
    target: float
    calibration_rows: int
    lowered_by: int = 0

    def for_rows(self, k: int) -> float | None:
        return self.by_rows[k - 1] if 1 <= k <= len(self.by_rows) else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cuts":
        return cls(tuple(None if c is None else float(c) for c in d["by_rows"]), float(d["target"]),
                   int(d["calibration_rows"]), int(d.get("lowered_by", 0)))


def fit_cuts(scores, fail_prob, target: float, max_rows: int, min_licensed: int = 10,
             cap: float | None = None) -> Cuts:
    """The cut for each request size 1..max_rows (module docstring): the largest calibration score t (at most
    `cap`: the budget, when the score is an epsilon, so a licensed row's own bound is within it) such that the rows
    scoring at most t are at least `min_licensed` and their mean failure probability p(t) keeps
    1 - (1 - p(t))^k <= target. scores [m], fail_prob [m] (f(mu) or an audit's 0/1)."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.asarray(fail_prob, dtype=np.float64)
    if s.shape != p.shape or s.ndim != 1:
        raise ValueError(f"scores {list(s.shape)} and fail_prob {list(p.shape)}: expected two [m] arrays")
    if not 0 < target < 1:
        raise ValueError(f"target = {target}: expected a false-accept rate in (0, 1)")
    keep = np.isfinite(s) & (s <= (np.inf if cap is None else cap))
    s, p = s[keep], p[keep]
    order = np.argsort(s, kind="stable")
    s, p = s[order], p[order]
    # rows scoring at most s[i]: every row up to the last one tied with s[i]
    last_of_tie = np.searchsorted(s, s, side="right") - 1
    count = last_of_tie + 1
    mean_fail = np.cumsum(p)[last_of_tie] / count
    cuts: list[float | None] = []
    for k in range(1, max_rows + 1):
        ok = (count >= min_licensed) & (1.0 - (1.0 - mean_fail) ** k <= target)
        cuts.append(float(s[ok].max()) if ok.any() else None)
    return Cuts(tuple(cuts), float(target), int(s.size))


def lowered(cuts: Cuts, failing_scores) -> Cuts:
    """The cuts after a failed audit: each cut below the smallest score of the rows that failed it, so none of
    them (nor any row scoring as high) is licensed again."""
    limit = float(np.min(np.asarray(failing_scores, dtype=np.float64)))
    below = math.nextafter(limit, -math.inf)
    return Cuts(tuple(None if c is None else (c if c < limit else below) for c in cuts.by_rows), cuts.target,
                cuts.calibration_rows, cuts.lowered_by + 1)


def map_paid(licensed: int, decided: int, cost_retrains: float, min_decided: int = 10) -> bool:
    """Whether a map paid for itself, so a stale one is worth building again: each licensed request saved about
    one retrain, against the map's cost in retrains. Fewer than `min_decided` requests decided: too early to say
    (it counts as paid)."""
    return decided < min_decided or licensed >= cost_retrains


def adjacent_share(request_positions, neighbours) -> float:
    """The share of a request's rows with another of its rows among their nearest training rows.
    request_positions [r]; neighbours [r, k]: each request row's k nearest rows (positions, itself excluded)."""
    pos = np.asarray(request_positions)
    if pos.size < 2:
        return 0.0
    nb = np.asarray(neighbours)
    return float(np.isin(nb, pos).any(1).mean())


def nearest_rows(query, reference, query_positions, k: int, block: int = 1024) -> np.ndarray:
    """[r, k]: the positions in `reference` [n, d] of each query row's k nearest rows (Euclidean), the query
    row itself (`query_positions` [r], its position in `reference`) excluded. float64 distances, in blocks."""
    q = np.asarray(query, dtype=np.float64).reshape(len(query), -1)
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    k = min(k, len(ref) - 1)
    out = np.empty((len(q), k), dtype=np.int64)
    ref_sq = (ref * ref).sum(1)
    for lo in range(0, len(q), block):
        qb = q[lo:lo + block]
        d = (qb * qb).sum(1)[:, None] - 2 * qb @ ref.T + ref_sq[None, :]
        d[np.arange(len(qb)), np.asarray(query_positions)[lo:lo + block]] = np.inf
        part = np.argpartition(d, k - 1, axis=1)[:, :k] if k < d.shape[1] else np.argsort(d, 1)[:, :k]
        rows = np.arange(len(qb))[:, None]
        out[lo:lo + block] = part[rows, np.argsort(d[rows, part], axis=1, kind="stable")]
    return out


@dataclass(frozen=True)
class Guards:
    """The limits a licence checks besides the cut (params' `licensing:` section)."""

    max_class_share: float
    max_adjacent_share: float
    max_debt_rows: int | None  # licensed rows since the last exact retrain, this request's included (None: off)


@dataclass(frozen=True)
class LicenceDecision:
    """Which path a request takes and why: `licensed` (the model stays unchanged) or the exact path.
    `scores` [k]: the request's rows' map scores (its order); `cut`: the cut for k rows (None: none fits);
    `reasons`: why not licensed, in words (empty when licensed)."""

    licensed: bool
    reasons: tuple[str, ...]
    rows: int
    scores: tuple[float, ...]
    cut: float | None
    budget: float
    class_share: float
    adjacent_share: float
    debt_rows: int
    score_kind: str = "upper"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def path(self) -> str:
        return "licensed" if self.licensed else "exact"

    def line(self) -> str:
        """The decision in one line (console, `unlearn plan`, the batch summary)."""
        top = max(self.scores) if self.scores else float("nan")
        cut = "none fits" if self.cut is None else f"{self.cut:.3g}"
        if self.licensed:
            return (f"licensed: model unchanged: every row's map epsilon {self.score_kind} bound <= the cut {cut} for "
                    f"{self.rows} row(s) (largest {top:.3g}; gate budget {self.budget:g}); class share "
                    f"{self.class_share:.2f}, adjacent share {self.adjacent_share:.2f}")
        return f"exact path: {'; '.join(self.reasons)}"

    def to_dict(self) -> dict:
        return {**asdict(self), "path": self.path}


def decide(scores, cuts: Cuts | None, budget: float, labels, training_labels, adjacent: float, guards: Guards,
           debt_rows: int, score_kind: str = "upper") -> LicenceDecision:
    """The licence of one request (module docstring). scores [k]: its rows' map scores (NaN: a row the map does
    not hold); labels [k] its rows' classes, training_labels the classes of every training row before it;
    `adjacent`: its adjacent share (`adjacent_share`); `debt_rows`: licensed rows since the last exact retrain,
    before this request."""
    s = np.asarray(scores, dtype=np.float64)
    k = int(s.size)
    share = largest_class_share(np.asarray(labels), np.asarray(training_labels))
    cut = cuts.for_rows(k) if cuts is not None and k else None
    reasons = []
    if k == 0:
        reasons.append("no training row to license")
    if cuts is None:
        reasons.append("no memorization map for this model version")
    elif cut is None:
        reasons.append(f"no cut keeps the audited false-accept rate within {cuts.target:g} for a request of {k} "
                       f"row(s) (cuts fitted up to {len(cuts.by_rows)} rows)")
    missing = int(np.isnan(s).sum())
    if missing:
        reasons.append(f"{missing} row(s) have no map entry")
    above = int(np.sum(s[~np.isnan(s)] > cut)) if cut is not None else 0
    if above:
        reasons.append(f"{above} of {k} row(s) have a map epsilon {score_kind} bound above the cut {cut:.3g} (largest "
                       f"{np.nanmax(s):.3g}; memorized rows: a retrain moves them)")
    if share > guards.max_class_share:
        reasons.append(f"a class-level request: its rows take {share:.0%} of a class's training rows (more than "
                       f"licensing.max_class_share = {guards.max_class_share:g})")
    if adjacent > guards.max_adjacent_share:
        reasons.append(f"a cluster of adjacent rows: {adjacent:.0%} of its rows have another of its rows among their "
                       f"nearest neighbours (more than licensing.max_adjacent_share = {guards.max_adjacent_share:g})")
    if guards.max_debt_rows is not None and debt_rows + k > guards.max_debt_rows:
        reasons.append(f"{debt_rows} row(s) licensed since the last exact retrain plus these {k} exceed "
                       f"licensing.max_debt_rows = {guards.max_debt_rows}: the retraining debt is due")
    return LicenceDecision(not reasons, tuple(reasons), k, tuple(float(x) for x in s), cut, float(budget), share,
                           float(adjacent), int(debt_rows), score_kind)
