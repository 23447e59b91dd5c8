"""Method selection as a declared, ordered rule list (docs/design.md §4.5).

A rule is `{name, when: {condition: value, ...}, method}`. A condition key is a fact name (equality) or
a fact name with an operator suffix: `_gt`, `_ge`, `_lt`, `_le`, `_ne`, `_in` (e.g. `leakage_ratio_gt:
1.0`, `objective_in: [suppression]`). Rules are checked in order; every rule whose conditions all
hold FIRES and contributes its method; the candidates are the fired methods in rule order, without
duplicates, cut after `retrain` and always ending with `retrain` (exact, the gate's last resort). A rule
that needs a fact the batch does not have (e.g. leverage diagnostics not computed) is SKIPPED with the
reason logged, never an error; unknown condition keys are errors at load time.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FALLBACK = "retrain"


def retrain_last(methods: Iterable[str]) -> list[str]:
    """The candidate order's one invariant, defined once: each method once, exact retrain last (always there)."""
    ordered = list(dict.fromkeys(methods))
    return [m for m in ordered if m != FALLBACK] + [FALLBACK]

# The facts a rule may test: name -> (kind, meaning). kind is "num", "bool" or "str".
FACTS: dict[str, tuple[str, str]] = {
    "objective": ("str", "declared objective: retrain_equivalence | suppression"),
    "n_forget": ("num", "forget rows in the batch"),
    "n_retain": ("num", "retain rows"),
    "forget_fraction": ("num", "n_forget / (n_forget + n_retain)"),
    "adjacent_fraction": ("num", "adjacent rows / retain rows"),
    "predicted_gap": ("num", "leverage-predicted output gap of the original vs the oracle"),
    "noise_floor": ("num", "oracles' output noise on the forget rows, at least their noise on as many validation "
                           "rows (unlearning/selection.py noise_floor; needs oracles)"),
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


class Selection(BaseModel):
    candidates: list[str]
    fired: list[tuple[str, str]]
    skipped: list[tuple[str, str]]

    @property
    def chosen(self) -> str:
        return self.candidates[0]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


def evaluate(rule: Rule, facts: dict[str, Any]) -> tuple[bool | None, str]:
    """(True, why) if every condition holds, (False, why-not) if one fails, (None, why) if facts are
    missing (None counts as missing)."""
    missing = sorted({parse_key(k)[0] for k in rule.when} - {f for f, v in facts.items() if v is not None})
    if missing:
        return None, f"missing fact(s) {missing} (not computed for this batch)"
    held = []
    for key, want in rule.when.items():
        fact, op = parse_key(key)
        fn, sym = _OPS[op]
        have = facts[fact]
        if not fn(have, want):
            return False, f"{fact}={_fmt(have)} is not {sym} {_fmt(want)}"
        held.append(f"{fact}={_fmt(have)} {sym} {_fmt(want)}")
    return True, "; ".join(held) or "no conditions"


# How far a failed condition is from holding (nearest_miss): a threshold by its relative margin, a fact not
# computed for the batch by MISSING_DISTANCE (it might have held), any other mismatch (a category, a flag) by 1.
MISSING_DISTANCE = 0.5


def failing_conditions(rule: Rule, facts: dict[str, Any]) -> list[tuple[str, float]]:
    """Every condition of `rule` that keeps it off, with the value that does, and its distance from holding."""
    out = []
    for key, want in rule.when.items():
        fact, op = parse_key(key)
        fn, sym = _OPS[op]
        have = facts.get(fact)
        if have is None:
            out.append((f"{fact} not computed for this batch", MISSING_DISTANCE))
        elif not fn(have, want):
            threshold = op in ("gt", "ge", "lt", "le") and _is_num(have) and _is_num(want)
            far = abs(have - want) / max(abs(want), 1e-12) if threshold else 1.0
            out.append((f"{fact}={_fmt(have)} is not {sym} {_fmt(want)}", far))
    return out


def nearest_miss(rules: SelectionPolicy | Sequence[Rule | dict], facts: dict[str, Any],
                 candidates: Sequence[str]) -> tuple[str, str, str] | None:
    """The rule nearest to firing among those that did not, for a method that is not a candidate: the least
    summed distance of its failed conditions (a threshold by its relative margin: `predicted_gap_to_noise=0.83
    is not < 0.5` is 0.66 away; a flag or a category that differs, 1), the earlier rule on a tie
    (docs/design.md §4.5). (name, method, what kept it off), or None when every rule's method is a candidate
    anyway. Says on the console why a method was not picked."""
    policy = rules if isinstance(rules, SelectionPolicy) else SelectionPolicy(
        rules=[r if isinstance(r, Rule) else Rule(**r) for r in rules])
    misses = [(sum(d for _, d in off), i, r, off) for i, r in enumerate(policy.rules)
              if r.method not in candidates and (off := failing_conditions(r, facts))]
    if not misses:
        return None
    _, _, rule, off = min(misses, key=lambda m: (m[0], m[1]))
    return rule.name, rule.method, "; ".join(why for why, _ in off)


def validate_facts(facts: dict[str, Any]) -> None:
    for fact, value in facts.items():
        if fact not in FACTS:
            raise ValueError(f"unknown fact {fact!r}; allowed facts: {sorted(FACTS)}")
        kind = FACTS[fact][0]
        if value is not None and not _check_value(kind, value):
            raise ValueError(f"fact {fact!r} must be {kind}, got {value!r}")


def select_methods(rules: SelectionPolicy | Sequence[Rule | dict], facts: dict[str, Any], *,
                   known_methods: Iterable[str] | None = None) -> Selection:
    """Apply the ordered rules to the batch's facts (see the module docstring). `known_methods`, when
    given, makes a rule naming an unregistered method an error."""
    policy = rules if isinstance(rules, SelectionPolicy) else SelectionPolicy(
        rules=[r if isinstance(r, Rule) else Rule(**r) for r in rules])
    validate_facts(facts)
    if known_methods is not None:
        known = set(known_methods)
        for r in policy.rules:
            if r.method not in known:
                raise ValueError(f"rule {r.name!r}: method {r.method!r} is not registered; allowed: {sorted(known)}")
    candidates: list[str] = []
    fired, skipped = [], []
    for rule in policy.rules:
        ok, why = evaluate(rule, facts)
        if not ok:
            skipped.append((rule.name, why))
            continue
        if FALLBACK in candidates:
            why += f" (not a candidate: after {FALLBACK!r})"
        elif rule.method not in candidates:
            candidates.append(rule.method)
        fired.append((rule.name, why))
    return Selection(candidates=retrain_last(candidates), fired=fired, skipped=skipped)


# docs/design.md §4.5's example list as calibrated by bench/calibration.py (params.yaml declares the same; it may declare
# its own). Dropped after the calibration bench: `high_leakage -> newton_ggn` (the raw leakage ratio fires on
# vanishing norms, and newton_ggn was farther from the oracles than do_nothing there) and `privacy_default ->
# finetune` (failed the calibrated gate on the bench's sets at a cost above a retrain, which the gate's oracles
# already are: promoting one costs nothing more).
DEFAULT_RULES: list[dict] = [
    # a sharded original (train.sharding): exact unlearning for the share of the shards the rows sit in
    {"name": "sharded_original", "method": "sisa", "when": {"sharded": True}},
    {"name": "gap_below_noise_floor", "method": "do_nothing",
     "when": {"objective": "retrain_equivalence", "predicted_gap_to_noise_lt": 0.5}},
    # retrain_equivalence only: a retrain keeps what the forget set shares with the rest, so it cannot suppress
    {"name": "retrain_within_budget", "method": "retrain",
     "when": {"objective": "retrain_equivalence", "retrain_cost_lt_budget": True}},
    {"name": "oracles_are_retrains", "method": "retrain", "when": {"objective": "retrain_equivalence"}},
    {"name": "suppression_with_adjacency", "method": "al_wpgd",
     "when": {"objective": "suppression", "adjacent_fraction_gt": 0.0}},
    {"name": "suppression", "method": "descent_ascent", "when": {"objective": "suppression"}},
]
