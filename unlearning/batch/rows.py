"""Pure pieces of one deletion batch: the row sets, the unlearning context and the validation metrics.

Row sets (positions into the prepared dataset):
- D (before): training rows still retained before this batch; F: the batch's forget rows;
- R = D minus F, split by the partition into adjacent and remote; V: validation rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from unlearning.data.store import Prepared
from unlearning.methods.base import TrainRecipe, UnlearnContext
from unlearning.models import Ensemble, predict_logits

from unlearning.metrics.summary import SPLITS  # noqa: E402,F401  (the evaluated splits, defined once)


@dataclass
class BatchRows:
    before: np.ndarray  # D: retained training rows before the batch
    forget: np.ndarray  # F
    retain: np.ndarray  # R = D \ F (ordered like the manifest)
    adjacent_mask: np.ndarray  # [len(retain)] bool
    validation: np.ndarray  # V
    # [len(validation)] bool: the held-out rows the batch entangles (`validation_adjacent_mask`); None: not known
    validation_adjacent: np.ndarray | None = None

    def eval_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """All rows that are evaluated, and their split label (forget/adjacent/remote/validation)."""
        rows = np.concatenate([self.forget, self.retain[self.adjacent_mask], self.retain[~self.adjacent_mask],
                               self.validation])
        labels = np.repeat(np.array(SPLITS), [len(self.forget), int(self.adjacent_mask.sum()),
                                              int((~self.adjacent_mask).sum()), len(self.validation)])
        return rows, labels

    def remote_validation(self) -> np.ndarray | None:
        """[n_eval] bool over `eval_rows()`: the validation rows the batch does not entangle (None: not known).
        The gate's validation floors compare these (unlearning/certificate/gate.py): a batch that erases a class loses that
        class's validation rows by construction, and that drop is reported, not gated."""
        if self.validation_adjacent is None:
            return None
        head = np.zeros(len(self.forget) + len(self.retain), dtype=bool)
        return np.concatenate([head, ~np.asarray(self.validation_adjacent, dtype=bool)])


def sampled_for_certificate(rows: BatchRows, cap: int | None, seed: int) -> BatchRows:
    """The rows the certificate evaluates: every forget row, and at most `cap` retain rows (adjacent and remote
    in proportion) and `cap` validation rows, a sample seeded by `seed` (None = every row). KLoM P95 and the
    accuracies per split are statistics over rows: a stated sample keeps their error small while the
    certificate's cost (members x rows x permutations) stops growing with the table."""
    if cap is None:
        return rows
    rng = np.random.default_rng(seed)

    def sample(n: int) -> np.ndarray:
        return np.arange(n) if n <= cap else np.sort(rng.choice(n, cap, replace=False))

    keep, keep_v = sample(len(rows.retain)), sample(len(rows.validation))
    return BatchRows(before=rows.before, forget=rows.forget, retain=rows.retain[keep],
                     adjacent_mask=rows.adjacent_mask[keep], validation=rows.validation[keep_v],
                     validation_adjacent=None if rows.validation_adjacent is None else rows.validation_adjacent[keep_v])


def retained_train_rows(state_manifest: pd.DataFrame) -> np.ndarray:
    """D: positions of the training rows not deleted yet (manifest order = prepared-data order)."""
    m = state_manifest
    return np.flatnonzero(((m["split"] == "train") & (m["status"] == "retained")).to_numpy())


def retain_rows(state_manifest: pd.DataFrame, forget_ids) -> np.ndarray:
    """R = D minus the forget set, in manifest order."""
    before = retained_train_rows(state_manifest)
    return before[~state_manifest["sample_id"].iloc[before].isin(list(forget_ids)).to_numpy()]


def validation_rows(manifest: pd.DataFrame) -> np.ndarray:
    """V: positions of the held-out rows, less those a request erased (status `deleted`: the batch's
    validation metrics and gate use the remaining ones)."""
    held_out = (manifest["split"] == "val").to_numpy()
    if "status" in manifest.columns:
        held_out = held_out & (manifest["status"] != "deleted").to_numpy()
    return np.flatnonzero(held_out)


def validation_adjacent_mask(state_manifest: pd.DataFrame, forget: np.ndarray, validation: np.ndarray) -> np.ndarray:
    """[len(validation)] bool: the held-out rows the batch entangles, those sharing a group with a forget row (the
    declared group column; the class when none is declared: docs/design.md §4.4, mode `group`). In every
    partition mode the validation rows are split this way: the leverage and embedding scores rank training rows
    only. Whole-class erasure: the class's validation rows are adjacent, every other one remote."""
    from unlearning.batch.partition import partition_by_group

    groups = state_manifest["group"].to_numpy()
    table = partition_by_group(np.arange(len(validation)).astype(str), groups[validation], groups[forget])
    return (table["subset"] == "adjacent").to_numpy()


def batch_rows(prepared: Prepared, state_manifest: pd.DataFrame, forget_ids, partition: pd.DataFrame) -> BatchRows:
    before = retained_train_rows(state_manifest)
    forget = prepared.rows(forget_ids)
    retain = retain_rows(state_manifest, forget_ids)
    subset = partition.set_index("sample_id")["subset"]
    adjacent = (subset.reindex(prepared.manifest["sample_id"].to_numpy()[retain]) == "adjacent").to_numpy()
    validation = validation_rows(state_manifest)
    return BatchRows(before=before, forget=forget, retain=retain, adjacent_mask=adjacent, validation=validation,
                     validation_adjacent=validation_adjacent_mask(state_manifest, forget, validation))


def unlearn_context(model: Ensemble, prepared: Prepared, rows: BatchRows, recipe: TrainRecipe, seed: int,
                    progress: bool | str | None = None) -> UnlearnContext:
    """The method's inputs for a batch; `progress` None = the process default (base.progress, set by the flows)."""
    device = next(model.parameters()).device
    X = prepared.tensor()
    y = torch.as_tensor(prepared.label, dtype=torch.long)
    return UnlearnContext(
        model=model, X_forget=X[rows.forget].to(device), y_forget=y[rows.forget].to(device),
        X_retain=X[rows.retain].to(device), y_retain=y[rows.retain].to(device),
        adjacent_mask=torch.as_tensor(rows.adjacent_mask.copy(), device=device), recipe=recipe, seed=seed,
        progress=progress)


def eval_logits(model: Ensemble, prepared: Prepared, rows: np.ndarray, rows_per_pass: int = 8192) -> torch.Tensor:
    """[N, n_rows, C] logits on the given rows, `rows_per_pass` rows at a time (the certificate streams member
    chunks through it: tasks/certify.py Evaluator, sized by unlearning/planning/plan.py to validation.memory_mb)."""
    return predict_logits(model, torch.as_tensor(prepared.X[rows], dtype=torch.float32), rows_per_pass)


def cross_entropy_losses(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-sample cross-entropy of each member, in float64: logits [N, n, C] -> [N, n]."""
    from unlearning.methods.losses import per_sample_loss

    z = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long).expand(z.shape[0], -1)
    return per_sample_loss(z, y, "ce").numpy()


def membership_metrics(candidate_logits: np.ndarray, shadow_logits: np.ndarray, oracle_logits: np.ndarray,
                       labels: np.ndarray, splits: np.ndarray) -> dict[str, float]:
    """Membership inference on the forget split.

    - population loss-threshold AUC, forget vs validation, of the candidate and (reference) of an oracle:
      an unlearned model that is like a retrain scores about the oracle's AUC;
    - per-example epsilon of the NeurIPS 2023 unlearning challenge between the shadow-unlearned models and
      the oracles (logit-scaled confidences), its mean and P95, and the challenge's forget-quality score."""
    from unlearning import metrics as M

    forget, val = splits == "forget", splits == "validation"
    out: dict[str, float] = {}
    if forget.any() and val.any():
        cand = cross_entropy_losses(candidate_logits, labels)[0]
        orc = cross_entropy_losses(oracle_logits, labels)[0]
        out["mia_auc/candidate"] = M.loss_threshold_auc(cand[forget], cand[val])
        out["mia_auc/oracle"] = M.loss_threshold_auc(orc[forget], orc[val])
    if forget.any():
        eps = M.per_example_epsilon(M.logit_scaled_confidence(shadow_logits, labels)[:, forget],
                                    M.logit_scaled_confidence(oracle_logits, labels)[:, forget])
        out["mia_epsilon_mean/forget"] = float(eps.mean())
        out["mia_epsilon_p95/forget"] = float(np.percentile(eps, 95))
        if shadow_logits.shape[0] >= 3:
            out["forget_quality"] = M.forget_quality_score(eps, shadow_logits.shape[0])
    return out
