"""Held batches: an erasure is never refused for the model's quality (docs/erasure.md, "Held batches").

When no candidate of a batch passes the gate (the exact retrain too: a floor it still misses, a diverged retrain
say) or a quality warning that `quality.refuse` names fires, the batch is HELD for a person, not rejected: a
rejection would keep serving a model trained on the rows that were asked to leave, with "nothing changed".

- the request file moves to `base.paths.held` (requests/held/) beside `<name>.held.json`: when, the batch and its
  MLflow run, what failed in words with its numbers, the accuracy changes, and what the champion does meanwhile;
- the batch's MLflow run is tagged `review: required` (`gate: held`), with the accuracy drops as metrics
  (`drop/<split>`), the held candidate's accuracy per split as a figure and its failing checks
  (`held_for_review.json`);
- `unlearn approve FILE` runs the batch again as an exact retrain with the gate's floors off (the same seed and
  rows: the same model the report measured, from the ensemble cache), promotes it, finishes the erase and moves
  the file to requests/processed/ (`approval_overrides`);
- `unlearn status` lists the held files and their age, and exits 5.

While a batch is held the champion keeps serving: it is the last model that passed the gate, and the held one
failed a sanity floor (it may be broken), so taking the champion down would be an outage decided by a floor. The
held file's rows are therefore still in the served model and in every store until the approval: `unlearn status`
says so, and the champion's registry version carries the tag `serves_held_rows` (`tag_serving_champion`).
Stdlib (and the tracker handed in) only at import: `unlearn status` reads the held files without torch.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

HELD_REPORT = ".held.json"  # <name>.held.json beside each held file


def held_dir(params) -> Path:
    return params.path("held")


def report_path(path: Path) -> Path:
    return path.with_name(path.name + HELD_REPORT)


def hold(path: Path, params, error: BaseException, champion_version) -> Path:
    """Move an inbox file whose batch no candidate passed to requests/held/, beside its report (temp + rename:
    a kill leaves the file in the inbox, or in held/ with or without its report; `held_batches` reads either)."""
    from unlearning.io import atomic_write_json, move_unique

    dest = move_unique(path, held_dir(params))
    atomic_write_json(report_path(dest), {
        "file": path.name, "held_at": datetime.now(timezone.utc).isoformat(),
        "batch_id": getattr(error, "batch_id", None), "run_id": getattr(error, "run_id", None),
        "reason": str(error), "failing_checks": list(getattr(error, "failing_checks", None) or []),
        "accuracy_changes": list(getattr(error, "accuracy_changes", None) or []),
        "champion_version": None if champion_version is None else str(champion_version),
        "meanwhile": serving_line(champion_version),
        "approve": f"unlearn approve {dest.name}"})
    return dest


def serving_line(champion_version) -> str:
    """What the champion does while a batch is held (the module's docstring says why)."""
    v = f"v{champion_version}" if champion_version is not None else "the trained original"
    return (f"the champion {v} keeps serving and still holds the held file's rows (they are in the served model and "
            f"in every store until the batch is approved)")


def held_batches(params, now: float | None = None) -> list[dict]:
    """The held files, oldest first: {"file", "path", "held_at", "age_seconds", "batch_id", "run_id",
    "failing_checks", "approve"}. A held file whose report is missing or unreadable still counts (its age is
    the file's)."""
    folder = held_dir(params)
    if not folder.is_dir():
        return []
    now = time.time() if now is None else now
    out = []
    for f in sorted(p for p in folder.iterdir() if not p.name.endswith(HELD_REPORT) and not p.name.startswith(".")):
        try:
            report = json.loads(report_path(f).read_text())
            at = datetime.fromisoformat(report["held_at"]).timestamp()
        except (OSError, ValueError, KeyError, TypeError):
            report, at = {}, f.lstat().st_mtime
        out.append({"file": f.name, "path": str(f), "held_at": datetime.fromtimestamp(at, timezone.utc).isoformat(),
                    "age_seconds": round(max(now - at, 0.0)), "batch_id": report.get("batch_id"),
                    "run_id": report.get("run_id"), "failing_checks": report.get("failing_checks", []),
                    "approve": f"unlearn approve {f.name}"})
    return sorted(out, key=lambda h: h["held_at"])


def age_text(seconds: float) -> str:
    """"3 d 4 h", "2 h 5 min", "7 min": a held batch's age as `unlearn status` prints it."""
    m = int(seconds // 60)
    d, h = divmod(m // 60, 24)
    return f"{d} d {h} h" if d else f"{h} h {m % 60} min" if h else f"{m} min"


def mark_run_held(batch, error: BaseException) -> None:
    """The held batch's MLflow run: tagged for review, with the drops (`drop/<split>`, of the last candidate: the
    exact retrain), its accuracy per split as a figure and what failed (`held_for_review.json`). The error carries
    the batch and its run, and the accuracy changes, for the held report."""
    from unlearning.batch.quality import accuracy_change_lines, accuracy_changes

    error.batch_id, error.run_id = batch.batch_id, batch.parent
    outcome = getattr(batch, "last_outcome", None)
    metrics = dict(outcome.metrics) if outcome is not None else {}
    error.accuracy_changes = accuracy_change_lines(metrics)
    batch.summary["accuracy_changes"] = error.accuracy_changes
    t = batch.tracker
    t.set_tags(batch.parent, {"review": "required", "held": "true", "gate": "held"})
    if metrics:
        t.log_metrics(batch.parent, accuracy_changes(metrics))
        from adapters import plots

        fig = plots.accuracy_bars(metrics, f"held for review: {outcome.method}", outcome.verdict.checks, False)
        t.log_figure(batch.parent, fig, "held_accuracy_per_split.png")
        plots.close(fig)
    t.log_json(batch.parent, {"reason": str(error), "failing_checks": list(getattr(error, "failing_checks", []) or []),
                              "accuracy_changes": error.accuracy_changes,
                              "approve": f"unlearn approve {batch.path.name}"}, "held_for_review.json")


def tag_serving_champion(tracker, params, version) -> list[str]:
    """The champion's registered version says whether it serves rows of held batches (`serves_held_rows`: the
    held files, or "no"); returns the held files."""
    held = [h["file"] for h in held_batches(params)]
    if version is not None and tracker.has_version(params.tracking.registered_model, str(version)):
        tracker.set_version_tags(params.tracking.registered_model, str(version), {
            "serves_held_rows": (f"yes: {', '.join(held)} held for review (`unlearn approve`); their rows are not "
                                 f"erased yet") if held else "no"})
    return held


def approval_overrides(sharded: bool) -> dict:
    """The params an approved batch runs with: an exact method alone (the exact retrain; a sharded original's exact
    method when `sharded`), per batch (not qualified), promoted whatever its validation floors and
    `quality.refuse` say (a person looked at them), every other gate bound open: the erasure the request asked
    for, by a method exact by construction."""
    from unlearning.config import EXACT_RETRAIN, SHARDED_EXACT

    floors_off = {"max_validation_drop": None, "min_validation_accuracy": None}
    return {"deletion": {"method": SHARDED_EXACT if sharded else EXACT_RETRAIN}, "validation": {"mode": "per_batch"},
            "gate": {"exact_retrain_overrides": True, "retrain_equivalence": floors_off,
                     "suppression": {**floors_off, "max_forget_accuracy": 1.0, "min_adjacent_retention": 0.0}},
            "quality": {"refuse": []}}


def record_approval(tracker, params, path: Path, result) -> dict:
    """After `unlearn approve` applied a held batch (`result`: its BatchResult): the new batch run says it was a
    person's approval of the held one (tags `review: approved`, `approved_hold_of`; the held report as
    `held_report.json`; a line in its description), the held run says where it went (`approved_in`), the champion's
    version says whether it still serves held rows, and the held report goes (the file itself moves to
    requests/processed/ after this). Returns the held report."""
    from unlearning.batch.summary import approval_line

    report_file = report_path(path)
    try:
        report = json.loads(report_file.read_text())
    except (OSError, ValueError):
        report = {"file": path.name}
    run_id, held_run = result.get("run_id"), report.get("run_id")
    if run_id:
        tracker.set_tags(run_id, {"review": "approved", "approved_hold_of": report.get("batch_id") or path.name})
        tracker.log_json(run_id, report, "held_report.json")
        text = tracker.description(run_id)
        if text:
            tracker.set_description(run_id, text.rstrip("\n") + "\n\n" + approval_line(report) + "\n")
    if held_run:
        tracker.set_tags(held_run, {"review": "approved", "approved_in": result.get("batch_id") or ""})
    report_file.unlink(missing_ok=True)
    champion = params.path("state_dir") / "champion.json"
    if champion.exists():
        tag_serving_champion(tracker, params, json.loads(champion.read_text()).get("model_version"))
    return report
