"""The champion's history across batches, and the retraining-debt rule.

Approximate unlearners (do_nothing, finetune, newton_ggn, ...) each leave a small, certified-to-noise
difference from an exact retrain; batch after batch those differences add up while the gate judges every
batch alone. The debt rule bounds the accumulation: counted from the ledger since the last exact retrain
(or the original), a batch that would take either

* the fraction of the original training set forgotten approximately above `deletion.debt.max_forgotten_fraction`,
* or the number of approximate batches above `deletion.debt.max_batches_since_retrain`,

is exact retrain alone. (The oracles the gate trains are exact retrains on the retain set, so the forced
retrain costs no training beyond the validation the batch runs anyway.)

The history is one point per promoted batch, kept in state/champion.json (written with the batch, all or
nothing): step, cumulative forgotten fraction, the champion's validation accuracy and its measured gap to
the oracles (mean output gap, docs/design.md §4.3), the method.
"""

from __future__ import annotations

from typing import Any, Iterable

from unlearning.config import method_traits
from unlearning.privacy.ledger import trained_on
from unlearning.batch.records import Selection

LICENSED = "licensed"  # the ledger verdict of a row a licence forgot with the model unchanged (tasks/licensing.py)


def is_exact(method: str | None) -> bool:
    """Whether `method`'s result IS a retrain on the retain rows (its trait `exact`): it clears the debt."""
    return method is not None and method_traits(method).exact


def n_original_train(manifest, ledger: list[dict]) -> int:
    """The size of the original training set: the retained training rows of the live manifest plus every
    sample the ledger records as forgotten (erasure drops forgotten rows from the stores, so they are
    counted from the ledger, not the manifest)."""
    retained = (manifest["split"] == "train") & (manifest["status"] == "retained")
    return int(retained.sum()) + len(trained_on(ledger))


def batches_from_ledger(ledger: Iterable[dict]) -> list[dict]:
    """One record per applied batch, in ledger order: batch_id, method, n_forgotten, request_file. Validation
    rows a request erased (ledger kind `erased_not_trained_on`) were never trained on: they are no debt."""
    out: dict[str, dict] = {}
    for e in trained_on(ledger):
        b = out.setdefault(str(e.get("batch_id")), {"batch_id": str(e.get("batch_id")), "method": e.get("method"),
                                                     "request_file": e.get("request_file"), "n_forgotten": 0})
        b["n_forgotten"] += 1
    return list(out.values())


def retraining_debt(ledger: Iterable[dict], n_train: int) -> dict[str, Any]:
    """Approximate deletions since the last exact retrain (or the original), from the ledger; licensed rows
    (docs/design.md §4.9: the model left unchanged) are approximate deletions too, and counted apart as well
    (`licensed_since_retrain`, which licensing.max_debt_rows bounds)."""
    ledger = list(ledger)
    batches = batches_from_ledger(ledger)
    since = 0
    forgotten = 0
    open_ids = set()
    for b in reversed(batches):
        if is_exact(b["method"]):
            break
        since += 1
        forgotten += b["n_forgotten"]
        open_ids.add(b["batch_id"])
    licensed = sum(1 for e in trained_on(ledger) if str(e.get("batch_id")) in open_ids
                   and e.get("verdict") == LICENSED)
    return {"batches_since_retrain": since, "forgotten_since_retrain": forgotten,
            "forgotten_fraction_since_retrain": forgotten / max(n_train, 1), "n_batches": len(batches),
            "forgotten_total": sum(b["n_forgotten"] for b in batches), "n_train": int(n_train),
            "licensed_since_retrain": licensed}


def debt_reasons(debt: dict[str, Any], n_new: int, max_forgotten_fraction: float | None,
                 max_batches_since_retrain: int | None) -> list[str]:
    """Why this batch must be an exact retrain (empty: it need not). Counts include this batch (n_new samples)."""
    reasons = []
    n_train = max(debt["n_train"], 1)
    would_forget = debt["forgotten_since_retrain"] + n_new
    if max_forgotten_fraction is not None and would_forget / n_train > max_forgotten_fraction:
        reasons.append(f"{would_forget} sample(s) ({would_forget / n_train:.1%} of the {n_train} original training "
                       f"rows, this batch's {n_new} included) would be forgotten approximately since the last exact "
                       f"retrain, above deletion.debt.max_forgotten_fraction = {max_forgotten_fraction}")
    would_batches = debt["batches_since_retrain"] + 1
    if max_batches_since_retrain is not None and would_batches > max_batches_since_retrain:
        reasons.append(f"this would be approximate batch {would_batches} since the last exact retrain, above "
                       f"deletion.debt.max_batches_since_retrain = {max_batches_since_retrain}")
    return reasons


def force_retrain(selection, reasons: list[str]):
    """The selection (unlearning/policy/selection.py Selection, or its JSON form) with exact retrain as the only
    candidate, saying why (the rules' own result is kept)."""
    return Selection.of(selection).forced_retrain(reasons)


def history_point(history: list[dict], *, batch_id: str, request_file: str, method: str, n_forgotten: int,
                  n_train: int, validation_accuracy: float, output_gap: float, model_version: str | None,
                  processed_at: str) -> dict[str, Any]:
    """The next point of the champion's history (step = 1 for the first batch)."""
    last = history[-1] if history else {"step": 0, "cumulative_forgotten": 0, "batches_since_retrain": 0}
    cumulative = int(last["cumulative_forgotten"]) + int(n_forgotten)
    since = 0 if is_exact(method) else int(last["batches_since_retrain"]) + 1
    return {"step": int(last["step"]) + 1, "batch_id": batch_id, "request_file": request_file, "method": method,
            "n_forgotten": int(n_forgotten), "cumulative_forgotten": cumulative,
            "forgotten_fraction": cumulative / max(n_train, 1), "champion_validation_accuracy": float(validation_accuracy),
            "champion_output_gap": float(output_gap), "batches_since_retrain": since,
            "model_version": model_version, "processed_at": processed_at}


HISTORY_METRICS = {"forgotten_fraction": "history/forgotten_fraction",
                   "champion_validation_accuracy": "history/champion_validation_accuracy",
                   "champion_output_gap": "history/champion_output_gap",
                   "batches_since_retrain": "history/batches_since_retrain"}
