"""The language of the selection rules (docs/design.md §4.5): the facts a rule may test, the condition keys
over them, and the `Rule` / `SelectionPolicy` models params.yaml declares. No method is named here: the default
rule list lives with the other defaults (unlearning/config.py DEFAULT_RULES), and applying the rules to a
batch's facts is unlearning/policy/selection_policy.py's.
"""

from __future__ import annotations

import operator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The facts a rule may test: name -> (kind, meaning). kind is "num", "bool" or "str".
FACTS: dict[str, tuple[str, str]] = {
    "objective": ("str", "declared objective: retrain_equivalence | suppression"),
    "n_forget": ("num", "forget rows in the batch"),
    "n_retain": ("num", "retain rows"),
    "forget_fraction": ("num", "n_forget / (n_forget + n_retain)"),
    "adjacent_fraction": ("num", "adjacent rows / retain rows"),
    "predicted_gap": ("num", "leverage-predicted output gap of the original vs the oracle"),
    "noise_floor": ("num", "oracles' output noise on the forget rows, at least their noise on as many validation "
                           "rows (unlearning/policy/selection.py noise_floor; needs oracles)"),
    "predicted_gap_lt_noise_floor": ("bool", "predicted_gap < noise_floor"),
    "predicted_gap_to_noise": ("num", "predicted_gap / noise_floor (the forget gap in units of its own noise)"),
    "retain_gap_to_noise": ("num", "predicted retain-set gap / noise_floor (leakage, regularized by the noise)"),
    "leakage_ratio": ("num", "||C_RF g_F|| / ||S_F g_F|| (docs/design.md §4.1; raw: fires on vanishing norms, prefer "
                             "retain_gap_to_noise)"),
    "self_leverage_trace": ("num", "trace of S_F"),
    "self_leverage_norm": ("num", "spectral norm of S_F"),
    "retrain_cost": ("num", "predicted gradient evaluations of an exact retrain"),
    "budget": ("num", "compute budget in gradient evaluations"),
    "retrain_cost_lt_budget": ("bool", "retrain_cost < budget"),
    "has_gpu": ("bool", "a CUDA device is available"),
    "sharded": ("bool", "the original was trained in shards (train.sharding): method sisa retrains only the shards "
                        "that held the rows"),
}

_OPS: dict[str, tuple[Any, str]] = {
    "eq": (operator.eq, "=="), "ne": (operator.ne, "!="), "gt": (operator.gt, ">"), "ge": (operator.ge, ">="),
    "lt": (operator.lt, "<"), "le": (operator.le, "<="), "in": (lambda a, b: a in b, "in"),
}
_OPS_FOR_KIND = {"num": ("eq", "ne", "gt", "ge", "lt", "le", "in"), "str": ("eq", "ne", "in"), "bool": ("eq",)}


def allowed_keys() -> list[str]:
    """Every valid condition key: each fact, and fact_<op> for the operators its kind supports."""
    keys = []
    for fact, (kind, _) in FACTS.items():
        keys += [fact if op == "eq" else f"{fact}_{op}" for op in _OPS_FOR_KIND[kind]]
    return sorted(keys)


def parse_key(key: str) -> tuple[str, str]:
    """Condition key -> (fact, op). A plain fact name means equality; exact fact names win over suffix
    parsing (so `predicted_gap_lt_noise_floor` is the boolean fact, not predicted_gap < ...)."""
    if key in FACTS:
        return key, "eq"
    fact, _, op = key.rpartition("_")
    if fact in FACTS and op in _OPS_FOR_KIND[FACTS[fact][0]]:
        return fact, op
    raise ValueError(f"unknown condition key {key!r}; allowed keys: {allowed_keys()}")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_value(kind: str, v: Any) -> bool:
    return {"num": _is_num, "bool": lambda x: isinstance(x, bool), "str": lambda x: isinstance(x, str)}[kind](v)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    when: dict[str, Any] = Field(default_factory=dict)
    method: str = Field(min_length=1)

    @field_validator("when")
    @classmethod
    def _known_conditions(cls, when: dict[str, Any]) -> dict[str, Any]:
        for key, value in when.items():
            fact, op = parse_key(key)
            kind = FACTS[fact][0]
            values = value if op == "in" else [value]
            if op == "in" and not isinstance(value, list):
                raise ValueError(f"condition {key!r} needs a list, got {value!r}")
            if not all(_check_value(kind, v) for v in values):
                raise ValueError(f"condition {key!r}: fact {fact!r} is {kind}, got {value!r}")
        return when


class SelectionPolicy(BaseModel):
    """The declared rule list (params.yaml `selection.rules`)."""

    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> "SelectionPolicy":
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must be unique; repeated: {dup}")
        return self
