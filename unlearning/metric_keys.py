"""The names of the certificate's metrics, made and read in one place (docs/design.md §4.2, §4.5).

A metric of one split is `<name>/<split>` (`acc/forget`, `klom_pvalue/validation`); the certificate's own
numbers (the look that decided, its alpha) come from the outcome's record, and become metric names only here,
for MLflow (`for_tracking`). The records (unlearning/acceptance.py Outcome, SplitRecord) are what code reads.
"""

from __future__ import annotations

from typing import Mapping

ALPHA = "certificate/alpha"  # the alpha the deciding look applied (an Outcome's `alpha`)
LOOKS = "certificate/looks"  # how many looks the certificate took (len(Outcome.looks))


def key(name: str, split: str) -> str:
    """`acc`, `forget` -> `acc/forget`."""
    return f"{name}/{split}"


def of_split(metrics: Mapping[str, float], name: str, split: str) -> float | None:
    """The value of `name` on `split`, or None when it was not measured."""
    v = metrics.get(key(name, split))
    return None if v is None else float(v)


def for_tracking(metrics: Mapping[str, float], alpha: float | None, looks: int) -> dict[str, float]:
    """What MLflow logs for a candidate: its measured metrics, and the certificate's alpha and looks when it
    took any (a candidate judged without references has neither)."""
    out = dict(metrics)
    if looks:
        out[LOOKS] = float(looks)
    if alpha is not None:
        out[ALPHA] = float(alpha)
    return out
