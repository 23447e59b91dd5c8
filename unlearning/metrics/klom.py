"""KLoM: KL divergence of margins between unlearned models and oracle retrains (docs/design.md §4.2).

Origin: "Attribute-to-Delete" (Georgiev et al.), used in "Ascent Fails to Forget". The public reference
implementation is `compute_binned_KL_div` / `kl_from_margins` in RoyRin/data-unlearning-bench
(`unlearning_bench/eval.py`); this module is a vectorized re-implementation checked against a per-sample
loop of that procedure in tests/unit/test_metrics_klom.py.

Per sample s, with p = margins of the unlearned models [N_u] and q = margins of the oracles [N_o]:
  1. clip both to [-100, 100];
  2. edges = linspace(lo, hi, 21), lo/hi = min/max of p and q together; if lo >= hi then hi = lo + 1;
  3. bins are right-open [e_i, e_{i+1}) exactly as numpy.digitize assigns them, so a value equal to hi
     is in no bin and is not counted;
  4. probabilities = counts / counted total, for each side separately;
  5. q = max(q, 1e-5) where p > 0;
  6. KL = sum over p > 0 of p log(p / q) (natural log), direction KL(unlearned || oracle).

Two cases docs/design.md §4.2 does not spell out, decided as the reference implementation behaves:
  * nothing of the unlearned side is counted (all its clipped margins equal hi, i.e. every unlearned
    model sits at one value above all the oracles): the reference returns nan (scipy's entropy of an
    all-zero p). We return nan too; `split_summary` then reports nan p95/mean for that split and counts
    the sample in `n_undefined` (fail closed). This is a real mismatch, not a "0".
  * nothing of the oracle side is counted: q is all zeros, floored to 1e-5 where p > 0, so KL is large.
The reference passes the floored q to scipy.stats.entropy, which renormalizes q to sum 1; docs/design.md §4.2 does
not renormalize. The difference is at most log(1 + 20 * 1e-5) ~ 2e-4 except when q has no counted mass.
Default follows docs/design.md §4.2 (`normalize_q=False`); `normalize_q=True` reproduces the reference numbers exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_model_by_sample
from .summary import split_summary

CLIP = 100.0
N_BINS = 20
Q_FLOOR = 1e-5


def _bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """numpy.digitize index per value: x [N, n], edges [B+1, n] -> int64 [N, n] in 0..B+1 (1..B are bins)."""
    idx = np.zeros(x.shape, dtype=np.int64)
    for e in range(edges.shape[0]):
        idx += x >= edges[e][None, :]
    return idx


def _edges(p_m: np.ndarray, q_m: np.ndarray) -> np.ndarray:
    """Per-sample bin edges [B+1, n] from the clipped margins of both sides (steps 2 of the module docstring)."""
    lo = np.minimum(p_m.min(axis=0), q_m.min(axis=0))  # [n]
    hi = np.maximum(p_m.max(axis=0), q_m.max(axis=0))
    hi = np.where(lo >= hi, lo + 1.0, hi)
    # Same values as np.linspace(lo[s], hi[s], 21) per sample (checked in tests).
    return np.linspace(lo, hi, N_BINS + 1, axis=0)


def kl_from_counts(p_counts: np.ndarray, q_counts: np.ndarray, *, normalize_q: bool = False) -> np.ndarray:
    """Steps 4-6 of the module docstring on bin counts [..., n, B] (float64) -> KL [..., n] (nan: no p mass)."""
    p_total = p_counts.sum(axis=-1, keepdims=True)
    q_total = q_counts.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(p_total > 0, p_counts / np.where(p_total > 0, p_total, 1.0), 0.0)
        q = np.where(q_total > 0, q_counts / np.where(q_total > 0, q_total, 1.0), 0.0)
    support = p > 0
    q = np.where(support, np.maximum(q, Q_FLOOR), q)
    if normalize_q:
        q = q / q.sum(axis=-1, keepdims=True)
    terms = np.where(support, p * np.log(np.where(support, p, 1.0) / np.where(support, q, 1.0)), 0.0)
    kl = terms.sum(axis=-1)
    return np.where(p_total[..., 0] == 0, np.nan, kl)


def _bin_counts(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per bin: x [N, n], edges [B+1, n] (per-sample, non-decreasing) -> int64 [n, B].

    numpy.digitize(v, edges) with increasing edges and right=False is searchsorted(edges, v, 'right'),
    i.e. the number of edges <= v; bin k (1..B) is [e_{k-1}, e_k). Index B+1 means v >= hi: not counted.
    The loop is over the B+1 edges, never over samples.
    """
    n_edges, n = edges.shape
    idx = np.zeros(x.shape, dtype=np.int64)  # [N, n]
    for e in range(n_edges):
        idx += x >= edges[e][None, :]
    n_slots = n_edges + 1  # digitize indices 0..B+1
    flat = idx + n_slots * np.arange(n, dtype=np.int64)[None, :]
    counts = np.bincount(flat.ravel(), minlength=n_slots * n).reshape(n, n_slots)
    return counts[:, 1:n_edges]  # bins 1..B


def klom(
    unlearned_margins: Any,
    oracle_margins: Any,
    *,
    normalize_q: bool = False,
) -> np.ndarray:
    """KLoM per sample: KL(unlearned || oracle) of binned margins, docs/design.md §4.2. Returns float64 [n_samples].

    unlearned_margins: [N_u, n_samples]; oracle_margins: [N_o, n_samples]; N_u and N_o may differ.
    A sample is nan when none of its unlearned margins falls in a bin (see module docstring).
    normalize_q=True renormalizes the floored q to sum 1, as the public reference (scipy.stats.entropy) does.
    """
    p_raw = as_model_by_sample(unlearned_margins, "unlearned_margins")
    q_raw = as_model_by_sample(oracle_margins, "oracle_margins")
    if p_raw.shape[1] != q_raw.shape[1]:
        raise ValueError(
            f"unlearned_margins has {p_raw.shape[1]} samples but oracle_margins has {q_raw.shape[1]}"
        )
    p_m = np.clip(p_raw, -CLIP, CLIP)
    q_m = np.clip(q_raw, -CLIP, CLIP)
    lo = np.minimum(p_m.min(axis=0), q_m.min(axis=0))  # [n]
    hi = np.maximum(p_m.max(axis=0), q_m.max(axis=0))
    hi = np.where(lo >= hi, lo + 1.0, hi)
    # Same values as np.linspace(lo[s], hi[s], 21) per sample (checked in tests).
    edges = np.linspace(lo, hi, N_BINS + 1, axis=0)  # [21, n]

    p_counts = _bin_counts(p_m, edges).astype(np.float64)  # [n, 20]
    q_counts = _bin_counts(q_m, edges).astype(np.float64)
    return kl_from_counts(p_counts, q_counts, normalize_q=normalize_q)


def klom_summary(klom_values: Any, split_labels: Any) -> dict[str, dict[str, float]]:
    """Per split present (forget, adjacent, remote, validation, then others): {"p95", "mean", "n", "n_undefined"}.

    docs/design.md §4.2 reports the 95th percentile over the samples of each split, plus the mean.
    """
    return split_summary(klom_values, split_labels)


def oracle_half_klom(oracle_margins: Any, seed: int = 0, *, normalize_q: bool = False) -> np.ndarray:
    """KLoM of oracle half A vs oracle half B, per sample [n_samples] (the noise floor of docs/design.md §4.2).

    The N oracle models are permuted with numpy's default_rng(seed); half A is the first N // 2 of the
    permutation, half B the other N - N // 2. Each half holds about N/2 models, so this floor is 2.4-3x the
    noise of an N-vs-N comparison (measured, bench/calibration.py): judging an N-vs-N KLoM against it is LENIENT. The gate
    no longer uses it: it uses the permutation test of metrics/permutation.py, whose null is the same-size floor.
    """
    q = as_model_by_sample(oracle_margins, "oracle_margins")
    n_models = q.shape[0]
    if n_models < 2:
        raise ValueError(f"oracle_margins: the noise floor needs at least 2 oracle models, got {n_models}")
    perm = np.random.default_rng(seed).permutation(n_models)
    half = n_models // 2
    return klom(q[perm[:half]], q[perm[half:]], normalize_q=normalize_q)


def noise_floor(oracle_margins: Any, split_labels: Any, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per-split summary (as `klom_summary`) of `oracle_half_klom(oracle_margins, seed)`."""
    return split_summary(oracle_half_klom(oracle_margins, seed), split_labels)
