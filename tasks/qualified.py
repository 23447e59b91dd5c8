"""A qualified batch's candidate (validation.mode qualified; docs/certificate.md, "Two modes"): the method the
model's qualification licensed, run on the production model and judged by the cheap checks alone, no reference
model (tasks/certify.py runs it for a step whose certificate is `qualified`)."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from tasks.references import ReferenceTraining
from unlearning.certificate.acceptance import CandidateOutcome, reference_free_outcome, split_records_of
from unlearning.batch.rows import BatchRows, unlearn_context
from unlearning.config import Gate
from unlearning.methods import run_method
from unlearning.seeds import method_seed


def qualified_outcome(method: str, args: dict, training: ReferenceTraining, gate: Gate, state, rows: BatchRows,
                      device: str, objective: str, ev) -> CandidateOutcome:
    """A method the model's qualification licensed (validation.mode qualified), on the production model alone,
    with the cheap checks (unlearning/certificate/qualification.py cheap_checks): accuracy per split against the original's,
    and the membership test of the forget rows against the validation rows. No reference model."""
    from unlearning.certificate.qualification import cheap_checks, largest_class_share, membership_test
    from unlearning.sequential import permutations_for

    t0 = time.perf_counter()
    label = f"{method} (production)" if training.progress else False
    res = run_method(method, unlearn_context(state.model.to(device), state.prepared, rows, training.recipe,
                                             method_seed(training.seed), progress=label), args)
    cand = ev(res.model)
    ids = ev.prepared.manifest["sample_id"].to_numpy()[ev.eval_rows]
    cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds}
    out = reference_free_outcome(method, res.model, cand, ev(state.model), ev.labels, ev.splits, ids, gate,
                                 objective, cost, t0)
    g = gate.retrain_equivalence
    losses = torch.nn.functional.cross_entropy(cand[0].double(), torch.as_tensor(ev.labels, dtype=torch.long),
                                               reduction="none").numpy()
    f, v = ev.splits == "forget", ev.splits == "validation"
    auc, p = membership_test(losses[f], ev.labels[f], losses[v], ev.labels[v], permutations_for(g.alpha,
                                                                                                g.n_permutations),
                             training.seed)
    metrics = {**out.metrics, "mia_auc/forget_vs_validation": auc, "membership_pvalue/forget_vs_validation": p}
    share = largest_class_share(state.prepared.label[rows.forget], state.prepared.label[rows.before])
    checks, failures = cheap_checks(metrics, g.max_validation_drop, p, g.alpha, share,
                                    training.validation.qualified_max_class_share)
    verdict = out.verdict.with_checks(checks, failures)
    return replace(out, metrics=metrics, verdict=verdict, cost={**out.cost, "wall_seconds": time.perf_counter() - t0},
                   splits=split_records_of(out.measures, verdict))
