"""Margins and logit-scaled confidences of classifier outputs.

docs/design.md §4.2 (KLoM, "Ascent Fails to Forget" / "Attribute-to-Delete"): the margin of a model on (x, y) is
z_y - logsumexp_{j != y} z_j. It equals log(p_y / (1 - p_y)) with p = softmax(z), i.e. the
"logit-scaled confidence" of LiRA and of the NeurIPS 2023 Machine Unlearning challenge scorer, so the two
share one kernel here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_f64, as_labels, require_finite


def margins(logits: Any, labels: Any) -> np.ndarray:
    """Margin z_y - logsumexp_{j != y} z_j per sample, float64.

    logits: [..., n, C] numpy array or torch tensor (leading model dims allowed, e.g. [N, n, C]).
    labels: [n] integer classes. Returns float64 numpy of shape [..., n] (leading dims kept).

    Computed in float64 with the max of the other logits subtracted before exp, so it is exact for
    logits of any finite size (no softmax probability is formed: log(p_y/(1-p_y)) via probabilities
    saturates once p_y rounds to 1).
    """
    z = as_f64(logits, "logits")
    if z.ndim < 2:
        raise ValueError(f"logits: expected shape [..., n, C], got {list(z.shape)}")
    n, n_classes = z.shape[-2], z.shape[-1]
    if n_classes < 2:
        raise ValueError(f"logits: a margin needs at least 2 classes, got C={n_classes}")
    require_finite(z, "logits")
    y = as_labels(labels, n, n_classes)
    # z_y: [..., n]
    idx = np.broadcast_to(y[:, None], z.shape[:-1] + (1,))
    z_y = np.take_along_axis(z, idx, axis=-1)[..., 0]
    # logsumexp over the other classes: mask the true class with -inf, shift by the max of the rest.
    is_y = y[:, None] == np.arange(n_classes)[None, :]  # [n, C], broadcasts over leading dims
    others = np.where(is_y, -np.inf, z)
    m = others.max(axis=-1, keepdims=True)  # finite: C >= 2 and logits finite
    lse = m[..., 0] + np.log(np.exp(others - m).sum(axis=-1))
    return z_y - lse


def logit_scaled_confidence(logits: Any, labels: Any) -> np.ndarray:
    """Logit-scaled confidence s = log(p_y / (1 - p_y)), p = softmax(logits); shape [..., n], float64.

    This is the score of the NeurIPS 2023 Machine Unlearning challenge (DeepMind's evaluation code,
    `compute_logit_scaled_confidence`, adapted there from the LiRA code base), which computes
    log(p_y + 1e-45) - log(sum_{j != y} p_j + 1e-45) from float64 probabilities. Algebraically this is
    the margin z_y - logsumexp_{j != y} z_j, which we compute directly: identical wherever the challenge
    code does not saturate (|s| below about 100), and exact beyond.
    """
    return margins(logits, labels)
