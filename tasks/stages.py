"""The stages of one deletion batch (docs/design.md §1), one Prefect task each, in pipeline order:

validate -> diagnose -> partition -> select -> plan -> unlearn-and-certify (per step of the plan, training
only the reference models its certificate needs) -> promote -> erase -> report.

Each stage takes its config slice, logs to MLflow through the one tracking module (`BatchRun.tracker`, a
child run per stage under the batch run) and publishes a Prefect artifact that a reviewer reads on the flow
run's page. Reference models are trained by tasks/references.py, whose chunks are Prefect tasks submitted to
the flow's task runner (threads or Dask); the plan (unlearning/planning/plan.py) says how many, if any.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters import clock, plots
from tasks.batch import partition_retain
from tasks.batch_settings import BatchSettings
from tasks.certify import StepInputs
from tasks.id_key import IdKey
from tasks.stores.base import ErasureSettings
from unlearning.certificate.acceptance import CandidateOutcome, accept, split_records
from adapters.clock import computes
from tasks.reporting import markdown_artifact, run_logger, table_artifact
from tasks.state import State, write_state
from unlearning.batch.rows import BatchRows, batch_rows, eval_logits
from unlearning.batch.summary import CandidateLine, failing_checks_in_words, purged_rows_text, summary_markdown
from unlearning.config import Deletion, Diagnostics, Gate, Partition, ProjectPaths, Train
from unlearning.data.store import class_names_after
from unlearning.certificate.gate import format_beside, verdict_summary
from unlearning.certificate.resolution import can_reject, smallest_klom_pvalue
from unlearning.policy.history import HISTORY_METRICS, history_point
from unlearning.io import commit_dir, discard_dir, fault, staging_dir
from unlearning.privacy.ledger import ERASED_NOT_TRAINED_ON, UNLEARNED, appended, hash_sample_id
from unlearning.metrics.exchangeability import exchangeability_test
from unlearning.metrics.margins import margins
from unlearning.models import Ensemble
from unlearning.batch.partition import subset_sizes
from unlearning.requests import RequestValidationError, batch_objective, coerce_requests, file_sha256
from unlearning.serving import input_example
from unlearning.batch.records import Promotion, Selection
from unlearning.policy.selection import batch_facts, selection_with_debt

# A stage's inputs are models, stores and an MLflow client: its result is never cached by its inputs.
STAGE = {"cache_policy": NO_CACHE}


@dataclass
class BatchRun:
    """What the stages of one batch share: the MLflow batch run they log under and the summary they fill."""
    tracker: Any  # adapters.tracking.Tracker
    parent: str  # the MLflow batch run
    path: Path  # the request file
    batch_id: str
    device: str
    summary: dict  # unlearning.batch.summary.summary_markdown's arguments, filled in as the batch goes
    child: str | None = None  # the MLflow run of the stage in progress (ended FAILED if the batch fails)
    committed: bool = False  # state/ holds this batch (set by `promote`)
    seconds: dict = field(default_factory=dict)  # measured seconds per stage, beside the plan's predictions
    probe: tuple | None = None  # the planner's (Timing, Footprint) of this batch, measured once
    started: float = field(default_factory=time.perf_counter)
    wall: float | None = None  # the batch's one duration, fixed when it closes (`wall_seconds`)
    last_outcome: Any = None  # the last candidate judged (`accepted`): what a held batch's review shows
    predicted: tuple | None = None  # the plan's (seconds per phase, (low, high) per phase, its model phases)
    history: Path | None = None  # the project's phase history (unlearning/planning/overhead.py History), set by `plan`

    def open(self, name: str, tags: dict | None = None) -> str:
        self.child = self.tracker.start_run(name, self.parent, tags)
        return self.child

    def close(self, ok: bool = True) -> None:
        self.tracker.end_run(self.child, ok=ok)
        self.child = None

    def key(self, what: str) -> str:
        """A Prefect artifact key of this batch (its latest version is the one the UI shows)."""
        return f"{self.batch_id}-{what}"


# 1. validate ---------------------------------------------------------------------------------------------
@task(name="validate", **STAGE)
@computes
@clock.phase("validation")
def validate(batch: BatchRun, check, pending: pd.DataFrame,
             default_objective: str) -> tuple[pd.DataFrame | None, str | None, RequestValidationError | None]:
    """Log the request file's checks (pandera + the Great Expectations suite). Returns the typed requests and
    the batch's objective, or the validation error for the caller to raise: a bad file is a rejection the
    flow reports in one place, not a failed task with a traceback."""
    run = batch.open("validate")
    batch.tracker.log_json(run, check.gx_result, "gx_result.json")
    batch.tracker.log_json(run, {"problems": check.problems}, "problems.json")
    batch.tracker.log_metrics(run, {"n_requests": len(pending), "n_problems": len(check.problems),
                                    "n_skipped_already_processed": check.skipped})
    docs = getattr(check, "data_docs", None)
    if docs:
        batch.tracker.log_dir(run, docs, "data_docs")
    batch.close(ok=check.status == "ok")
    lines = [f"- {p}" for p in check.problems] or [f"- {len(pending)} request(s), no problems"]
    markdown_artifact(f"### Validation of `{batch.path.name}`: {check.status}\n\n" + "\n".join(lines),
                      key=batch.key("validation"), description=f"request file {batch.path.name}: {check.status}")
    try:
        if check.status != "ok":
            raise check.error()
        requests = coerce_requests(pending)
        objective = batch_objective(requests, default_objective, batch.path)
    except RequestValidationError as e:
        return None, None, e
    batch.summary.update(objective=objective, n_forgotten=len(requests))
    return requests, objective, None


# 2. diagnose ---------------------------------------------------------------------------------------------
@task(name="diagnose", **STAGE)
@computes
@clock.phase("diagnostics")
def diagnose(batch: BatchRun, cfg: Diagnostics, weight_decay: float, seed: int, progress: bool, state: State,
             forget_ids: list[str], label_smoothing: float = 0.0, epochs: int | None = None,
             cross_every_row: bool = False, skipped: str | None = None):
    """Leverage diagnostics of the production model for this forget set, before any unlearning runs (`skipped`:
    why no candidate would read them: said on the console and in the stage's artifact, nothing computed); `cfg`:
    params.diagnostics, `weight_decay`: train.weight_decay (the GGN damping), `seed`/`progress`: base.*,
    `label_smoothing`: train.label_smoothing, `epochs`: train.epochs (solver auto's budget of max_retrains
    retrains), `cross_every_row`: deletion.partition.mode is leverage (it ranks every retain row)."""
    from tasks.diagnostics import leverage_diagnostics, log_diagnostics, poor_check_line

    if skipped:
        run_logger().info(f"{batch.path.name}: diagnostics skipped: {skipped}")
        markdown_artifact(f"### Leverage diagnostics skipped\n\n{skipped} (diagnostics.record: true computes them "
                          f"for the record anyway)", key=batch.key("diagnostics"), description="leverage diagnostics")
        return None
    if getattr(state.model, "shard_state", None) is not None:  # sisa is exact: the diagnostics would decide nothing
        run_logger().info(f"{batch.path.name}: diagnostics skipped: the original is sharded (train.sharding), and "
                          f"method sisa unlearns it exactly")
        return None
    run = batch.open("diagnostics")
    started = time.perf_counter()
    report, tables = leverage_diagnostics.fn(cfg, weight_decay, seed, progress, state.prepared, state.manifest,
                                             forget_ids, state.model, batch.device, label_smoothing, epochs=epochs,
                                             cross_every_row=cross_every_row)
    batch.seconds["diagnostics"] = time.perf_counter() - started  # the plan counts them (plan_vs_actual)
    log_diagnostics(batch.tracker, run, report, tables)
    batch.close()
    if poor := poor_check_line(report):
        run_logger().warning(f"{batch.path.name}: {poor}")
    table_artifact([{"diagnostic": k, "value": round(float(v), 6)} for k, v in {
        "self-leverage trace": report.self_leverage_trace,
        "self-leverage spectral norm": report.self_leverage_spectral_norm,
        "leakage ratio": report.leakage_ratio, "predicted gap (do nothing)": report.predicted_gap_do_nothing}.items()],
        key=batch.key("diagnostics"), description=f"leverage diagnostics ({report.solver})")
    return report


# 3. partition --------------------------------------------------------------------------------------------
@task(name="partition", **STAGE)
@computes
def partition(batch: BatchRun, cfg: Partition, state: State, forget_ids: list[str],
              cross_leverage: np.ndarray | None, source: str) -> BatchRows:
    """Split the retain set into adjacent (entangled with the forget set) and remote rows; `cfg`:
    params.deletion.partition. The forget and retain sets go to the batch run's Datasets (ids, splits and
    labels with a digest, no features; `source`: the prepared folder)."""
    run = batch.open("partition")
    table = partition_retain(cfg, state.prepared, state.manifest, forget_ids, state.model, cross_leverage)
    rows = batch_rows(state.prepared, state.manifest, forget_ids, table)
    cols = ["sample_id", "split", "label"]
    batch.tracker.log_datasets(batch.parent, {"forget": state.manifest.iloc[rows.forget][cols],
                                              "retain": state.manifest.iloc[rows.retain][cols]},
                               source=source, name=state.prepared.info["name"])
    sizes = subset_sizes(table)
    batch.tracker.log_table(run, table, "partition.json")
    batch.tracker.log_metrics(run, {f"n_{k}": v for k, v in sizes.items()})
    batch.tracker.log_params(run, {"mode": cfg.mode})
    batch.close()
    table_artifact([{"subset": k, "rows": int(v)} for k, v in sizes.items()], key=batch.key("partition"),
                   description=f"retain set partition (mode {cfg.mode})")
    return rows


# 4. plan: which candidates, certified how, with which reference models -----------------------------------
@task(name="plan", **STAGE)
@computes
@clock.phase("candidates")
def plan(batch: BatchRun, settings: BatchSettings, state: State, rows: BatchRows, selection: Selection,
         objective: str):
    """The batch's plan (unlearning/planning/plan.py) from the selection, a short timing probe and the memory footprint:
    logged (MLflow `plan.json`, a Prefect artifact, the console) before any model is trained. A plan that
    cannot fit validation.memory_mb raises PlanRefused, naming the key."""
    from tasks.planning import batch_plan, probe
    from unlearning.planning.plan import PlanRefused, plan_lines

    # a batch that plans again (after the first look's noise floor) reads the first probe back from the cache
    # (tasks/planning.py), timing only the candidates it had not timed
    batch.probe = probe(settings.probe_inputs, state, rows, batch.device, selection.candidates)
    timing, footprint = batch.probe
    from tasks.sharding import sisa_share

    # the diagnostics ran before the plan: it counts their measured seconds (`unlearn plan` predicts them)
    the_plan = batch_plan(settings.validation, settings.gate, settings.deletion.weigh_cost, selection, objective, timing,
                          footprint, batch.seconds.get("diagnostics", 0.0), sisa_cost=sisa_share(state, rows),
                          device=batch.device)
    batch.seconds["retrain_probe"] = timing.retrain_seconds
    from tasks.planning import model_phases, phase_history, predicted_phases

    point, ranges, line = predicted_phases(settings.paths, the_plan, timing)
    batch.predicted, batch.history = (point, ranges, model_phases(the_plan)), phase_history(settings.paths).path
    lines = plan_lines(the_plan) + [line]
    batch.tracker.log_json(batch.parent, {**the_plan.to_dict(), "timing": timing.to_dict(),
                                          "predicted_phases": point, "predicted_range": ranges}, "plan.json")
    batch.tracker.log_metrics(batch.parent, {f"predicted_seconds/{k}": v for k, v in point.items()}
                              | {"predicted_seconds/total": sum(point.values()),
                                 "predicted_retrains": the_plan.predicted_retrains,
                                 "predicted_peak_mb": the_plan.peak_bytes / 2**20,
                                 "retrain_seconds_probe": timing.retrain_seconds})
    markdown_artifact(f"### Plan for `{batch.path.name}`\n\n" + "\n".join(lines), key=batch.key("plan"),
                      description=f"plan of {batch.path.name}")
    log = run_logger()
    for line in lines:
        log.info(f"{batch.path.name}: plan: {line}")
    batch.summary["plan"] = lines
    if the_plan.refusal:
        raise PlanRefused(the_plan.refusal)
    return the_plan


def plan_vs_actual(batch: BatchRun, n_forget: int | None = None) -> dict[str, float]:
    """The batch's measured seconds per phase (unlearning/planning/overhead.py: they sum to its wall time so far) beside
    the plan's, in one line and as MLflow metrics `actual_seconds/*`; `n_forget`: an applied batch's rows, which
    adds it to the project's phase history (the next plans' fixed phases). Called when the batch closes."""
    from unlearning.planning.overhead import PRECEDENCE, History, account, plan_vs_actual_line

    end = time.perf_counter()
    actual = account(batch.started, end, {k: clock.intervals(k, batch.started, end) for k in PRECEDENCE})
    clock.forget_phases_before(end)
    point, ranges, model = batch.predicted if batch.predicted is not None else (None, None, None)
    try:
        batch.tracker.log_metrics(batch.parent, {f"actual_seconds/{k}": v for k, v in actual.items()}
                                  | {"actual_seconds/total": sum(actual.values())})
    except Exception:  # a failed batch whose store failed: the line still says where the time went
        pass
    run_logger().info(f"{batch.path.name}: {plan_vs_actual_line(point, ranges, actual)}")
    if n_forget is not None and batch.history is not None:
        History(batch.history).add(actual, model, n_forget)
    return actual


def references_report(batch: BatchRun, seed: int, train: Train, state: State, rows: BatchRows, pool) -> None:
    """What the reference models cost (MLflow metrics, a Prefect artifact) and, when shadows were trained,
    whether the production model is exchangeable with them (recipe_check; `seed`: base.seed, `train`: the
    declared recipe, params.train). Nothing when none were trained."""
    info = pool.summary() if pool is not None else {}
    if not info.get("n_oracles") and not info.get("n_shadows"):
        return
    run = batch.open("ensembles")
    batch.tracker.log_metrics(run, info)
    shadows = pool.roles["shadows"]
    if shadows.trained:
        check = recipe_check(state, rows, shadows.ensemble(), batch.device, seed)
        batch.tracker.log_metrics(run, {f"recipe_check/{k}": v for k, v in check.items()})
        warn_if_not_the_recipe(check, train, state)
    batch.close()
    table_artifact([{"ensemble": name, "members": role.trained, "chunks": role.chunks,
                     "from cache": role.cached_chunks, "seconds": round(role.seconds, 2)}
                    for name, role in pool.roles.items()],
                   key=batch.key("ensembles"), description="oracle and shadow ensembles")


RECIPE_CHECK_ROWS = 2000  # rows scored (a seeded sample past this): the statistic is a mean over rows, and
# N + 1 forward passes over every row of a large table would cost as much as a candidate's whole evaluation


def recipe_check(state: State, rows: BatchRows, shadows: Ensemble, device: str, seed: int = 0) -> dict[str, float]:
    """Is the production model exchangeable with the shadow originals (the declared recipe on the same rows)?
    Margins on the evaluated rows (forget, retain, validation; at most RECIPE_CHECK_ROWS of them, a sample
    seeded by base.seed); unlearning/metrics/exchangeability.py."""
    eval_rows, _ = rows.eval_rows()
    if len(eval_rows) > RECIPE_CHECK_ROWS:
        eval_rows = np.sort(np.random.default_rng(seed).choice(eval_rows, RECIPE_CHECK_ROWS, replace=False))
    labels = state.prepared.label[eval_rows]
    production = margins(eval_logits(state.model.to(device), state.prepared, eval_rows).numpy(), labels)
    reference = margins(eval_logits(shadows.to(device), state.prepared, eval_rows).numpy(), labels)
    return exchangeability_test(production.mean(axis=0), reference)


def warn_if_not_the_recipe(check: dict[str, float], train: Train, state: State) -> None:
    """Say so when the production model lies beyond every shadow original (p = 1 / (N + 1), the smallest);
    `train`: params.train (the declared recipe)."""
    if check["rank"] < check["n_pool"]:
        return
    n = int(check["n_pool"]) - 1
    if train.init_checkpoint and not state.ledger:
        why = (f"train.init_checkpoint ({train.init_checkpoint}) was probably not trained by the declared "
               f"recipe (optimizer, schedule, lr, weight decay, epochs, batch size, label smoothing): KLoM compares "
               f"retrains of that recipe, so the certificate speaks for your checkpoint only if the recipe is how it "
               f"was trained; set train.* to it, or let the gate promote a retrain")
    else:
        why = (f"after approximate unlearning this can be accumulated error (deletion.debt bounds it); a model the "
               f"recipe trained lands here by chance 1 time in {n + 1}")
    run_logger().warning(f"recipe check: the production model lies beyond all {n} shadow originals (score "
                         f"{check['statistic']:.2f} against a shadow median of {check['reference_median']:.2f}, "
                         f"p = {check['pvalue']:.3f}); {why}")


def warn_if_the_test_cannot_fail(gate: Gate, n_shadows: int, n_oracles: int) -> None:
    """A KLoM test that cannot fail certifies nothing: say so in every batch it happens in (`gate`: params.gate)."""
    g = gate.retrain_equivalence
    if not can_reject(g.alpha, g.n_permutations, n_shadows, n_oracles):
        floor = smallest_klom_pvalue(n_shadows, n_oracles, g.n_permutations)
        run_logger().warning(f"the KLoM permutation test cannot fail with {n_shadows} shadows and {n_oracles} "
                             f"oracles: its smallest p-value is about {floor:.3f}, above alpha = {g.alpha}; raise "
                             f"validation.n_oracles and n_shadows (the default is 80 each)")


# 5. select -----------------------------------------------------------------------------------------------
FLOOR_SAMPLE_SEED = 11  # the same-size validation sample of the noise floor (unlearning/policy/selection.py noise_floor)


def selection_of(device: str, deletion: Deletion, epochs: int, state: State, rows: BatchRows, objective: str,
                 report, oracles: Ensemble | None, n_train: int) -> tuple[Selection, dict, list[str]]:
    """The walk of the rules over the batch's facts (unlearning/policy/selection.py selection_with_debt): (selection,
    debt, the reasons the debt forced a retrain). `report`: the leverage diagnostics (None: not computed, the
    rules that read them are skipped); `oracles`: the references trained so far, for the noise floor."""
    logits = floor = None
    if oracles is not None:
        logits = eval_logits(oracles, state.prepared, rows.forget)
        sample = np.random.default_rng(FLOOR_SAMPLE_SEED).permutation(rows.validation)[:len(rows.forget)]
        floor = eval_logits(oracles, state.prepared, np.sort(sample))
    facts = batch_facts(deletion, epochs, objective, rows, report, oracle_forget_logits=logits, device=device,
                        oracle_floor_logits=floor, sharded=getattr(state.model, "shard_state", None) is not None)
    return selection_with_debt(deletion, facts, state.ledger, n_train, len(rows.forget))


@task(name="select", **STAGE)
@computes
@clock.phase("candidates")
def select(batch: BatchRun, deletion: Deletion, epochs: int, state: State, rows: BatchRows, objective: str,
           report, oracles: Ensemble | None, n_train: int,
           made: tuple[Selection, dict, list[str]] | None = None) -> Selection:
    """The ordered candidate list: `deletion.method`, or the rules over the batch's facts, then the fallback,
    retrain last; the retraining debt (`deletion.debt`) overrides it with exact retrain alone. `oracles`: the
    references trained so far, for the noise floor (None before any: the rules that need it are skipped).
    `made`: the walk already made over these facts (`selection_of`, when the diagnostics were skipped): logged,
    not walked again."""
    selection, debt, forced = made or selection_of(batch.device, deletion, epochs, state, rows, objective, report,
                                                   oracles, n_train)
    log = run_logger()
    if forced:  # the debt is due: exact retrain alone
        log.info(f"{batch.path.name}: retraining debt: {'; '.join(forced)}: exact retrain alone")
    batch.summary.update(selection=selection, debt=debt)
    batch.tracker.log_metrics(batch.parent, {f"debt/{k}": v for k, v in debt.items()})
    batch.tracker.log_json(batch.parent, selection.to_dict(), "selection.json")
    batch.tracker.log_params(batch.parent, {"selection.fired": [f[0] for f in selection.fired],
                                            "selection.candidates": selection.candidates})
    markdown_artifact(selection_markdown(selection, batch.path.name), key=batch.key("selection"),
                      description=f"candidates for {batch.path.name}")
    rules = "; ".join(f"{name} ({why})" for name, why in selection.fired) or "no rule fired"
    log.info(f"{batch.path.name}: {len(rows.forget)} sample(s) to forget, objective {objective}; "
             f"candidates {selection.candidates}; rules that fired: {rules}")
    if not forced and (line := nearest_miss_line(selection)):
        log.info(f"{batch.path.name}: {line}")
    return selection


def nearest_miss_line(selection: Selection) -> str | None:
    """Why a method was not picked, in one line: the rule nearest to firing and the value that kept it off."""
    miss = selection.get("nearest_miss")
    if not miss:
        return None
    name, method, why = miss
    return f"nearest rule that did not fire: {name} -> {method} ({why})"


def selection_markdown(selection: Selection, request_file: str) -> str:
    fired = "\n".join(f"- `{name}`: {why}" for name, why in selection.fired) or "- (none)"
    skipped = "\n".join(f"- `{name}`: {why}" for name, why in selection.skipped) or "- (none)"
    return (f"### Selection for `{request_file}`\n\nCandidates, in order: "
            f"{', '.join(f'`{m}`' for m in selection.candidates)}\n\nRules that fired:\n{fired}\n\n"
            f"Rules skipped:\n{skipped}\n")


def needs_noise_floor(selection: Selection, weigh_cost: bool) -> bool:
    """Whether a rule was skipped only for want of the oracles' noise floor and could still add a candidate:
    with deletion.weigh_cost an approximate candidate is never certified per batch, so the floor decides nothing."""
    return not weigh_cost and any("noise_floor" in why for _, why in selection.get("skipped", []))


# 6. unlearn and certify, per candidate -------------------------------------------------------------------
@task(name="unlearn-and-certify", task_run_name="unlearn-and-certify-{step.method}", **STAGE)
@computes
@clock.phase("candidates")
def unlearn_and_certify(batch: BatchRun, step, inputs: StepInputs, state: State, rows: BatchRows, pool, the_plan,
                        objective: str, batch_index: int) -> CandidateOutcome:
    """Run the plan's `step` and certify it as the step says (tasks/certify.py, with `inputs`: the batch's
    tasks/batch_settings.py step_inputs); log metrics, the verdict, the looks, per-sample KLoM and figures titled
    with the verdict."""
    from tasks.certify import run_step

    method = step.method
    run = batch.open(f"unlearn-{method}", tags={"method": method, "certificate": step.certificate})
    out, looks = run_step(step, inputs, state, rows, pool, the_plan, batch.device, objective, batch_index)
    gate = inputs.gate
    t = batch.tracker
    t.log_metrics(run, out.tracked_metrics())
    t.log_metrics(run, {f"cost/{k}": float(v) for k, v in out.cost.items()})
    t.log_json(run, out.verdict.to_dict(), "gate_verdict.json")
    if looks:
        t.log_json(run, [look.to_dict() for look in looks], "certificate_looks.json")
    t.log_table(run, out.per_sample, "per_sample_klom.json")
    alpha = out.alpha if out.alpha is not None else gate.retrain_equivalence.alpha
    log_candidate_figures(t, run, out, alpha)
    t.set_tags(run, {"gate": "passed" if out.verdict.passed else "failed"})
    batch.close()
    passed = "passed" if out.verdict.passed else "failed"
    table_artifact(split_table(out), key=batch.key(f"{method}-splits"),
                   description=f"{method}: per-split accuracy and KLoM against the oracles ({passed})")
    failures = failing_checks_in_words(out.verdict.checks)
    markdown_artifact(f"### Gate verdict for `{method}` ({step.certificate}): **{passed}**\n\n"
                      + ("\n".join(f"- {f}" for f in out.verdict.failures if f.startswith("rejected at")) + "\n"
                         if looks else "")
                      + ("\n".join(f"- {f}" for f in failures) or "- every check passed")
                      + f"\n\n{out.cost.get('wall_seconds', 0.0):.1f} s", key=batch.key(f"{method}-verdict"),
                      description=f"gate verdict of {method} for {batch.path.name}")
    run_logger().info(f"  {method}: {verdict_summary(out.verdict, alpha)}")
    return out


def split_table(outcome: CandidateOutcome) -> list[dict]:
    """One row per split (unlearning/certificate/acceptance.py split_records): the candidate's accuracy and the original's,
    the oracles' interval, KLoM P95, its floor and the p-value (with the digits that keep it on its side of the
    look's alpha: 2/201 is 0.00995, not 0.01), and whether the split passed."""
    alpha = outcome.alpha

    def r(v):
        return None if v is None else round(float(v), 4)

    return [{"split": rec.split, "accuracy": r(rec.accuracy), "original": r(rec.original_accuracy),
             "oracle interval": None if rec.interval is None else [r(x) for x in rec.interval],
             "KLoM P95": r(rec.klom_p95), "same-size floor": r(rec.floor),
             "p-value": None if rec.pvalue is None else (float(format_beside(rec.pvalue, float(alpha)))
                                                          if alpha is not None else r(rec.pvalue)),
             "passed": rec.passed}
            for rec in split_records(outcome)]


def log_candidate_figures(tracker, run_id: str, out: CandidateOutcome, alpha: float) -> None:
    """The candidate's figures, each titled with the gate's verdict: accuracy per split against the oracles'
    spread and the gate interval; KLoM per split against two sets of retrains, with P95 and critical value
    (when references were trained); margins of the worst forget samples."""
    method, passed = out.method, out.verdict.passed
    fig = plots.accuracy_bars(out.metrics, f"{method}: accuracy per split", out.verdict.checks, passed)
    tracker.log_figure(run_id, fig, "accuracy_per_split.png"); plots.close(fig)
    ps = out.per_sample
    present = [r for r in split_records(out) if r.klom_p95 is not None]
    if present:  # (an exact retrain or a suppression candidate trains no references: no KLoM to draw)
        fig = plots.klom_against_null(ps["klom"].to_numpy(), ps["klom_null_example"].to_numpy(),
                                      ps["split"].to_numpy(), out.klom_null_p95,
                                      {r.split: r.klom_p95 for r in present},
                                      {r.split: r.pvalue for r in present if r.pvalue is not None},
                                      alpha, f"{method}: KLoM per sample vs retrains", passed)
        tracker.log_figure(run_id, fig, "klom_per_split.png"); plots.close(fig)
    if out.worst.get("names"):  # panels titled as the run names the samples (hashed under redaction)
        names = [tracker.display_id(str(n)) for n in out.worst["names"]]
        fig = plots.margin_distributions(out.worst["unlearned"], out.worst["oracle"], names,
                                         f"{method}: margins of the worst forget samples")
        tracker.log_figure(run_id, fig, "worst_forget_margins.png"); plots.close(fig)


def accepted(batch: BatchRun, out: CandidateOutcome, exact_retrain_overrides: bool) -> bool:
    """Whether the batch takes this candidate (the core's acceptance rule, unlearning/certificate/acceptance.py accept);
    records the candidate's line, and tags an exact retrain promoted as a false reject of the gate."""
    line = CandidateLine(out.method, out.verdict.passed, float(out.cost.get("wall_seconds", 0.0)), out.verdict.checks)
    batch.summary["candidates"].append(line)
    batch.last_outcome = out
    decision = accept(out, exact_retrain_overrides)
    if decision.as_false_reject:
        run_logger().info(f"  {out.method}: promoted although the gate rejected it: a false reject of the gate, not an "
                          "unlearning failure (gate.exact_retrain_overrides)")
        batch.tracker.set_tags(batch.parent, {"gate_false_reject": out.method})
        line.promoted_as_false_reject = True
    return decision.accepted


# 7. promote ----------------------------------------------------------------------------------------------
@task(name="promote", **STAGE)
@computes
@clock.phase("candidates")
def promote(batch: BatchRun, settings: BatchSettings, state: State, requests: pd.DataFrame, objective: str,
            outcome: CandidateOutcome, rows: BatchRows, n_train: int, warnings: list[str] | None = None) -> Promotion:
    """Register the model, then write model, manifest, ledger and champion history to a staging folder and
    swap it in (all or nothing); the registry alias follows state/. Reads base.paths, tracking and
    deletion.hash_sample_ids. `warnings`: tasks/quality.py's announce_quality lines, kept in the champion record
    (`quality_warnings`) for `unlearn status`. Fault points (tests only) kill the process between the steps."""
    t, registered, alias = batch.tracker, settings.tracking.registered_model, settings.tracking.alias
    forget_ids = requests["sample_id"].tolist()  # with the validation rows it names (split_by_kind): all erased
    before = t.alias_version(registered, alias) or state.champion.get("model_version")
    now = datetime.now(timezone.utc).isoformat()
    manifest = marked_deleted(state.manifest, forget_ids, batch.batch_id)
    fault("before_register")
    version = t.log_model(batch.parent, outcome.model, registered,
                          input_example=input_example(state.prepared.X, state.prepared.manifest),
                          class_names=names_after_erasure(settings.ids, settings.deletion, state.prepared, forget_ids),
                          preparation=preparation_after_erasure(settings.ids, settings.deletion, state.prepared,
                                                                forget_ids))
    # Registry lineage: which batch, method and verdict produced this version, and from which run.
    verdict = promoted_verdict(outcome)
    t.set_version_tags(registered, version, {
        "fingerprint": state.fingerprint["digest"], "batch_id": batch.batch_id, "method": outcome.method,
        "verdict": verdict,
        "parent_run_id": batch.parent, "n_forgotten": n_unlearned(requests), "promoted": "false"})
    fault("after_register")
    entries = promoted_entries(requests, batch, settings.ids, state, objective, outcome, before, version, now,
                               verdict)
    champion = champion_record(batch, settings.tracking_store, state, requests, outcome, rows, n_train, version, now,
                               warnings)
    history = champion["history"]
    ledger_after = appended(state.ledger, entries)
    commit_state(batch, settings.paths, outcome.model, manifest, ledger_after, champion, state.fingerprint)
    fault("after_commit")
    # state/ decides from here on: the alias follows it (and is reconciled again on every run).
    t.reconcile_alias(registered, alias, version)
    fault("after_alias")
    batch.summary.update(chosen=outcome.method, version_after=version)
    markdown_artifact(f"### Promoted `{registered}` v{version} as `@{alias}`\n\n- method `{outcome.method}`\n"
                      f"- was v{before}\n- ledger +{len(entries)} entries", key=batch.key("promotion"),
                      description=f"promotion for {batch.path.name}")
    run_logger().info(f"{batch.path.name}: forgot {n_unlearned(requests)} sample(s) with {outcome.method}; promoted "
                      f"{registered} v{version} as @{alias} (was v{before}); ledger +{len(entries)}")
    from unlearning.policy.history import retraining_debt

    return Promotion(version, before, history, len(entries), retraining_debt(ledger_after, n_train))


def commit_state(batch: BatchRun, paths: ProjectPaths, model, manifest: pd.DataFrame, ledger: list[dict],
                 champion: dict, fingerprint: dict) -> None:
    """Write model, manifest, ledger and champion record to a staging folder and swap it in for state/, all or
    nothing (a kill before the swap leaves the old state; tasks/state.py settles an interrupted swap)."""
    stage_dir = staging_dir(paths.path("state_dir"))
    try:
        write_state(stage_dir, model, manifest, ledger, champion, fingerprint)
        fault("before_commit")
        commit_dir(stage_dir, paths.path("state_dir"))
        batch.committed = True
    except BaseException:
        discard_dir(stage_dir)
        raise


def promoted_entries(requests: pd.DataFrame, batch: BatchRun, ids: IdKey, state: State, objective: str,
                     outcome: CandidateOutcome, before, version: str, now: str, verdict: str) -> list[dict]:
    """The batch's ledger entries (ids hashed with the project's salt when deletion.hash_sample_ids); a sisa
    outcome adds which shards, and which (shard, slice) checkpoints, it retrained."""
    entries = ledger_entries(requests, batch, ids.hashed, ids.salt(), objective=objective, method=outcome.method,
                             before=before, after=version, now=now, fingerprint=state.fingerprint["digest"],
                             verdict=verdict)
    retrained = getattr(outcome, "info", {}).get("slices_retrained")
    if retrained is None:
        return entries
    return [{**e, "retrained": {"shards": outcome.info["shards_retrained"], "slices": retrained}} for e in entries]


def champion_record(batch: BatchRun, tracking_store: str, state: State, requests: pd.DataFrame,
                    outcome: CandidateOutcome, rows: BatchRows, n_train: int, version: str, now: str,
                    warnings: list[str] | None) -> dict:
    """state/champion.json after this batch: the promoted version, its history point appended, the quality
    warnings `unlearn status` shows, and what the state's first model was clean of (unlearning/privacy/erasure.py,
    state_is_clean). `tracking_store`: where the registry lives (adapters/store_check.py store_identity)."""
    previous = state.champion.get("history", [])
    history = [*previous, history_point(
        previous, batch_id=batch.batch_id, request_file=batch.path.name, method=outcome.method,
        n_forgotten=n_unlearned(requests), n_train=n_train, model_version=version, processed_at=now,
        validation_accuracy=outcome.metrics.get("acc/validation", float("nan")),
        output_gap=float(outcome.per_sample["output_gap"].mean()))]
    return {"model_version": version, "method": outcome.method, "batch_id": batch.batch_id,
            "promoted_at": now, "n_retained_train": int(len(rows.retain)), "history": history,
            "tracking_store": tracking_store,  # lost? adapters/store_check.py
            "quality_warnings": list(warnings or []),
            **{k: state.champion[k] for k in ("started_clean_of",) if k in state.champion}}


def marked_deleted(manifest: pd.DataFrame, forget_ids: list[str], batch_id: str) -> pd.DataFrame:
    """A copy of the live manifest with the batch's rows marked deleted by it (history is never rewritten)."""
    out = manifest.copy()
    hit = out["sample_id"].isin(forget_ids)
    out.loc[hit, "status"] = "deleted"
    out.loc[hit, "deleted_in_batch"] = batch_id
    return out


def promoted_verdict(outcome: CandidateOutcome) -> str:
    """The verdict the registry tag and the ledger record: `passed`, or `promoted_as_gate_false_reject` for an
    exact retrain promoted by gate.exact_retrain_overrides although it failed statistical checks only."""
    return "passed" if outcome.verdict.passed else "promoted_as_gate_false_reject"


def names_after_erasure(ids: IdKey, deletion: Deletion, prepared, forget_ids: list[str]) -> list[str]:
    """The class names the champion is registered with: those the prepared store keeps once this batch's rows
    and every tombstoned row are erased (a class only they had reads `<erased k>`, as dataset.json will)."""
    from tasks.erasure import tombstoned_rows

    gone = prepared.manifest["sample_id"].isin(forget_ids).to_numpy() | \
        tombstoned_rows(ids.paths, deletion, ids.salt(), prepared)
    return class_names_after(prepared.info, prepared.manifest, ~gone)


def preparation_after_erasure(ids: IdKey, deletion: Deletion, prepared, forget_ids: list[str]) -> dict | None:
    """The raw-input preparation the champion is registered with (unlearning/data/preparation.py): the prepared
    store's, with the one-hot categories that only this batch's and tombstoned rows had as `<erased k>`
    placeholders, as dataset.json will name them, so the registry holds no raw value the erasure removes."""
    from tasks.erasure import tombstoned_rows
    from unlearning.data.preparation import recipe_after, recipe_of

    recipe = recipe_of(prepared.info)
    if recipe is None or recipe["kind"] != "table":  # an image's preparation holds no value of a row
        return recipe
    gone = prepared.manifest["sample_id"].isin(forget_ids).to_numpy() | \
        tombstoned_rows(ids.paths, deletion, ids.salt(), prepared)
    return recipe_after(recipe, prepared.X, ~gone)


def ledger_entries(requests: pd.DataFrame, batch: BatchRun, hash_ids: bool, salt: str, **fields) -> list[dict]:
    """One ledger entry per request (unlearning/privacy/ledger.py's fields); sample ids hashed when `hash_ids`. `kind`:
    the request's (`split_by_kind`); a validation row's entry says it was erased, not trained on (no method
    unlearned it: method `none`, verdict `not_trained_on`)."""
    sha = file_sha256(batch.path)
    kinds = requests["kind"] if "kind" in requests.columns else pd.Series(UNLEARNED, index=requests.index)
    return [{"request_id": str(r.request_id), "kind": kind,
             "sample_id": hash_sample_id(r.sample_id, salt) if hash_ids else r.sample_id,
             "batch_id": batch.batch_id, "request_file": batch.path.name, "file_sha256": sha, "reason": r.reason,
             "objective": fields["objective"], "requested_at": r.requested_at.isoformat(),
             "method": fields["method"] if kind == UNLEARNED else "none",
             "verdict": fields["verdict"] if kind == UNLEARNED else "not_trained_on",
             "model_version_before": fields["before"], "model_version_after": fields["after"],
             "processed_at": fields["now"], "fingerprint": fields["fingerprint"]}
            for r, kind in zip(requests.itertuples(), kinds)]


def n_unlearned(requests: pd.DataFrame) -> int:
    """How many requests name training rows (unlearned); the others name validation rows (erased only)."""
    return int(unlearned_mask(requests).sum())


def unlearned_mask(requests: pd.DataFrame) -> np.ndarray:
    """[n] bool: the requests a model must unlearn (training rows); the rest name validation rows."""
    if "kind" not in requests.columns:
        return np.ones(len(requests), dtype=bool)
    return (requests["kind"] == UNLEARNED).to_numpy()


def split_by_kind(state: State, requests: pd.DataFrame, batch_id: str) -> tuple[State, pd.DataFrame]:
    """The requests with their `kind` (a training row: unlearned; a validation row: erased, not trained on), and
    the state the batch computes on: its manifest marks the named validation rows deleted, so the batch's
    validation metrics, its certificate and the gate use the remaining validation rows (unlearning/batch/rows.py
    validation_rows). Nothing is refused for naming a validation row (docs/requests.md)."""
    from dataclasses import replace

    from adapters.request_check import validation_mask

    val = validation_mask(state.manifest, requests)
    requests = requests.assign(kind=np.where(val, ERASED_NOT_TRAINED_ON, UNLEARNED))
    if not val.any():
        return state, requests
    return replace(state, manifest=marked_deleted(state.manifest, requests["sample_id"][val].tolist(), batch_id)), requests


@task(name="record", **STAGE)
@computes
def record_not_trained_on(batch: BatchRun, ids: IdKey, state: State, requests: pd.DataFrame,
                          objective: str) -> Promotion:
    """A file naming only validation rows: no model trained on them, so nothing is unlearned, certified or
    registered: the champion stays (no new model version). The state keeps its model; its manifest marks the
    rows deleted and the ledger records them as erased, not trained on. All or nothing, as `promote`."""
    version = state.champion.get("model_version")
    now = datetime.now(timezone.utc).isoformat()
    erased = requests["sample_id"].tolist()
    entries = ledger_entries(requests, batch, ids.hashed, ids.salt(), objective=objective, method="none",
                             before=version, after=version, now=now, fingerprint=state.fingerprint["digest"],
                             verdict="not_trained_on")
    commit_state(batch, ids.paths, state.model, marked_deleted(state.manifest, erased, batch.batch_id),
                 appended(state.ledger, entries), dict(state.champion), state.fingerprint)
    batch.summary.update(chosen=None, version_after=None, n_forgotten=0)
    run_logger().info(f"{batch.path.name}: {len(erased)} validation row(s), never trained on: erased from the stores "
                      f"and recorded in the ledger (erased, not trained on); nothing to unlearn, the champion "
                      f"v{version} stays; ledger +{len(entries)}")
    return Promotion(version, version, state.champion.get("history", []), len(entries))


def finish_not_trained_on(batch: BatchRun, promoted: Promotion, erasure: dict | None, n_erased: int) -> None:
    """The batch run of a file of validation rows only: its counts, tags and summary (no candidate, no gate)."""
    t = batch.tracker
    t.log_metrics(batch.parent, {"wall_seconds": wall_seconds(batch), "n_forgotten": 0,
                                 "n_erased_not_trained_on": n_erased})
    t.set_tags(batch.parent, {"method": "none", "gate": "not_needed (validation rows only: not trained on)",
                              "model_version": str(promoted.version)})
    publish_summary(batch, status="applied (validation rows only: erased, not trained on; champion unchanged)",
                    erasure=erasure)
    t.end_run(batch.parent, seconds=wall_seconds(batch))


# 8. erase ------------------------------------------------------------------------------------------------
@task(name="erase", **STAGE)
@computes
@clock.phase("erase")
def erase(batch: BatchRun, settings: ErasureSettings, forget_ids: list[str], salt: str, version: str) -> dict:
    """Remove the forgotten rows from every store (tasks/erasure.py, with what it reads: tasks/stores/base.py
    ErasureSettings)."""
    from tasks.erasure import erase as erase_rows

    report = erase_rows(settings, batch.batch_id, forget_ids, salt, version, batch.tracker, batch.parent)
    fault("after_erasure")
    purged = purged_rows_text(report["stores"])
    table_artifact([{"store": s.get("store", "?"), "purged rows": s.get("purged_rows", 0)} for s in report["stores"]],
                   key=batch.key("erasure"), description=f"erasure of batch {batch.batch_id}")
    pending = f"; pending: {'; '.join(report['pending'])}" if report["pending"] else ""
    run_logger().info(f"{batch.path.name}: erasure of {len(forget_ids)} sample(s): rows purged: {purged} "
                      f"({len(report['stores'])} store(s) checked){pending}")
    return report


# 9. report -----------------------------------------------------------------------------------------------
def finish(batch: BatchRun, outcome: CandidateOutcome, promoted: Promotion, erasure: dict | None) -> None:
    """The batch run's closing metrics, the champion history (step-indexed metrics and its figure), tags and
    the batch summary (MLflow description + Prefect artifact)."""
    t, history = batch.tracker, promoted.history
    wall = wall_seconds(batch)
    t.log_metrics(batch.parent, {**outcome.tracked_metrics(), "wall_seconds": wall, "n_forgotten": batch.summary["n_forgotten"]})
    t.log_series(batch.parent, history, HISTORY_METRICS)
    if promoted.debt_after is not None:  # step 1: the value after the batch, the one the UI shows
        t.log_metrics(batch.parent, {f"debt/{k}": v for k, v in promoted.debt_after.items()}, step=1)
        batch.summary["debt_after"] = promoted.debt_after
    fig = plots.history(history, f"champion across {len(history)} batch(es)")
    t.log_figure(batch.parent, fig, "champion_history.png"); plots.close(fig)
    t.set_tags(batch.parent, {"method": outcome.method, "gate": "passed", "model_version": promoted.version})
    plan_vs_actual(batch, int(batch.summary.get("n_forgotten") or 0))
    publish_summary(batch, status="applied", erasure=erasure)
    t.end_run(batch.parent, seconds=wall)


def wall_seconds(batch: BatchRun) -> float:
    """The batch's one duration, in seconds to 0.1 s: its MLflow run's, from the run's start to the moment the
    batch first asks (it closes). The `wall_seconds` metric, the summary's wall time and the run's end time
    (`end_run(seconds=)`: the UI's Duration column) all say this number, not three clocks read at three moments."""
    if batch.wall is None:
        batch.wall = round(batch.tracker.run_seconds(batch.parent), 1)
    return batch.wall


def publish_summary(batch: BatchRun, *, status: str, erasure: dict | None = None, error: str | None = None) -> str:
    """The batch summary as the batch run's description and as a markdown artifact of the Prefect flow run."""
    md = summary_markdown(**batch.summary, status=status, wall_seconds=wall_seconds(batch),
                          erasure=erasure, error=error)
    batch.tracker.set_description(batch.parent, md)
    markdown_artifact(md, key=batch.batch_id, description=f"deletion batch {batch.summary['request_file']}: {status}")
    return md


def rejected_checks(batch: BatchRun) -> list[str]:
    """Each failing gate check of each candidate tried, in words with its value and its bound ("finetune:
    forget: ... (permutation p = 0.00995 < alpha = 0.01)"): what a gate rejection says, not only that no
    candidate passed."""
    return [f"{line.method}: {words}" for line in batch.summary.get("candidates", [])
            for words in failing_checks_in_words(line.checks)]


def fail(batch: BatchRun, error: BaseException, rejected: bool, held: bool = False) -> None:
    """A failed batch in MLflow: the open stage run and the batch run FAILED, the error (for a gate rejection
    with each failing check, also set on the error as `failing_checks` for the rejected file's error.json),
    the summary. `held`: no candidate passed, and the batch waits for a person (tasks/held.py): the run is
    tagged for review with the drops and the held candidate's figure, and ends FINISHED (nothing failed)."""
    import traceback

    t = batch.tracker
    failing = rejected_checks(batch) if rejected else []
    if failing:
        try:
            error.failing_checks = failing  # flows.deletion_batch.reject writes them beside the rejected file
        except AttributeError:
            pass
    if batch.child is not None:
        try:
            batch.close(ok=False)
        except Exception:
            pass
    if batch.predicted is not None:  # a batch that planned: where its time went, as for an applied one
        plan_vs_actual(batch)
    try:
        t.log_json(batch.parent, {"error": str(error), "traceback": traceback.format_exc(),
                                  **({"failing_checks": failing} if rejected else {})}, "error.json")
        t.set_tags(batch.parent, {"gate": "rejected" if rejected else "error"})
        if held:
            from tasks.held import mark_run_held

            mark_run_held(batch, error)
        status = "held" if held else "rejected" if rejected else "error"
        publish_summary(batch, status=status, error=None if rejected else f"{type(error).__name__}: {error}")
        t.end_run(batch.parent, ok=held, seconds=wall_seconds(batch))
    except Exception:  # the tracking store itself failed: the error that brought us here is the one to raise
        pass
