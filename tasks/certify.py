"""One candidate of the plan, run and certified the way its step says (unlearning/planning/plan.py):

- `exact`: one retrain on the retain rows, checked against the original's accuracy (no references);
- `absolute`: the method on the production model, judged by absolute bounds and the original (suppression);
- `sequential`: the method on the production model and on the shadows look by look, rejected at the first
  decisive look, accepted only at the last (unlearning/sequential.py);
- `audit`: the exact retrain judged against oracles (tasks/batch.py unlearn_and_validate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from tasks.batch import unlearn_and_validate
from tasks.references import ReferencePool, ReferenceTraining
from tasks.reporting import run_logger
from unlearning.certificate.acceptance import CandidateOutcome, Measurement, measure_logits, outcome_of, reference_free_outcome
from unlearning.batch.rows import BatchRows, sampled_for_certificate, unlearn_context
from unlearning.config import EXACT_RETRAIN, CertificateKind, Gate, method_traits
from unlearning.methods import run_method
from unlearning.models import Ensemble, predict_logits
from unlearning.planning.plan import Plan, Step
from unlearning.progress import Progress
from unlearning.seeds import method_seed, reference_seeds
from unlearning.sequential import Criterion, Look, LookSpec, run_looks


class Evaluator:
    """Logits on the evaluated rows, streamed under the plan's memory sizes, on `device` (base.device: the
    reference chunks come back from their tasks on the CPU, and are evaluated where the batch computes). The
    evaluated rows' features move to the device once, on the first call, not once per member chunk."""

    def __init__(self, prepared, rows: BatchRows, plan: Plan | None, device: str | None = None):
        self.prepared, self.rows, self.device = prepared, rows, device
        self.eval_rows, self.splits = rows.eval_rows()
        self.labels = prepared.label[self.eval_rows]
        self.members = plan.eval_members if plan is not None and plan.eval_members else None
        self.block = plan.eval_block_rows if plan is not None and plan.eval_block_rows else 8192
        self._X: torch.Tensor | None = None  # [n_eval, ...] features, on the device after the first call

    def features(self, device: torch.device) -> torch.Tensor:
        if self._X is None or self._X.device != device:
            self._X = torch.as_tensor(self.prepared.X[self.eval_rows], dtype=torch.float32).to(device)
        return self._X

    def __call__(self, model: Ensemble, bar: Progress | None = None) -> torch.Tensor:
        """[N, n, C] logits, member chunk by member chunk; `bar` counts the members done (its ETA is in
        members, the unit every look's work is measured in)."""
        step = self.members or model.n_models
        parts = []
        for i in range(0, model.n_models, step):
            part = model if step >= model.n_models else model.select(list(range(i, min(i + step, model.n_models))))
            if self.device is not None:
                part = part.to(self.device)
            X = self.features(next(part.parameters()).device)
            parts.append(predict_logits(part, X, self.block))
            if bar is not None:
                bar.update(part.n_models)
        return torch.cat(parts, 0)


@dataclass(frozen=True)
class StepInputs:
    """What running and certifying a step reads of the params: how models train (the recipe, the model, the
    seed, validation's sizes, base.progress, the cache and the id key: tasks/references.py ReferenceTraining),
    the gate, and each method's arguments (deletion.method_args)."""

    training: ReferenceTraining
    gate: Gate
    method_args: dict

    def args_of(self, method: str) -> dict:
        return self.method_args.get(method, {})


def run_step(step: Step, inputs: StepInputs, state, rows: BatchRows, pool: ReferencePool | None, plan: Plan | None,
             device: str, objective: str, batch_index: int) -> tuple[CandidateOutcome, list[Look]]:
    """Run and certify one step; returns the outcome and, for a sequential certificate, its looks."""
    args = inputs.args_of(step.method)
    t = inputs.training
    ev = Evaluator(state.prepared, rows, plan, device)
    if step.certificate == CertificateKind.EXACT and method_traits(step.method).needs_sharded_original:
        return sharded_exact(step.method, inputs, state, rows, device, objective, ev), []
    if step.certificate == CertificateKind.EXACT:
        return exact_retrain(inputs, state, rows, device, objective, batch_index, ev), []
    if step.certificate == CertificateKind.ABSOLUTE:
        return absolute(step.method, args, inputs, state, rows, device, objective, ev), []
    if step.certificate == CertificateKind.QUALIFIED:
        sampled = sampled_for_certificate(rows, t.validation.certificate_rows, t.seed)
        from tasks.qualified import qualified_outcome

        return qualified_outcome(step.method, args, t, inputs.gate, state, rows, device, objective,
                                 Evaluator(state.prepared, sampled, plan, device)), []
    if step.certificate == CertificateKind.AUDIT:
        shadows, oracles = pool.ensure(*step.references)
        return unlearn_and_validate(step.method, args, inputs.gate, t.seed, t.progress,
                                    state.prepared, rows, state.model, shadows, oracles, t.recipe,
                                    objective, device), []
    sampled = sampled_for_certificate(rows, t.validation.certificate_rows, t.seed)
    return sequential(step, args, inputs, state, rows, pool, device, objective,
                      Evaluator(state.prepared, sampled, plan, device))


def _reference_free_outcome(method: str, model: Ensemble, ev: Evaluator, production: Ensemble, gate: Gate,
                            objective: str, cost: dict, t0: float) -> CandidateOutcome:
    """The candidate and the original on the evaluated rows, judged without reference models (the core's
    reference_free_outcome)."""
    ids = ev.prepared.manifest["sample_id"].to_numpy()[ev.eval_rows]
    return reference_free_outcome(method, model, ev(model), ev(production), ev.labels, ev.splits, ids, gate,
                                  objective, cost, t0, remote_validation=ev.rows.remote_validation())


def exact_retrain(inputs: StepInputs, state, rows: BatchRows, device: str, objective: str, batch_index: int,
                  ev: Evaluator) -> CandidateOutcome:
    """One model trained from scratch on the retain rows with the recipe: exact unlearning by construction.
    Its seed is this batch's oracle member 0 (unlearning/seeds.py), so an audit finds the same model."""
    t0 = time.perf_counter()
    prepared = state.prepared
    t = inputs.training
    seed = reference_seeds(t.seed, batch_index, 1, 1)[1][0]
    X = torch.as_tensor(prepared.X[rows.retain], dtype=torch.float32)
    y = torch.as_tensor(prepared.label[rows.retain], dtype=torch.long)
    ids = prepared.manifest["sample_id"].to_numpy()[rows.retain].tolist()
    model, cached, seconds = t.train_chunk(prepared, X, y, ids, [seed], device, EXACT_RETRAIN)
    cost = {"gradient_evals": 0 if cached else int(len(rows.retain)) * t.recipe.epochs, "steps": 0,
            "seconds": seconds, "from_cache": bool(cached), "models_trained": 0 if cached else 1}
    return _reference_free_outcome(EXACT_RETRAIN, model, ev, state.model, inputs.gate, objective, cost, t0)


def sharded_exact(method: str, inputs: StepInputs, state, rows: BatchRows, device: str, objective: str,
                  ev: Evaluator) -> CandidateOutcome:
    """Exact unlearning of a sharded original (`method`: unlearning/methods/sisa.py): the shards that held the forget rows
    retrain from the checkpoint before their first slice; the result, with its new shard state, is judged as an
    exact retrain is (accuracy against the original's, no references). A model trained as one is refused."""
    t0 = time.perf_counter()
    ids = state.prepared.manifest["sample_id"].astype(str).to_numpy()[rows.forget].tolist()
    t = inputs.training
    ctx = unlearn_context(state.model, state.prepared, rows, t.recipe, method_seed(t.seed),
                          progress=method if t.progress else False)
    ctx.forget_ids = ids
    res = run_method(method, ctx, inputs.args_of(method))
    info = res.info
    run_logger().info(f"  {method}: retrained shard(s) {info['shards_retrained']} of {info['shards']} from slice(s) "
                      f"{info['first_slice']} ({len(info['slices_retrained'])} of {info['shards'] * info['slices']} "
                      f"slices, {info['cost_in_retrains']:.3f} of a full retrain)")
    cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds,
            "models_trained": len(info["shards_retrained"]), "cost_in_retrains": info["cost_in_retrains"],
            "shards_retrained": len(info["shards_retrained"]), "slices_retrained": len(info["slices_retrained"])}
    out = _reference_free_outcome(method, res.model, ev, state.model, inputs.gate, objective, cost, t0)
    return replace(out, info=info)  # the ledger records which shards and slices were retrained


def absolute(method: str, args: dict, inputs: StepInputs, state, rows: BatchRows, device: str, objective: str,
             ev: Evaluator) -> CandidateOutcome:
    """The method on the production model alone, judged by the gate's absolute and original-relative bounds."""
    t0 = time.perf_counter()
    t = inputs.training
    label = f"{method} (production)" if t.progress else False
    res = run_method(method, unlearn_context(state.model.to(device), state.prepared, rows, t.recipe,
                                             method_seed(t.seed), progress=label), args)
    cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds}
    return _reference_free_outcome(method, res.model, ev, state.model, inputs.gate, objective, cost, t0)


def sequential(step: Step, args: dict, inputs: StepInputs, state, rows: BatchRows, pool: ReferencePool, device: str,
               objective: str, ev: Evaluator) -> tuple[CandidateOutcome, list[Look]]:
    """The sequential certificate of an approximate candidate (unlearning/sequential.py run_looks, the loop every
    caller shares): the method runs once on the production model; each look grows the pool to its references,
    runs the method on the new shadows (on every row of `rows`) and evaluates each new member once, on the
    evaluator's rows (validation.certificate_rows)."""
    t0 = time.perf_counter()
    seed, progress, log = inputs.training.seed, inputs.training.progress, run_logger()
    m_seed, rec = method_seed(seed), inputs.training.recipe
    res = run_method(step.method, unlearn_context(state.model.to(device), state.prepared, rows, rec, m_seed,
                                                  progress=f"{step.method} (production)" if progress else False), args)
    logits = {"candidate": ev(res.model), "original": ev(state.model)}
    grown = {"unlearned": [], "oracles": [], "shadows": 0}
    cost = {"gradient_evals": res.cost.gradient_evals, "steps": res.cost.steps, "seconds": res.cost.seconds,
            "shadow_gradient_evals": 0, "shadow_seconds": 0.0}
    criterion = Criterion.of_step(inputs.gate, step, objective=objective, exact=method_traits(step.method).exact)

    def measure(spec: LookSpec) -> Measurement:
        done_s, done_o = grown["shadows"], sum(len(x) for x in grown["oracles"])
        shadows, oracles = pool.ensure(spec.n_shadows, spec.n_oracles)
        fresh = shadows.select(list(range(done_s, spec.n_shadows)))
        label = f"{step.method} (shadows {done_s + 1}-{spec.n_shadows})" if progress else False
        shadow_res = run_method(step.method, unlearn_context(fresh.to(device), state.prepared, rows, rec, m_seed,
                                                             progress=label), args)
        cost["shadow_gradient_evals"] += shadow_res.cost.gradient_evals
        cost["shadow_seconds"] += shadow_res.cost.seconds
        # one line at least every 10 s: members evaluated (the unit of the ETA), then the permutation test as
        # the last unit (its chunks tick the bar: unlearning/metrics/permutation.py)
        with Progress((spec.n_shadows - done_s) + (spec.n_oracles - done_o) + 1, f"certificate of {step.method}: "
                      f"look {spec.index + 1}/{spec.total}", unit="units", enabled=progress) as bar:
            bar.stage("evaluate")
            grown["unlearned"].append(ev(shadow_res.model, bar))
            grown["oracles"].append(ev(oracles.select(list(range(done_o, spec.n_oracles))), bar))
            grown["shadows"] = spec.n_shadows
            bar.stage(f"permutation test, {spec.n_permutations} relabelings")
            both = torch.cat(grown["oracles"], 0)
            logits.update(oracles=both, oracle_ref=both, accuracy_ref=both,
                          shadow_unlearned=torch.cat(grown["unlearned"], 0))
            out = measure_logits(logits, state.prepared, ev.rows, seed, spec.n_shadows,
                                 **criterion.measure_args(spec))
            bar.update()
        return out

    certified = run_looks(criterion, measure,
                          on_look=lambda look, spec: log.info("  " + look.line(step.method, spec.index, spec.total)))
    return outcome_of(step.method, res.model, certified, dict(cost), t0), list(certified.looks)
