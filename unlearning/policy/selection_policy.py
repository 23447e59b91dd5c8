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

from typing import Any, Iterable, Sequence

from unlearning.config import DEFAULT_RULES, EXACT_RETRAIN  # noqa: F401  (DEFAULT_RULES: re-exported)
from unlearning.batch.records import Selection
from unlearning.policy.rules import (  # noqa: F401  (the rule language, re-exported for the policy's callers)
    _OPS, FACTS, Rule, SelectionPolicy, _check_value, _is_num, allowed_keys, parse_key,
)

FALLBACK = EXACT_RETRAIN  # the exact method every candidate list ends with (its trait `fallback`)


def retrain_last(methods: Iterable[str]) -> list[str]:
    """The candidate order's one invariant, defined once: each method once, exact retrain last (always there)."""
    ordered = list(dict.fromkeys(methods))
    return [m for m in ordered if m != FALLBACK] + [FALLBACK]


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
    return Selection(candidates=retrain_last(candidates), fired=fired, skipped=skipped, facts=dict(facts))
