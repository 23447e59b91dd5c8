"""Output gap: how far the unlearned models' predictive distributions are from the oracles' (docs/design.md §4.1
reports a predicted output gap; this is the measured one, in KL units)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_f64, require_finite
from .summary import split_summary


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))


def _as_members(x: Any, name: str) -> np.ndarray:
    z = as_f64(x, name)
    if z.ndim == 2:
        z = z[None]
    if z.ndim != 3:
        raise ValueError(f"{name}: expected shape [n, C] or [N, n, C], got {list(z.shape)}")
    require_finite(z, name)
    return z


def output_gap(unlearned_logits: Any, oracle_logits: Any) -> np.ndarray:
    """Per sample: mean over unlearned members k of KL(softmax(z_k) || mean over oracles of softmax(z_o)).

    Direction KL(unlearned || oracle mixture), the same direction as KLoM (docs/design.md §4.2): large when an
    unlearned model puts mass where the oracles (as an ensemble) put almost none. The oracle side is the
    mixture of the oracle members' predictive distributions (the oracles' posterior predictive), so its
    support is wide and the KL stays finite. Natural log, float64, computed in log space.

    unlearned_logits: [N_u, n, C] or [n, C]; oracle_logits: [N_o, n, C] or [n, C]. Returns float64 [n].
    """
    zu = _as_members(unlearned_logits, "unlearned_logits")
    zo = _as_members(oracle_logits, "oracle_logits")
    if zu.shape[1:] != zo.shape[1:]:
        raise ValueError(
            f"unlearned_logits [.., n, C] = {list(zu.shape[1:])} but oracle_logits has {list(zo.shape[1:])}"
        )
    log_pu = _log_softmax(zu)  # [N_u, n, C]
    log_po = _log_softmax(zo)  # [N_o, n, C]
    # log of the oracle mixture: logsumexp over members - log N_o. [n, C]
    mo = log_po.max(axis=0)
    log_q = mo + np.log(np.exp(log_po - mo[None]).sum(axis=0)) - np.log(zo.shape[0])
    pu = np.exp(log_pu)
    terms = np.where(pu > 0, pu * (log_pu - log_q[None]), 0.0)
    return terms.sum(axis=-1).mean(axis=0)


def output_gap_summary(gap_values: Any, split_labels: Any) -> dict[str, dict[str, float]]:
    """Per split present: {"p95", "mean", "n", "n_undefined"} of `output_gap` values."""
    return split_summary(gap_values, split_labels)
