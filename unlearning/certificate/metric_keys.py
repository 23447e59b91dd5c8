"""The names of the certificate's metrics, made in one place (docs/design.md §4.2, §4.5).

A metric of one split is `<name>/<split>` (`acc/forget`, `klom_pvalue/validation`). The records are what code
reads (unlearning/certificate/gate.py SplitMeasures, unlearning/certificate/acceptance.py Outcome, SplitRecord); they become metric names
only here: a split's measures (`of_measures`), and the certificate's own numbers (the look that decided, its
alpha) for MLflow (`for_tracking`).
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


# SplitMeasures field -> metric name (the oracles' spread and the epsilon record are nested: below)
SPLIT_FIELDS = {"acc": "acc", "n": "n", "original_acc": "original_acc", "shadow_acc": "shadow_acc",
                "klom_p95": "klom_p95", "klom_mean": "klom_mean", "pvalue": "klom_pvalue", "floor": "noise_floor_p95",
                "floor_null_p95": "noise_floor_null_p95"}
ORACLE_FIELDS = {"mean": "oracle_acc", "std": "oracle_acc_std", "min": "oracle_acc_min", "max": "oracle_acc_max",
                 "n": "oracle_n"}
EPSILON_FIELDS = {"point": "epsilon", "mean": "epsilon_mean", "lower": "epsilon_lower", "upper": "epsilon_upper"}


def of_measures(measures) -> dict[str, float]:
    """The flat metrics of per-split measures (unlearning/certificate/gate.py SplitMeasures): `<name>/<split>` for every
    field measured (None: left out)."""
    out: dict[str, float] = {}
    for m in measures:
        parts = [(SPLIT_FIELDS, m), (ORACLE_FIELDS, m.oracle), (EPSILON_FIELDS, m.epsilon)]
        for names, record in parts:
            for attr, name in names.items():
                value = None if record is None else getattr(record, attr)
                if value is not None:
                    out[key(name, m.split)] = float(value)
    return out


def for_tracking(metrics: Mapping[str, float], alpha: float | None, looks: int) -> dict[str, float]:
    """What MLflow logs for a candidate: its measured metrics, and the certificate's alpha and looks when it
    took any (a candidate judged without references has neither)."""
    out = dict(metrics)
    if looks:
        out[LOOKS] = float(looks)
    if alpha is not None:
        out[ALPHA] = float(alpha)
    return out
