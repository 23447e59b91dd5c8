"""The qualify stage's work: the oracle certificate of every method of `qualify.methods` on every forget set of
the suite (unlearning/certificate/qualification.py), for the trained original (docs/certificate.md, "Two modes").

Each set runs exactly as a per-batch certificate does (tasks/certify.py `sequential`, its looks and gate), with
the leverage diagnostics computed for the set. The reference pool is the first batch's (batch index 0): its
shadow originals are trained on D once and found again in the ensemble cache for every later set; the oracles
are retrains on each set's R, so they are trained per set. Chunks go to the flow's task runner (threads or Dask).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tasks.batch import partition_retain
from tasks.batch_settings import BatchSettings
from tasks.certify import Evaluator, StepInputs, sequential
from tasks.diagnostics import leverage_diagnostics
from tasks.planning import ProbeInputs, reference_chunk, workers_of
from tasks.references import ReferencePool
from tasks.reporting import run_logger
from tasks.state import State, StateSettings, current_fingerprint, initial_state_manifest, original_path
from unlearning.batch.rows import batch_rows, eval_logits, retained_train_rows, sampled_for_certificate, validation_rows
from unlearning.config import Debt, Params, ProjectPaths, Validation
from unlearning.data import load_prepared
from unlearning.models import load_model
from unlearning.planning.plan import sequential_step
from unlearning.certificate.qualification import (SUITE_STREAM, Qualification, Trial, bin_deficits, draw_suite,
                                     draw_window_set, gap_in_noise_units, rank_position, window_for)
from unlearning.policy.selection import noise_floor

FILE = "qualification.json"


def fill_bins(q, observed: list[tuple[float, float]], D: np.ndarray, score: np.ndarray, seed: int,
              certify_set) -> list[str]:
    """Draw sets (qualify.extra_set_size rows from a window of the self-leverage ranking, aimed at the lowest bin
    still short: unlearning/certificate/qualification.py window_for) until every bin of predicted gap holds
    qualify.min_sets_per_bin sets, or qualify.max_extra_sets are spent; a bin aimed at three times without
    gaining a set is given up. `observed`: (ranking position, gap) per set so far, extended in place.
    -> the bins left short, in words."""
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(SUITE_STREAM, 1)))
    tries: dict[tuple[float, float], int] = {}
    for extra in range(q.max_extra_sets):
        short = [(lo, hi) for lo, hi, _ in bin_deficits([g for _, g in observed], q.bins, q.min_sets_per_bin)
                 if tries.get((lo, hi), 0) < 3]
        if not short:
            break
        lo, hi = short[0]
        tries[(lo, hi)] = tries.get((lo, hi), 0) + 1
        s = draw_window_set(f"gap_fill_{extra}", rng, D, score, window_for(observed, lo, hi), q.extra_set_size)
        observed.append((rank_position(s.rows, D, score), certify_set(s, f"fill {extra + 1}/{q.max_extra_sets}")))
    return [f"gap [{lo:g}, {hi:g}): {need} set(s) short of qualify.min_sets_per_bin = {q.min_sets_per_bin}"
            for lo, hi, need in bin_deficits([g for _, g in observed], q.bins, q.min_sets_per_bin)]


def qualification_path(paths: ProjectPaths) -> Path:
    """Where the qualify stage writes (a DVC out beside the original it qualifies: state/ is the deletion
    stage's persistent out, and DVC lets one path belong to one stage only)."""
    return paths.path("models_dir") / FILE


# The qualify flow's state: the original, checked against the current fingerprint as tasks/state.py checks it.
def original_state(settings: StateSettings, device: str) -> State:
    """The trained original and the prepared data, as the first batch sees them."""
    from tasks.state import check_original, _checkpoint

    prepared = load_prepared(settings.paths.path("prepared_dir"))
    current = current_fingerprint(settings, prepared)
    path = original_path(settings.paths)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the train stage first (`dvc repro train`)")
    ckpt = _checkpoint(path)
    check_original(settings.paths, settings.train.model, prepared, current,
                   {"spec": ckpt.get("spec"), **ckpt.get("extra", {})})
    model, extra = load_model(path, device)
    return State(prepared=prepared, model=model, manifest=initial_state_manifest(prepared.manifest), ledger=[],
                 champion={"model_version": extra.get("model_version"), "method": "original"}, fingerprint=current)


def self_leverage_score(state: State, rows: np.ndarray) -> np.ndarray:
    """A per-row self-leverage ranking of the training rows: the original's training loss (self-influence grows
    with the residual, as bench/calibration.py ranks them; the exact per-row self-leverage of every row would cost
    more than the stage)."""
    y = torch.as_tensor(state.prepared.label[rows], dtype=torch.long)
    logits = eval_logits(state.model, state.prepared, rows)[0]  # where the model is (base.device)
    return torch.nn.functional.cross_entropy(logits.double(), y, reduction="none").numpy()


# The qualify flow's top-level task, called with the whole params: it builds the records its steps read once
# (tasks/batch_settings.py: the step's and the probe's, as a batch reads them) and passes the diagnostics,
# partition and qualify sections on.
def qualify_model(params: Params, state: State, device: str, progress=None) -> Qualification:
    """The qualification of `state.model`: every method of params.qualify.methods certified on every set of the
    suite; gaps read in the noise unit of the shadow originals on the validation rows (`noise_floor`)."""
    log = run_logger()
    q, v = params.qualify, params.validation
    prepared, manifest = state.prepared, state.manifest
    D, V = retained_train_rows(manifest), validation_rows(manifest)
    ids = manifest["sample_id"].to_numpy()
    groups = manifest["group"].to_numpy() if "group" in manifest.columns else prepared.label
    score = self_leverage_score(state, D)
    suite = draw_suite(q.suite, params.base.seed, D, prepared.label, groups, score)
    objective = "retrain_equivalence"
    settings = BatchSettings.of(params)
    inputs, probing = settings.step_inputs, settings.probe_inputs
    chunk = reference_chunk(inputs.training, prepared, device)
    out = Qualification(list(q.methods), list(q.bins), q.confidence, q.interval, float("nan"),
                        fingerprint=dict(state.fingerprint))
    trials: list[Trial] = []
    noise = None
    started = time.perf_counter()

    def certify_set(s, label: str) -> float:
        """Every method's certificate on one set; -> its predicted gap in noise units."""
        nonlocal noise
        t0 = time.perf_counter()
        forget_ids = ids[s.rows].tolist()
        report, _ = leverage_diagnostics.fn(params.diagnostics, params.train.weight_decay, params.base.seed, False,
                                            prepared, manifest, forget_ids, state.model, device,
                                            params.train.label_smoothing, epochs=params.train.epochs,
                                            cross_every_row=params.deletion.partition.mode == "leverage")
        cross = report.cross_leverage if params.deletion.partition.mode == "leverage" else None
        partition = partition_retain(params.deletion.partition, prepared, manifest, forget_ids, state.model, cross)
        rows = batch_rows(prepared, manifest, forget_ids, partition)
        pool = ReferencePool(inputs.training, state, rows, device, 0, chunk, workers_of(v, device))
        if noise is None:  # the noise unit: the shadow originals (held out from V) on the validation rows
            shadows, _ = pool.ensure(v.n_shadows, 2)  # (2 oracles: the first look trains them anyway)
            noise = noise_floor(eval_logits(shadows, prepared, V))
            out.noise = noise
        gap = gap_in_noise_units(report.predicted_gap_forget, noise)
        if not trials:  # the first set: each method's run timed on this model (cached per version: the plan reads it)
            out.method_retrains = method_costs(probing, state, rows, device, list(q.methods))
        sampled = sampled_for_certificate(rows, v.certificate_rows, params.base.seed)
        for m in q.methods:
            step = sequential_step(m, v, params.gate, 1.0)
            tm = time.perf_counter()
            outcome, looks = sequential(step, inputs.args_of(m), inputs, state, rows, pool,
                                        device, objective, Evaluator(prepared, sampled, None, device))
            trials.append(Trial(s.name, s.kind, int(len(s.rows)), m, gap, bool(outcome.verdict.passed),
                                int(looks[-1].n_shadows + looks[-1].n_oracles), round(time.perf_counter() - tm, 2)))
        log.info(f"qualify [{label}] {s.name} ({len(s.rows)} rows): predicted gap {gap:.3g} noise units; "
                 + ", ".join(f"{t.method} {'passed' if t.passed else 'failed'}" for t in trials[-len(q.methods):])
                 + f" [{time.perf_counter() - t0:.1f} s]")
        return gap

    observed = [(rank_position(s.rows, D, score), certify_set(s, f"{k + 1}/{len(suite)}"))
                for k, s in enumerate(suite)]
    if q.min_sets_per_bin:
        out.unfilled = fill_bins(q, observed, D, score, params.base.seed, certify_set)
        for line in out.unfilled:
            log.info(f"qualify: bin left short: {line}")
    out.trials = trials
    log.info(f"qualified {len(q.methods)} method(s) on {len(suite)} sets in {time.perf_counter() - started:.0f} s")
    return out


def method_costs(inputs: ProbeInputs, state: State, rows, device: str, methods: list[str]) -> dict[str, float]:
    """Each method's run on one model in retrains, timed like with like (docs/design.md §4.6): the unit, one
    retrain, is the planner's probe (tasks/planning.py: training steps at one intra-op thread, the median after a
    warm-up step); each method runs on the original and a sample of the set's rows at the same one thread, warm (a
    first run, which pays torch's and the method's first-call costs, is left out: it is logged as the cold
    figure). Logged; the license reads the methods cheapest first by it."""
    from tasks.planning import _probe_positions, method_work, probe, rows_sizes, time_method, timed_methods
    from unlearning.planning.costs import method_retrains, sig
    from unlearning.models.training import intra_op_threads

    timing, _ = probe(inputs, state, rows, device)
    positions = _probe_positions(len(rows.retain), inputs.train.batch_size, inputs.seed)  # the probe's sample
    full = rows_sizes(rows, state.prepared.n_classes)
    costs, cold = {}, {}
    with intra_op_threads(1 if torch.device(device).type == "cpu" else None):  # the probe's threads
        for m in timed_methods(methods):
            first, _ = time_method(inputs, state, rows, positions, m, device)
            seconds, work = time_method(inputs, state, rows, positions, m, device)
            costs[m] = method_retrains(seconds, work, method_work(inputs, m, full), timing.retrain_seconds)
            cold[m] = method_retrains(first, work, method_work(inputs, m, full), timing.retrain_seconds)
    if costs:
        run_logger().info("qualify: method costs timed on this model (one thread, warm; cold first run in brackets): "
                          + ", ".join(f"{m} {sig(r)} ({sig(cold[m])}) retrain(s)"
                                      for m, r in sorted(costs.items(), key=lambda kv: kv[1]))
                          + f" (one retrain {sig(timing.retrain_seconds, 3)} s)")
    return costs


def table_frame(q: Qualification) -> pd.DataFrame:
    """The qualification table, one row per (method, gap bin)."""
    return pd.DataFrame([{"row": r.row_id, "method": r.method, "gap_lo": r.gap_lo, "gap_hi": r.gap_hi, "sets": r.n,
                          "passed": r.passes, "rate": r.rate, "lower": r.lower, "upper": r.upper} for r in q.table])


def write_qualification(path: Path, q: Qualification) -> None:
    """Write temp, then rename: a reader never sees half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(q.to_dict(), indent=1, default=float))
    os.replace(tmp, path)


def read_qualification(path: Path) -> Qualification | None:
    return Qualification.from_dict(json.loads(path.read_text())) if path.exists() else None


def require_qualification(paths: ProjectPaths, state) -> Qualification:
    """The qualification a qualified batch reads; ConfigError (one line: what, why, the fix) when it is missing,
    was written under per_batch, or qualifies another original (dataset, model or recipe)."""
    from unlearning.config import ConfigError

    path = qualification_path(paths)
    fix = "run `dvc repro qualify` (or `python -m flows.qualify`), or set validation.mode: per_batch"
    q = read_qualification(path)
    if q is None:
        raise ConfigError(f"validation.mode = 'qualified' needs {path}, which does not exist: {fix}")
    if q.skipped:
        raise ConfigError(f"validation.mode = 'qualified' but {path} qualified nothing ({q.skipped}): {fix}")
    if q.fingerprint.get("digest") != state.fingerprint.get("digest"):
        raise ConfigError(f"validation.mode = 'qualified' but {path} qualifies another original (fingerprint "
                          f"{q.fingerprint.get('digest')}, this one {state.fingerprint.get('digest')}): {fix}")
    return q


def license_for_batch(v: Validation, debt_cfg: Debt, paths: ProjectPaths, state, rows, report, n_train: int):
    """-> (License, the batch's predicted gap in noise units, the qualification, the retraining debt): the
    licensing rule (validation `v`: qualified_min_pass, qualified_bound) over the stored table, overridden by the
    retraining debt (deletion.debt `debt_cfg`) as per_batch's selection is."""
    from unlearning.policy.history import debt_reasons, retraining_debt
    from unlearning.certificate.qualification import EXACT, License, license_method, licenses_any

    q = with_audits(require_qualification(paths, state), read_audits(paths))
    gap = gap_in_noise_units(report.predicted_gap_forget, q.noise) if report is not None else float("nan")
    if report is None and not licenses_any(q.table, q.methods, v.qualified_min_pass, v.qualified_bound):
        lic = License(EXACT, None, f"the qualification licenses no method at any predicted gap "
                                   f"(>= {v.qualified_min_pass}, {v.qualified_bound} bound): exact retrain, "
                                   "diagnostics skipped")
    else:
        lic = license_method(q.table, gap, q.by_cost(), v.qualified_min_pass, v.qualified_bound)
    debt = retraining_debt(state.ledger, n_train)
    forced = debt_reasons(debt, len(rows.forget), debt_cfg.max_forgotten_fraction,
                          debt_cfg.max_batches_since_retrain)
    if forced and lic.method != EXACT:
        lic = License(EXACT, None, f"retraining debt: {'; '.join(forced)} (the qualification licensed {lic.method}: "
                                   f"{lic.reason})")
    return lic, gap, q, debt


def diagnostics_decide(v: Validation, paths: ProjectPaths, state) -> bool:
    """Whether a qualified batch's diagnostics can change its method: only when the stored qualification (with
    its audits) licenses some method at some predicted gap (unlearning/certificate/qualification.py licenses_any)."""
    from unlearning.certificate.qualification import licenses_any

    q = with_audits(require_qualification(paths, state), read_audits(paths))
    return licenses_any(q.table, q.methods, v.qualified_min_pass, v.qualified_bound)


# --- audits ----------------------------------------------------------------------------------------------------

from tasks.pending import AUDITS, read_audits  # noqa: E402,F401  (unlearn status: without the certificate)


def append_audit(paths: ProjectPaths, record: dict) -> None:
    """One record more (write temp, then rename: a reader never sees half a line)."""
    path = paths.path("state_dir") / AUDITS
    lines = [json.dumps(r, default=float) for r in [*read_audits(paths), record]]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def with_audits(q: Qualification, audits: list[dict]) -> Qualification:
    """The qualification table as the audits updated it: each audit's full certificate is one more trial of
    its method at its batch's predicted gap."""
    for a in audits:
        if a.get("kind") == "audit" and a.get("gap_to_noise") is not None:
            q = q.with_trial(Trial(a["batch_id"], "audit", int(a.get("n_forget", 0)), a["method"],
                                   float(a["gap_to_noise"]), bool(a["passed"]), int(a.get("references", 0)),
                                   float(a.get("seconds", 0.0)), source="audit"))
    return q


def audit_certificate(inputs: StepInputs, state: State, rows, device: str, method: str, batch_index: int,
                      objective: str) -> dict:
    """The full certificate of a qualified batch (its per_batch sequential certificate, the batch's own reference
    seeds): what per_batch mode would have decided."""
    t = inputs.training
    v = t.validation
    started = time.perf_counter()
    pool = ReferencePool(t, state, rows, device, batch_index, reference_chunk(t, state.prepared, device),
                         workers_of(v, device))
    sampled = sampled_for_certificate(rows, v.certificate_rows, t.seed)
    outcome, looks = sequential(sequential_step(method, v, inputs.gate, 1.0), inputs.args_of(method),
                                inputs, state, rows, pool, device, objective,
                                Evaluator(state.prepared, sampled, None, device))
    return {"passed": bool(outcome.verdict.passed), "references": int(looks[-1].n_shadows + looks[-1].n_oracles),
            "looks": len(looks), "failures": list(outcome.verdict.failures)[:5],
            "seconds": round(time.perf_counter() - started, 2)}
