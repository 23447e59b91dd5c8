"""Metrics of the pure core: margins, KLoM, its permutation test and same-size noise floor (docs/design.md §4.2;
permutation.py documents the gate's statistic), accuracy and output gap per
split, membership inference (loss-threshold AUC, NeurIPS 2023 challenge epsilon), oracle coverage.

All functions take numpy arrays or torch tensors and return float64 numpy arrays or Python floats/dicts.
Per-split summaries are dicts {split: {"p95", "mean", "n", "n_undefined"}} for the splits present, in the
order forget, adjacent, remote, validation, then any other label.
"""

from .accuracy import accuracy_by_split, accuracy_by_split_per_member
from .coverage import oracle_coverage
from .klom import klom, klom_summary, noise_floor, oracle_half_klom
from .margins import logit_scaled_confidence, margins
from .mia import DELTA, EPSILON_CAP, forget_quality_score, loss_threshold_auc, per_example_epsilon
from .output_gap import output_gap, output_gap_summary
from .permutation import klom_permutation_test
from .summary import SPLITS, split_summary

__all__ = [
    "DELTA",
    "EPSILON_CAP",
    "SPLITS",
    "accuracy_by_split",
    "accuracy_by_split_per_member",
    "forget_quality_score",
    "klom",
    "klom_permutation_test",
    "klom_summary",
    "logit_scaled_confidence",
    "loss_threshold_auc",
    "margins",
    "noise_floor",
    "oracle_coverage",
    "oracle_half_klom",
    "output_gap",
    "output_gap_summary",
    "per_example_epsilon",
    "split_summary",
]
