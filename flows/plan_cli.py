"""`unlearn plan FILE`: the plan a batch of FILE would follow, before anything runs (unlearning/planning/plan.py).

It checks the file as `unlearn validate` does, selects the candidates as the batch would (without the leverage
diagnostics: their rules are listed as skipped; the batch's own rule says whether it computes them at all,
tasks/batch_path.py, and when it does their cost is bounded by diagnostics.max_retrains), times a probe of the
model on this machine or device (tasks/planning.py), and prints the steps, the models they train, the batch's
predicted wall time in the phases its "plan vs actual" line measures (unlearning/planning/overhead.py) with its range, and
the predicted peak memory. Changes nothing; exit 2 when the file is bad or the plan cannot fit
validation.memory_mb.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


class NothingToUnlearn(Exception):
    """A request file naming validation rows only: its batch erases them, nothing is planned or trained."""


STEPS = ("loading the state", "checking the file", "selecting the candidates", "probing the model", "planning")


def batch_plan_for(path: Path, params, device: str, bar=None):
    """(plan, timing, selection, notes, diagnostics_skipped) for request file `path` on the current state, as its
    batch would plan it; `bar`: a unlearning/progress.py Progress over STEPS (the probe's training ticks it)."""
    from types import SimpleNamespace

    from adapters.request_check import LiveState, check_file_for
    from tasks.batch_path import diagnostics_unused, wants_diagnostics
    from tasks.batch_settings import BatchSettings
    from tasks.planning import batch_plan, probe
    from tasks.state import StateSettings, load_state
    from tasks.batch import partition_retain
    from unlearning.batch.rows import batch_rows
    from unlearning.config import Partition
    from unlearning.policy.history import n_original_train
    from unlearning.progress import Progress
    from unlearning.requests import batch_objective, coerce_requests
    from unlearning.policy.selection import batch_facts, selection_with_debt
    from tasks.stages import split_by_kind

    bar = bar or Progress(len(STEPS), "unlearn plan", enabled=False)
    bar.stage(STEPS[0])
    state = load_state.fn(StateSettings.of(params), device)
    bar.update()
    bar.stage(STEPS[1])
    check = check_file_for(path, params, LiveState(state.manifest, state.ledger, state.prepared.info),
                           gx_when_invalid=False, gx_suite=False)  # the suite's rules in pandas: the plan applies nothing
    if check.status == "invalid":
        raise check.error()
    requests = coerce_requests(check.pending)
    objective = batch_objective(requests, params.deletion.objective, path)
    # the validation rows a file names are erased, not unlearned: the plan is the batch's (tasks/stages split_by_kind)
    state, requests = split_by_kind(state, requests, "plan")
    forget = requests["sample_id"][requests["kind"] == "unlearned"].astype(str).tolist()
    if not forget:
        raise NothingToUnlearn(f"{path.name}: its {len(requests)} row(s) name validation rows only: no model trained "
                               f"on them, so its batch erases them without unlearning (no candidate, no gate, no new "
                               f"model version); there is no plan to show")
    bar.update()
    bar.stage(STEPS[2])
    m = state.manifest
    notes = []
    # the plan does not depend on which retain rows are adjacent except through the suppression rules: the group
    # partition stands in for the other modes (no model, no diagnostics run here)
    if params.deletion.partition.mode != "group":
        notes.append(f"deletion.partition.mode = {params.deletion.partition.mode}: the plan uses the group "
                     f"partition (the batch computes its own)")
    table = partition_retain(Partition(mode="group"), state.prepared, m, forget, state.model)
    rows = batch_rows(state.prepared, m, forget, table)
    sharded = getattr(state.model, "shard_state", None) is not None  # train.sharding: sisa, no diagnostics
    facts = batch_facts(params.deletion, params.train.epochs, objective, rows, None, device=device, sharded=sharded)
    selection, _, _ = selection_with_debt(params.deletion, facts, state.ledger, n_original_train(m, state.ledger),
                                          len(rows.forget))
    bar.update()
    bar.stage(STEPS[3])
    # whether the batch will compute the diagnostics: its own rule (tasks/batch_path.py), on a stand-in for the
    # batch that carries the probe it takes (reused below)
    stand_in = SimpleNamespace(probe=None, device=device)
    settings = BatchSettings.of(params)  # what the batch's stages read (tasks/batch_settings.py)
    skipped = None
    wanted = not sharded and wants_diagnostics(settings.diagnostics_settings, state, objective)
    if wanted:
        skipped = diagnostics_unused(stand_in, settings, state, rows, objective, selection)
    timing, footprint = probe(settings.probe_inputs, state, rows, device, selection.candidates)
    bar.update()
    bar.stage(STEPS[4])
    d = params.diagnostics
    diag = 0.0
    if sharded:
        notes.append("diagnostics: skipped (a sharded original: sisa unlearns it exactly)")
    elif not wanted:
        notes.append("diagnostics: not computed by this batch (diagnostics.enabled is off, or the qualification "
                     "licenses nothing)")
    elif skipped:
        notes.append(f"diagnostics: skipped by the batch: {skipped}")
    else:
        bound = d.max_retrains if d.max_retrains is not None else 1.0
        diag = bound * timing.retrain_seconds
        notes.append(f"diagnostics: at most {bound:g} retrain(s) (diagnostics.max_retrains), counted in full")
    from tasks.sharding import sisa_share

    plan = batch_plan(params.validation, params.gate, params.deletion.weigh_cost, selection, objective, timing,
                      footprint, diag, sisa_cost=sisa_share(state, rows), device=device)
    from tasks.licensing import plan_note  # which path the request takes: licensed (model unchanged) or exact

    notes.insert(0, plan_note(settings, state, forget, device, objective))
    bar.update()
    return plan, timing, selection, notes + [f"forget rows: {len(rows.forget)}, retain rows: {len(rows.retain)}",
                                             f"timing: {timing.source}"]


def batch_wall_time(plan, timing, params) -> tuple[dict, list[str]]:
    """The batch's predicted phases (unlearning/planning/overhead.py, the same the batch's plan-vs-actual line measures), and
    what `unlearn repro` of it takes beside (its stage's start and `unlearn erase`): (JSON, lines)."""
    from tasks.planning import predicted_phases
    from unlearning.planning.overhead import command_line, outside_costs, total

    point, ranges, line = predicted_phases(params.project_paths, plan, timing)
    outside, source = outside_costs(params.root)
    return ({"phases": point, "range": ranges, "batch": round(total(point), 3),
             "range_total": [round(sum(r[0] for r in ranges.values()), 3), round(sum(r[1] for r in ranges.values()), 3)],
             "outside_batch": outside, "repro": round(total(point) + sum(outside.values()), 3)},
            [line, command_line(total(point), outside, source)])


def cmd_plan(args) -> int:
    """Print the plan of a batch of args.file (see the module docstring)."""
    from flows.common import device_of, use_project_path
    from unlearning.config import load_params
    from unlearning.planning.plan import plan_lines

    params = load_params(args.params)
    use_project_path(params)  # a custom model factory beside params.yaml (as every other command loads it)
    path = Path(args.file)
    if not path.exists():
        raise FileNotFoundError(f"{args.file}: no such request file")
    from unlearning.progress import Progress

    try:
        # lines on stderr once it has run 2 s (loading the state and the probe take tens of seconds on a large model)
        with Progress(len(STEPS), "unlearn plan", unit="steps", enabled=None, after_s=2.0, heartbeat_s=1.0) as bar:
            plan, timing, selection, notes = batch_plan_for(path, params, device_of(params), bar)
    except NothingToUnlearn as e:
        print(json.dumps({"nothing_to_unlearn": str(e)}) if args.json else str(e))
        return 0
    from unlearning.config import CertificateKind
    from unlearning.planning.plan import cost_functions, sequential_step
    from unlearning.certificate.qualification import advise_mode

    # the references from the probe's cost curve at the plan's chunk, as the plan prices them
    certificate = sequential_step("any", params.validation, params.gate, cost_functions(timing, plan.chunk_size)[0])
    exact = tuple(s.method for s in plan.steps) if all(s.certificate is CertificateKind.EXACT for s in plan.steps) \
        else ()
    advice, advice_line = advise_mode(certificate.cost_retrains_accept, timing.retrain_seconds,
                                      params.validation.mode, exact_only=exact)
    from unlearning.certificate.gate import criterion_line

    notes = [advice_line, criterion_line(params.gate), *notes]
    wall, wall_lines = batch_wall_time(plan, timing, params)
    if args.json:
        print(json.dumps({**plan.to_dict(), "timing": timing.to_dict(), "mode_advice": advice, "wall_seconds": wall,
                          "gate_criterion": {"criterion": params.gate.criterion,
                                             **({"epsilon": params.gate.epsilon.model_dump()}
                                                if params.gate.criterion == "epsilon" else {})}, "selection": {
            "candidates": selection["candidates"], "fired": selection["fired"], "skipped": selection["skipped"]},
            "notes_cli": notes}, indent=2, default=str))
    else:
        print(f"plan for {path.name}:")
        for line in plan_lines(plan) + wall_lines + [f"note: {n}" for n in notes]:
            print(f"  {line}")
    if plan.refusal:
        print(f"error: {plan.refusal}", file=sys.stderr)
        return 2
    return 0
