"""Quality changes said out loud: what a promoted batch cost the model, in words (docs/design.md §4.5).

The gate certifies that a candidate behaves like a retrain without the forgotten rows; it does not say whether
that retrain is still a good model. A batch that deletes every training row of a class promotes a champion that
never predicts it, and a recipe whose seeds disagree widely certifies anything. Three warnings, computed here from
plain numbers (pure: no Prefect, no MLflow):

- `class_lost`: a class had training rows before the batch and has none after it;
- `validation_drop`: the champion's validation accuracy fell by more than `quality.max_validation_drop` against
  the original's (the model the batch started from);
- `unstable_recipe`: the oracles' (exact retrains with different seeds) validation accuracies spread wider than
  `quality.max_oracle_spread` (max - min). A batch that trains no oracles skips this one.

`quality.refuse` lists the warnings a team wants to stop the batch instead (`refused`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

WARNING_KINDS = ("class_lost", "validation_drop", "unstable_recipe")
VALIDATION = "validation"  # the held-out split's name in the per-split accuracies (unlearning/batch/rows.py SPLITS)


@dataclass(frozen=True)
class QualityWarning:
    kind: str  # one of WARNING_KINDS
    message: str  # one sentence, with the numbers and the params key that set the tolerance

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class QualityFacts:
    """What a batch changed, as plain numbers."""

    original_accuracy: Mapping[str, float]  # {split: accuracy} of the model the batch started from
    champion_accuracy: Mapping[str, float]  # {split: accuracy} of the candidate about to be promoted
    class_counts_before: Mapping[str, int]  # {class name: training rows} before the batch
    class_counts_after: Mapping[str, int]  # {class name: training rows} after it (the retain set)
    oracle_validation_accuracies: Sequence[float] | None = None  # one per oracle; None: no oracle was trained


def class_counts(labels: np.ndarray, class_names: Sequence[str]) -> dict[str, int]:
    """{class name: rows} of integer labels [n] (every class, 0 when absent)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(class_names))
    return {str(name): int(counts[i]) for i, name in enumerate(class_names)}


def lost_classes(before: Mapping[str, int], after: Mapping[str, int]) -> list[QualityWarning]:
    return [QualityWarning("class_lost", f"the champion can no longer predict {name!r}: this batch removed the last "
                                         f"{n} training row(s) of that class")
            for name, n in before.items() if n > 0 and after.get(name, 0) == 0]


def validation_drop(original: Mapping[str, float], champion: Mapping[str, float],
                    tolerance: float | None) -> list[QualityWarning]:
    a, b = original.get(VALIDATION), champion.get(VALIDATION)
    if tolerance is None or a is None or b is None or not np.isfinite([a, b]).all() or a - b <= tolerance:
        return []
    return [QualityWarning("validation_drop", f"validation accuracy fell from {a:.3f} (the original) to {b:.3f} "
                                              f"({b - a:+.3f}), more than quality.max_validation_drop = {tolerance}")]


def unstable_recipe(oracle_accuracies: Sequence[float] | None, tolerance: float | None) -> list[QualityWarning]:
    accs = np.asarray([a for a in (oracle_accuracies or []) if np.isfinite(a)], dtype=np.float64)
    if tolerance is None or len(accs) < 2 or accs.max() - accs.min() <= tolerance:
        return []
    lo, hi = float(accs.min()), float(accs.max())
    return [QualityWarning("unstable_recipe", f"the recipe is unstable: seeds give {lo:.2f}-{hi:.2f} validation "
                                              f"accuracy across the oracle retrains (spread {hi - lo:.2f} > "
                                              f"quality.max_oracle_spread = {tolerance}); a model trained with it "
                                              f"depends on its seed more than on the data")]


def entangled_accuracies(candidate_logits, original_logits, labels: np.ndarray, splits: np.ndarray,
                         remote_validation: np.ndarray | None) -> dict[str, float]:
    """The candidate's and the original's accuracy on the validation rows the batch does not entangle
    (`acc/validation_remote`, what the gate's validation floors compare: unlearning/certificate/gate.py) and on those it does
    (`acc/validation_adjacent`, reported, not gated), with their sizes (`n/...`). Logits [N, n, C] (or [n, C])
    over the evaluated rows; `splits` [n] their split names; `remote_validation` [n] bool (unlearning/batch/rows.py
    BatchRows.remote_validation; None: not known, nothing measured). A subset with no row is left out: the
    floors then read the whole validation split."""
    if remote_validation is None:
        return {}
    from unlearning.metrics import accuracy_by_split

    remote = np.asarray(remote_validation, dtype=bool)
    val = np.asarray(splits) == VALIDATION
    part = np.where(val & remote, "validation_remote", np.where(val, "validation_adjacent", ""))
    keep = part != ""
    out: dict[str, float] = {}
    for prefix, logits in (("acc", candidate_logits), ("original_acc", original_logits)):
        kept = logits[..., keep, :]
        out.update({f"{prefix}/{s}": v for s, v in accuracy_by_split(kept, labels[keep], part[keep]).items()})
    for s in ("validation_remote", "validation_adjacent"):
        if (part == s).any():
            out[f"n/{s}"] = float((part == s).sum())
    return out


# What a batch's accuracy changes are reported on, in this order: the split's metric suffix, how a person reads
# it. The rows a batch entangles change by construction; the gate's validation floors compare the validation rows
# it does not entangle (or every validation row, when it entangles them all: unlearning/certificate/gate.py).
ACCURACY_CHANGES = (("forget", "the forgotten rows"), ("adjacent", "retained rows entangled with them"),
                    ("validation_adjacent", "validation rows entangled with them"),
                    ("validation_remote", "validation rows not entangled"), ("validation", "all validation rows"))


def _measured(metrics: Mapping[str, float], split: str) -> tuple[float, float] | None:
    a, b = metrics.get(f"original_acc/{split}"), metrics.get(f"acc/{split}")
    return None if a is None or b is None or not np.isfinite([a, b]).all() else (float(a), float(b))


def accuracy_changes(metrics: Mapping[str, float]) -> dict[str, float]:
    """{`drop/<split>`: the original's accuracy minus the candidate's} for each split of ACCURACY_CHANGES both
    were measured on: the batch run's metrics (a positive value is a drop)."""
    return {f"drop/{split}": round(ab[0] - ab[1], 6) for split, _ in ACCURACY_CHANGES
            if (ab := _measured(metrics, split)) is not None}


def accuracy_change_lines(metrics: Mapping[str, float]) -> list[str]:
    """The same, one sentence each, for the batch summary and the console ("the forgotten rows, 12 row(s): 0.917
    -> 0.833 (-0.083), reported, not gated"): which change the floors gate, which they only report."""
    gated = "validation_remote" if "original_acc/validation_remote" in metrics else "validation"
    out = []
    for split, words in ACCURACY_CHANGES:
        ab = _measured(metrics, split)
        if ab is None:
            continue
        n = metrics.get(f"n/{split}")
        rows = f", {int(n)} row(s)" if n is not None and np.isfinite(n) else ""
        role = "gated by the validation floors" if split == gated else "reported, not gated"
        out.append(f"{words}{rows}: {ab[0]:.3f} -> {ab[1]:.3f} ({ab[1] - ab[0]:+.3f}), {role}")
    return out


def quality_warnings(facts: QualityFacts, max_validation_drop: float | None,
                     max_oracle_spread: float | None) -> list[QualityWarning]:
    """Every warning of the batch, in WARNING_KINDS order."""
    return (lost_classes(facts.class_counts_before, facts.class_counts_after)
            + validation_drop(facts.original_accuracy, facts.champion_accuracy, max_validation_drop)
            + unstable_recipe(facts.oracle_validation_accuracies, max_oracle_spread))


def refused(warnings: Sequence[QualityWarning], refuse: Sequence[str]) -> list[QualityWarning]:
    """The warnings `quality.refuse` turns into a refusal of the batch."""
    return [w for w in warnings if w.kind in set(refuse)]
