"""The batch summary a reviewer reads first: markdown for the MLflow run description
(`mlflow.note.content`) and the Prefect flow run's artifact. Pure: built from the batch's facts.

It holds the request file, the number of samples forgotten and the objective, each candidate tried (verdict,
the failing checks in words, seconds), the chosen method and the rule that chose it, the champion version
before and after, and the erasure report once it exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unlearning.config import method_traits


@dataclass
class CandidateLine:
    method: str
    passed: bool
    seconds: float
    checks: dict[str, dict] = field(default_factory=dict)  # Verdict.checks
    promoted_as_false_reject: bool = False  # exact retrain promoted although only statistical checks failed


def check_in_words(name: str, check: dict) -> str:
    """One gate check as a sentence: what was measured, what it needed (unlearning/certificate/gate.py's check names)."""
    kind, _, split = name.partition("/")
    value, limit, op = check.get("value"), check.get("limit"), check.get("op")
    v = f"{value:.3g}" if isinstance(value, (int, float)) else str(value)
    if isinstance(value, (int, float)) and isinstance(limit, (int, float)):
        from unlearning.certificate.gate import format_beside

        v = format_beside(value, limit, v)  # below a bound never prints as equal to it
    if kind == "klom_pvalue":
        return (f"{split}: the KLoM of the unlearned models to the oracles is unusual for two sets of retrains "
                f"(permutation p = {v} < alpha = {limit})")
    if kind == "acc" and op == "in":
        lo, hi = limit
        return f"{split}: accuracy {v} lies outside the range of exact retrains [{lo:.3f}, {hi:.3f}]"
    rows = ("validation accuracy on the rows the batch does not entangle" if check.get("rows") == "validation_remote"
            else "validation accuracy")
    if kind == "acc" and split == "validation_drop":
        return (f"{rows} {v} fell below the original's minus the tolerance ({limit}; "
                f"gate.<objective>.max_validation_drop)")
    if kind == "acc" and split == "validation_min":
        return f"{rows} {v} is below the floor gate.retrain_equivalence.min_validation_accuracy = {limit}"
    if kind == "accuracy_gap":
        return f"{split}: accuracy differs from the oracles' mean by {v}, more than {limit}"
    if kind == "klom_p95":
        return f"{split}: KLoM P95 {v} is above the bound {limit}"
    if kind == "adjacent_retention":
        return f"adjacent accuracy kept {v} of the original's, below {limit}"
    if kind == "acc":
        return f"{split}: accuracy {v} (needs {op} {limit})"
    return f"{name} = {v} (needs {op} {limit})"


def failing_checks_in_words(checks: dict[str, dict]) -> list[str]:
    return [check_in_words(n, c) for n, c in checks.items() if not c.get("passed", True)]


def chosen_rule(selection: dict, method: str) -> str:
    """The rule that put `method` on the candidate list, in words (selection: unlearning/policy/selection.py Selection,
    or its JSON form)."""
    rule_methods = selection.get("rule_methods", {})
    for name, why in selection.get("fired", []):
        if name == "retraining_debt" or (name == "explicit" and why.endswith(repr(method))):
            return f"{name}: {why}"
        if rule_methods.get(name) == method:
            return f"rule `{name}` ({why})"
    if method_traits(method).fallback:
        return "exact retrain is always the last candidate"
    return "it is listed in deletion.fallback"


def _fmt_version(v) -> str:
    return f"v{v}" if v not in (None, "") else "none"


def summary_markdown(*, request_file: str, batch_id: str, n_forgotten: int, objective: str,
                     candidates: list[CandidateLine], selection: dict, chosen: str | None,
                     version_before: Any, version_after: Any, wall_seconds: float | None,
                     erasure: dict | None = None, debt: dict | None = None, status: str = "applied",
                     error: str | None = None, warnings: list[str] | None = None,
                     plan: list[str] | None = None, accuracy_changes: list[str] | None = None,
                     debt_after: dict | None = None) -> str:
    """The batch summary (markdown). `chosen` None: no candidate passed (status "rejected" or "held") or an error.
    `warnings`: what the promoted model costs (unlearning/batch/quality.py), one sentence each; `plan`: the batch's
    plan in words (unlearning/planning/plan.py plan_lines); `accuracy_changes`: the candidate's accuracy against the
    original's on the rows the batch entangles and on those it does not (unlearning/batch/quality.py); `debt_after`: the
    retraining debt once the batch is applied (`debt`: before it)."""
    head = {"applied": "applied", "rejected": "REJECTED: no candidate passed the gate; the previous champion stays",
            "held": ("HELD for review: no candidate passed the gate, and an erasure is never refused for the "
                     "model's quality; the previous champion keeps serving, and still holds these rows, until "
                     "`unlearn approve` promotes the exact retrain (docs/erasure.md, Held batches)"),
            "error": "FAILED: nothing was applied"}.get(status, status)
    lines = [f"### Deletion batch `{request_file}`: {head}", "",
             f"- **Forgotten:** {n_forgotten} sample(s), objective `{objective}`",
             f"- **Batch id:** `{batch_id}`"]
    if wall_seconds is not None:
        lines.append(f"- **Wall time:** {wall_seconds:.1f} s")
    if chosen is not None:
        lines.append(f"- **Chosen method:** `{chosen}`, because {chosen_rule(selection, chosen)}")
    if debt:
        lines.append(f"- **Retraining debt before this batch:** {debt['batches_since_retrain']} approximate "
                     f"batch(es), {debt['forgotten_since_retrain']} sample(s) "
                     f"({debt['forgotten_fraction_since_retrain']:.1%} of the training set) since the last "
                     f"exact retrain")
    if debt_after:
        lines.append(f"- **Retraining debt after this batch:** {debt_after['batches_since_retrain']} approximate "
                     f"batch(es), {debt_after['forgotten_since_retrain']} sample(s) "
                     f"({debt_after['forgotten_fraction_since_retrain']:.1%} of the training set)")
    for reason in selection.get("debt_reasons", []):
        lines.append(f"- **Retrain forced by the retraining debt:** {reason} (the rules would have tried "
                     f"{', '.join(selection.get('rules_would_have_tried', []))})")
    lines.append(f"- **Champion:** {_fmt_version(version_before)} -> "
                 f"{_fmt_version(version_after) if version_after is not None else _fmt_version(version_before) + ' (unchanged)'}")
    if error:
        lines.append(f"- **Error:** {error}")
    lines += [f"- **Quality warning:** {w}" for w in warnings or []]
    lines += [f"- **Accuracy, {c}**" for c in accuracy_changes or []]
    lines += ["", "| candidate | verdict | seconds | failing checks |", "|---|---|---|---|"]
    for c in candidates:
        failing = failing_checks_in_words(c.checks)
        verdict = "passed" if c.passed else ("promoted (false reject of the gate)" if c.promoted_as_false_reject
                                            else "failed")
        lines.append(f"| `{c.method}` | {verdict} | {c.seconds:.1f} | {'; '.join(failing) or '-'} |")
    if not candidates:
        lines.append("| - | not reached | - | - |")
    if plan:
        lines += ["", "**Plan** (before anything was trained):", *[line if line.startswith("- ") else f"- {line}"
                                                                  for line in plan]]
    if erasure is not None:
        lines += ["", erasure_line(erasure)]
    return "\n".join(lines) + "\n"


def approval_line(held: dict) -> str:
    """The approved batch's line: which held batch a person approved, when it was held and what had failed."""
    failed = "; ".join(held.get("failing_checks", [])) or held.get("reason", "")
    name = held.get("batch_id") or held.get("file")
    return (f"**Approved by `unlearn approve`:** the batch held for review as `{name}` (held "
            f"{str(held.get('held_at', ''))[:19]}Z{': ' + failed if failed else ''}) was run again as an exact "
            f"retrain with the validation floors off, promoted, and erased")


ERASURE_LINE = "**Erasure:**"  # the summary's erasure line starts so: `unlearn erase` rewrites it when it finishes


def erasure_line(erasure: dict) -> str:
    """The summary's erasure line from an erasure report (tasks/erasure.py): done, with every store and what was
    purged over all passes, or what is still pending and which command finishes it."""
    passes = [*erasure.get("earlier_passes", []), erasure]
    purged = purged_rows_text([s for p in passes for s in p.get("stores", [])])
    names = list(dict.fromkeys(s["store"] for s in erasure.get("stores", []) if s.get("store")))
    checked = f"({len(erasure.get('stores', []))} store(s) checked)"
    if erasure.get("pending"):
        return f"{ERASURE_LINE} rows purged so far: {purged} {checked}; PENDING: {'; '.join(erasure['pending'])}"
    at = f" {str(erasure['erased_at'])[:19]}Z" if erasure.get("erased_at") else ""
    return (f"{ERASURE_LINE} done{at}: rows purged: {purged} {checked}; nothing pending"
            + (f". Stores: {', '.join(names)}" if names else ""))


def purged_rows_text(stores: list[dict]) -> str:
    """"prepared 15, state manifest 15": per store, since one sample's row lives in several stores (a sum would
    count it twice); "none" when nothing was purged."""
    parts = [f"{s.get('store', 'store')} {s['purged_rows']}" for s in stores if s.get("purged_rows")]
    return ", ".join(parts) or "none"
