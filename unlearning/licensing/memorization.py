"""The per-row memorization map of a model version (docs/design.md §4.9; docs/certificate.md, "The map"):
how much the model's behaviour on a training row depends on that row, for every row at once.

N members of the model's architecture train with the declared recipe on random halves of the training rows, as
one vectorized ensemble (LiRA's offline shadows, Carlini et al. 2022; U-LiRA's question, Hayes et al. 2024). The
halves come in complementary pairs, so every row is IN (trained on) for exactly N/2 members and OUT for the other
N/2 (an odd row count leaves one row out of both halves of each pair: such a row is OUT for one more member,
and its surplus OUT members are dropped so every row compares N/2 against N/2).

Per row x, the margins of its IN members and of its OUT members are the two samples of the §4.7 question
"trained on x, or not?": the Gaussian estimator of unlearning/metrics/epsilon.py (reused, not copied) reads
the row's epsilon and its bootstrap bounds through the Gaussian-DP curve. A model that did not memorize x behaves
alike with and without it (epsilon near 0); a memorized row reads large. Half-data members memorize a little
more than full-data ones, so the map leans conservative.

The training loss of the model on each row is the free fallback score (no member trained): a memorized row
tends to have a low loss IN and a high one OUT, but the loss alone does not see the OUT side.

Pure: numpy and torch (through the metrics), no shell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unlearning.metrics.epsilon import RowEpsilon, gaussian_epsilon, gaussian_mu
from unlearning.metrics.margins import margins as margins_of
from unlearning.models.training import flush_denormals, intra_op_threads

class quiet_cpu:
    """One intra-op thread and float denormals flushed while the Gaussian-DP curve is inverted on the CPU: its
    bisection drives e^eps Phi(.) into the denormal range, where CPU arithmetic is ~100x slower (measured: the
    operating characteristic took 51 s with denormals, 2.8 s without; the values change by less than 1e-300)."""

    def __enter__(self):
        self._threads, self._denormals = intra_op_threads(1), flush_denormals(True)
        self._threads.__enter__()
        self._denormals.__enter__()
        return self

    def __exit__(self, *exc):
        self._denormals.__exit__(*exc)
        self._threads.__exit__(*exc)
        return False


MIN_MEMBERS = 4  # two complementary pairs: the fewest that give every row two IN and two OUT margins


def half_splits(n_rows: int, n_members: int, seed: int) -> np.ndarray:
    """[n_members, n_rows] bool: member k trains on row j where True. Members 2i and 2i+1 hold complementary
    random halves of floor(n_rows / 2) rows each (an odd count leaves one random row out of both); seeded."""
    if n_members < MIN_MEMBERS or n_members % 2:
        raise ValueError(f"the memorization map needs an even number of members, at least {MIN_MEMBERS} (complementary "
                         f"pairs of halves), got {n_members}")
    if n_rows < 4:
        raise ValueError(f"the memorization map needs at least 4 training rows, got {n_rows}")
    rng = np.random.default_rng(seed)
    half = n_rows // 2
    mask = np.zeros((n_members, n_rows), dtype=bool)
    for pair in range(n_members // 2):
        order = rng.permutation(n_rows)
        mask[2 * pair, order[:half]] = True
        mask[2 * pair + 1, order[half:2 * half]] = True
    return mask


def member_rows(in_mask: np.ndarray) -> np.ndarray:
    """[N, m] int64: each member's training rows (positions), m the same for every member (half_splits's)."""
    counts = in_mask.sum(1)
    if (counts != counts[0]).any():
        raise ValueError(f"every member must train on the same number of rows, got {sorted(set(counts.tolist()))}")
    return np.stack([np.flatnonzero(r) for r in in_mask]).astype(np.int64)


def in_out_samples(values: np.ndarray, in_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the values of its IN members and of its OUT members: (U [k, n], R [k, n]), k the fewest IN or OUT
    members any row has (N/2 with half_splits); a row with more keeps its first k (members are exchangeable).
    `values` [N, n] (a statistic of each member on each row), `in_mask` [N, n]."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != in_mask.shape:
        raise ValueError(f"values {list(values.shape)} and in_mask {list(in_mask.shape)} must have the same shape")
    k = int(min(in_mask.sum(0).min(), (~in_mask).sum(0).min()))
    if k < 2:
        raise ValueError(f"every row needs at least 2 IN and 2 OUT members, the fewest has {k}")
    # a stable argsort puts the IN members (key False) first, in member order: the first k are the row's IN ones
    take_in = np.argsort(~in_mask, axis=0, kind="stable")[:k]  # [k, n] member indices
    take_out = np.argsort(in_mask, axis=0, kind="stable")[:k]
    return np.take_along_axis(values, take_in, 0), np.take_along_axis(values, take_out, 0)


@dataclass(frozen=True)
class MemorizationMap:
    """A model version's map: per training row (positions in `rows`' order) the IN-versus-OUT epsilon with its
    one-sided bounds at `confidence`, the Gaussian separation `mu` (|mean difference| / pooled sd), and the
    model's training loss (the fallback score). float64 [n] each."""

    point: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    mu: np.ndarray
    loss: np.ndarray
    n_members: int
    delta: float
    confidence: float

    def __len__(self) -> int:
        return int(self.point.shape[0])

    def score(self, kind: str) -> np.ndarray:
        """The score a licence compares with its cut: the epsilon `upper` bound (the default), the `point`
        estimate, or the training `loss` (the free fallback)."""
        if kind not in ("upper", "point", "loss"):
            raise ValueError(f"score {kind!r} is not known; allowed: ['upper', 'point', 'loss']")
        return getattr(self, kind)

    def share_above(self, budget: float) -> float:
        """The share of rows whose epsilon upper bound exceeds `budget` (the rows the map calls memorized)."""
        return float(np.mean(self.upper > budget)) if len(self) else 0.0


def row_losses(logits, labels) -> np.ndarray:
    """Cross-entropy of one model on each row, float64 [n], from logits [n, C] or [1, n, C]: log-sum-exp minus
    the label's logit (no probability formed)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z[0] if z.ndim == 3 else z
    y = np.asarray(labels, dtype=np.int64)
    top = z.max(1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(1))
    return lse - z[np.arange(len(y)), y]


def memorization_map(member_logits, labels, in_mask: np.ndarray, model_logits, delta: float, confidence: float,
                     *, n_bootstrap: int = 200, seed: int = 0) -> MemorizationMap:
    """The map from the members' logits on the training rows, member_logits [N, n, C] (N members, n rows), the
    rows' labels [n], the members' IN mask [N, n] (half_splits), and the model's own logits [n, C] (its training
    loss). Margins as the certificate reads them (unlearning/metrics/margins.py); the epsilon and its bounds
    by the Gaussian estimator at `delta` and one-sided `confidence` over `n_bootstrap` resamples."""
    m = margins_of(member_logits, labels)  # [N, n]
    U, R = in_out_samples(m, in_mask)
    with quiet_cpu():
        eps: RowEpsilon = gaussian_epsilon(U, R, delta, confidence, n_bootstrap=n_bootstrap, seed=seed)
    return MemorizationMap(point=eps.point, lower=eps.lower, upper=eps.upper, mu=gaussian_mu(U, R),
                           loss=row_losses(model_logits, labels), n_members=int(in_mask.shape[0]), delta=delta,
                           confidence=confidence)


def map_cost_retrains(n_members: int, half_member_retrains) -> float:
    """The map's training cost in retrains of the model: `half_member_retrains(k)` is what a chunk of k members
    on half the rows costs in retrains (the planner's cost curve, unlearning/planning/costs.py)."""
    return float(half_member_retrains(n_members))


def affordable_members(budget_retrains: float, half_member_retrains, smallest: int, largest: int) -> int | None:
    """The most members (even, from `smallest` to `largest`) whose map costs at most `budget_retrains`; None when
    even `smallest` costs more (the map is not affordable: licensing stays off)."""
    best = None
    for n in range(max(MIN_MEMBERS, smallest + smallest % 2), largest + 1, 2):
        if half_member_retrains(n) <= budget_retrains:
            best = n
        else:
            break
    return best
