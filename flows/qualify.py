"""Stage `qualify`: the trained original's qualification (docs/certificate.md, "Two modes").

Under `validation.mode: qualified` it runs the oracle certificate of every method of `qualify.methods` on the
suite of `qualify.suite` (tasks/qualification.py), writes the pass-rate table to models/qualification.json
(a DVC out), logs it to MLflow as a table and a plot, and tags the original's registered version with it.
Under `per_batch` (the default) no batch reads a qualification: the stage writes a record saying so, in
seconds, so a plain `dvc repro` never pays for it. Its own target (`dvc repro qualify`): the default
`dvc repro deletion` does not depend on it; a qualified batch refuses a missing or stale qualification."""

from __future__ import annotations

from prefect import flow

from flows.common import (base_parser, device_of, params_or_exit, prefect_api, task_runner_for, tracker_for,
                          use_project_path)
from flows.errors import one_line_errors
from adapters import plots
from tasks.qualification import (original_state, qualification_path, qualify_model, table_frame,
                                 write_qualification)
from tasks.reporting import run_logger
from tasks.state import StateSettings
from unlearning.config import EXACT_RETRAIN, CertificateKind, ConfigError, Params, load_params
from unlearning.certificate.qualification import Qualification
from unlearning.batch.records import Promotion


def check_methods(params: Params) -> None:
    """Every method of qualify.methods is registered (before anything trains)."""
    from unlearning.methods import REGISTRY

    bad = [m for m in params.qualify.methods if m not in REGISTRY]
    if bad:
        raise ConfigError(f"qualify.methods names {bad}, not registered methods; allowed: {sorted(REGISTRY)} "
                          f"(`unlearn methods` lists them)")


@flow(name="qualify")
def qualify(params_path: str = "params.yaml") -> dict:
    params = load_params(params_path)
    use_project_path(params)
    path = qualification_path(params.project_paths)
    q = params.qualify
    if params.validation.mode != "qualified":
        record = Qualification(list(q.methods), list(q.bins), q.confidence, q.interval, float("nan"),
                               skipped="validation.mode is per_batch: every batch is certified on its own; set "
                                       "validation.mode: qualified to qualify the model")
        write_qualification(path, record)
        run_logger().info(f"qualify: skipped ({record.skipped}); wrote {path}")
        return record.to_dict()
    check_methods(params)
    device = device_of(params)
    state = original_state(StateSettings.of(params), device)
    result = qualify_model(params, state, device)
    write_qualification(path, result)
    tracker = tracker_for(params)
    run_id = tracker.start_run("qualify", tags={"stage": "qualify", "dataset": state.prepared.info["name"],
                                                "fingerprint": state.fingerprint.get("digest", "")})
    tracker.log_params(run_id, {"qualify": q.model_dump(), "validation_mode": params.validation.mode,
                                "qualified_min_pass": params.validation.qualified_min_pass,
                                "qualified_bound": params.validation.qualified_bound})
    tracker.log_table(run_id, table_frame(result), "qualification_table.json")
    tracker.log_json(run_id, result.to_dict(), "qualification.json")
    fig = plots.qualification_rates(result.table, "Certificate pass rate by predicted gap")
    tracker.log_figure(run_id, fig, "qualification_rates.png")
    plots.close(fig)
    tracker.log_metrics(run_id, {"noise_unit": result.noise, "sets": float(len({t.set_name for t in result.trials}))})
    version = state.champion.get("model_version")
    if version is not None:
        tracker.set_version_tags(params.tracking.registered_model, str(version),
                                 {"qualification": f"run {run_id}: {result.tag()}"})
    tracker.end_run(run_id)
    run_logger().info(f"qualification of the original (v{version}): {result.tag()}; table in {path}")
    return result.to_dict()


_PENDING: dict[str, dict] = {}  # the in-memory context of an audit about to run (models, rows: no flow parameters)


def audit_after_promotion(batch, params: Params, settings, state, rows, objective: str, method: str, licensing,
                          promoted: Promotion, requests, device: str) -> Promotion:
    """Run the audit of a qualified batch as its own flow run, after its version was promoted (the alias has
    moved). Returns the promotion that stands afterwards: the batch's, or the exact retrain a failed audit
    promoted. `settings`: the batch's tasks/batch_settings.py record, which its stages read."""
    _PENDING[batch.batch_id] = {"batch": batch, "params": params, "settings": settings, "state": state, "rows": rows, "objective": objective,
                                "method": method, "licensing": licensing, "promoted": promoted, "requests": requests,
                                "device": device}
    try:
        return audit_qualified_batch(batch.batch_id)
    finally:
        _PENDING.pop(batch.batch_id, None)


@flow(name="audit-qualified-batch")
def audit_qualified_batch(batch_id: str) -> Promotion:
    """The full certificate of a qualified batch (tasks/qualification.py audit_certificate). Passed: the version is
    tagged `qualified: qualified, audited`. Failed (a false accept of the qualified path): tagged `audit failed`,
    and an exact retrain on the rows now retained is promoted at once (this batch's oracle member 0: its audit
    trained it, the cache finds it). Either way the audit joins state/audits.jsonl, which updates the table the
    next batches are licensed by."""
    from datetime import datetime, timezone

    import numpy as np

    from tasks import stages as S
    from tasks.qualification import append_audit, audit_certificate
    from tasks.state import load_state
    from unlearning.batch.rows import BatchRows, retained_train_rows, validation_rows
    from unlearning.policy.history import n_original_train
    from unlearning.planning.plan import Step

    c = _PENDING[batch_id]
    batch, params, settings, lic, promoted = c["batch"], c["params"], c["settings"], c["licensing"], c["promoted"]
    name, version = settings.tracking.registered_model, str(promoted.version)
    log = run_logger()
    result = audit_certificate(settings.step_inputs, c["state"], c["rows"], c["device"], c["method"], lic.batch_index,
                               c["objective"])
    record = {"kind": "audit", "batch_id": batch_id, "version": version, "method": c["method"],
              "gap_to_noise": lic.gap_to_noise, "n_forget": int(len(c["rows"].forget)),
              "row": lic.license.row.row_id if lic.license.row else None, "audited_at":
                  datetime.now(timezone.utc).isoformat(timespec="seconds"), **result}
    batch.tracker.set_version_tags(name, version, {
        "audit": "passed" if result["passed"] else "failed",
        "qualified": "qualified, audited" if result["passed"] else "qualified, audit FAILED"})
    batch.tracker.log_json(batch.parent, record, "audit.json")
    log.info(f"audit of v{version} ({c['method']}, batch {batch_id}): full certificate "
             f"{'passed' if result['passed'] else 'FAILED: ' + '; '.join(result['failures'])} "
             f"({result['references']} references, {result['seconds']:.1f} s)")
    out = promoted
    if not result["passed"]:
        after = load_state(StateSettings.of(params), c["device"])
        D = retained_train_rows(after.manifest)
        rows = BatchRows(before=D, forget=np.zeros(0, dtype=np.int64), retain=D,
                         adjacent_mask=np.zeros(len(D), dtype=bool), validation=validation_rows(after.manifest))
        retrain = S.unlearn_and_certify(batch, Step(EXACT_RETRAIN, CertificateKind.EXACT), settings.step_inputs, after,
                                        rows, None, None, c["objective"], lic.batch_index)
        if not S.accepted(batch, retrain, settings.gate.exact_retrain_overrides):
            raise RuntimeError(f"the audit of v{version} failed and the exact retrain missed a floor of the gate: "
                               f"{retrain.verdict.failures}; v{version} stays, tagged audit failed")
        out = S.promote(batch, settings, after, c["requests"].iloc[0:0], c["objective"], retrain, rows,
                        n_original_train(after.manifest, after.ledger))
        batch.tracker.set_version_tags(name, str(out.version), {"validation_mode": "qualified",
                                                                   "qualified": "exact retrain",
                                                                   "audit_retrain_of": version})
        record["then"] = {"exact_retrain_version": str(out.version)}
        log.info(f"audit failed: exact retrain promoted as v{out.version} (was v{version})")
    append_audit(settings.paths, record)
    return out


def main() -> None:
    """`python -m flows.qualify` (and `python -m flows.warm run flows.qualify` in a DVC stage)."""
    params_path = params_or_exit(base_parser(__doc__).parse_args().params)
    with one_line_errors(), prefect_api():
        params = load_params(params_path)
        qualify.with_options(task_runner=task_runner_for(params))(params_path)


if __name__ == "__main__":
    main()
