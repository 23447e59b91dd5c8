"""Say out loud what a promoted batch cost the model (unlearning/batch/quality.py computes it; docs/design.md §4.5).

`announce_quality` runs between choosing the batch's outcome and promoting it: each warning goes to the console
(the run logger), to the batch's MLflow run (tag `quality_warnings` and `quality_warnings.json`), to a Prefect
markdown artifact and to the batch summary; the returned lines go into the champion record (`promote(...,
warnings=...)`), so `unlearn status` repeats them. A warning named in `quality.refuse` stops the batch instead
(`QualityRefused`): it is held for review like a batch no candidate passed (tasks/held.py: requests/held/, exit 5,
the previous champion stays until `unlearn approve`), never refused.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tasks.reporting import markdown_artifact, run_logger
from unlearning.config import Params
from unlearning.batch.quality import (
    QualityFacts, QualityWarning, accuracy_change_lines, accuracy_changes, class_counts, quality_warnings, refused,
)


class BatchRejected(RuntimeError):
    """The batch is not applied and the previous champion stays: no candidate passed the gate, or the chosen one
    was refused (`QualityRefused`). flows/errors.py maps the name to exit 3 (for a subclass too) where it ends a
    command; the deletion flow holds such an inbox file for review instead (requests/held/, tasks/held.py: an
    erasure is never refused for the model's quality). Defined here, below the flows, so the deletion flow can
    catch both as one class (`from tasks.quality import BatchRejected`)."""


class QualityRefused(BatchRejected):
    """A quality warning that `quality.refuse` names: the batch is refused instead of promoted."""


def split_accuracies(metrics: dict, prefix: str) -> dict[str, float]:
    """{split: accuracy} from a candidate's metrics ("acc/validation", "original_acc/forget", ...)."""
    return {k[len(prefix):]: float(v) for k, v in metrics.items() if k.startswith(prefix)}


def oracle_spread_from_metrics(metrics: dict) -> list[float] | None:
    """The oracles' validation accuracy range as [min, max] from the certificate's metrics (None: no oracles)."""
    lo, hi = metrics.get("oracle_acc_min/validation"), metrics.get("oracle_acc_max/validation")
    return None if lo is None or hi is None else [float(lo), float(hi)]


def quality_facts(outcome, state, rows, oracle_val_accs: Sequence[float] | None = None) -> QualityFacts:
    """The numbers of unlearning/batch/quality.py from a batch: the candidate's metrics (tasks/batch.py's
    CandidateOutcome), the training rows before the batch and after it (rows.before, rows.retain: positions in
    the prepared store) and the class names of the prepared store."""
    names = state.prepared.info["class_names"]
    labels = np.asarray(state.prepared.label)
    oracles = oracle_val_accs if oracle_val_accs is not None else oracle_spread_from_metrics(outcome.metrics)
    return QualityFacts(original_accuracy=split_accuracies(outcome.metrics, "original_acc/"),
                        champion_accuracy=split_accuracies(outcome.metrics, "acc/"),
                        class_counts_before=class_counts(labels[rows.before], names),
                        class_counts_after=class_counts(labels[rows.retain], names),
                        oracle_validation_accuracies=oracles)


def announce_quality(batch, outcome, state, rows, params: Params,
                     oracle_val_accs: Sequence[float] | None = None) -> list[str]:
    """Warn about what the chosen candidate costs; returns the warnings (one sentence each, [] when none).

    Call it once the batch's `outcome` is chosen and before `promote`; pass the returned list to
    `promote(..., warnings=...)` (stored as champion["quality_warnings"], repeated by `unlearn status`).
    `batch`: tasks/stages.py's BatchRun; `outcome`: the chosen CandidateOutcome (its metrics hold the original's
    and the candidate's per-split accuracies, and, when oracles were trained, their validation accuracy range);
    `rows`: the batch's BatchRows; `oracle_val_accs`: every oracle's validation accuracy when the caller has them
    (else the range from the metrics; a batch without oracles skips the unstable-recipe check). Writes to the
    console, the batch's MLflow run, a Prefect artifact and batch.summary["warnings"]. Raises QualityRefused when
    a warning's kind is in `quality.refuse` (after announcing every warning)."""
    q = params.quality
    report_accuracy_changes(batch, outcome.metrics)
    warnings = quality_warnings(quality_facts(outcome, state, rows, oracle_val_accs), q.max_validation_drop,
                                q.max_oracle_spread)
    if warnings:
        _publish(batch, warnings, q.refuse)
    stop = refused(warnings, q.refuse)
    if stop:
        raise QualityRefused(f"{batch.path.name}: refused by quality.refuse = {list(q.refuse)}: "
                             f"{'; '.join(map(str, stop))}; the previous champion stays")
    return [str(w) for w in warnings]


def report_accuracy_changes(batch, metrics: dict) -> list[str]:
    """The candidate's accuracy against the original's on the rows the batch entangles (the forgotten rows, the
    adjacent ones, the entangled validation rows) and on the validation rows it does not: reported, in the batch
    run's metrics (`drop/<split>`), its summary and the console; only the last is gated (unlearning/certificate/gate.py)."""
    lines = accuracy_change_lines(metrics)
    if lines:
        batch.tracker.log_metrics(batch.parent, accuracy_changes(metrics))
        batch.summary["accuracy_changes"] = lines
        run_logger().info(f"{batch.path.name}: accuracy against the original: " + "; ".join(lines))
    return lines


def _publish(batch, warnings: list[QualityWarning], refuse: Sequence[str]) -> None:
    log = run_logger()
    for w in warnings:
        log.warning(f"{batch.path.name}: quality: {w}")
    batch.tracker.set_tags(batch.parent, {"quality_warnings": ",".join(w.kind for w in warnings)})
    batch.tracker.log_json(batch.parent, {"warnings": [{"kind": w.kind, "message": w.message} for w in warnings],
                                          "refuse": list(refuse)}, "quality_warnings.json")
    md = "### Quality warnings\n\n" + "".join(
        f"- **{w.kind}**{' (refused: quality.refuse)' if w.kind in refuse else ''}: {w.message}\n" for w in warnings)
    markdown_artifact(md, key=batch.key("quality"), description=f"quality warnings for {batch.path.name}")
    batch.summary["warnings"] = [*batch.summary.get("warnings", []), *(str(w) for w in warnings)]
