"""Flow `audit`: leverage diagnostics for a PROPOSED forget set, without changing anything.

Validates the request file like a batch would, computes the diagnostics of the current production model
(forget self-leverage, retain cross-leverage, predicted output gap, leakage ratio) and logs the report,
the per-sample tables and the plots to MLflow. Model, manifest and ledger stay untouched."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import pandas as pd
from prefect import flow, task

from flows.common import base_parser, device_of, params_or_exit, prefect_api, tracker_for, use_project_path
from flows.errors import one_line_errors
from adapters.clock import computes
from tasks.diagnostics import leverage_diagnostics, log_diagnostics
from tasks.state import StateSettings, load_state
from adapters.request_check import validation_mask
from tasks.validation import RequestCheck, check_request_frame, raise_if_invalid
from unlearning.config import Params, load_params
from unlearning.privacy.erasure import id_key
from unlearning.requests import coerce_requests, read_request_file
from unlearning.privacy.salt import is_keyed
from tasks.reporting import run_logger


@task(name="validate-request")
@computes
def validate_request(path: str, df: pd.DataFrame, manifest: pd.DataFrame, gx_dir: str | Path | None,
                     key: Callable[[str], str]) -> RequestCheck:
    """tasks.validation.validate_request with the ledger's id form (`key`), as the deletion batch checks a
    file: under deletion.hash_sample_ids GX sees hashed ids only, so its result and its Data Docs (both logged
    to the audit's MLflow run) name no plain id."""
    return check_request_frame(df, manifest, gx_dir=gx_dir, run_name=Path(path).name, key=key)


def audit_redaction(params: Params, key: Callable[[str], str], manifest: pd.DataFrame,
                    requests: pd.DataFrame) -> dict | None:
    """The tracker's redaction (plain id -> hashed id) under deletion.hash_sample_ids, else None: the live
    manifest's ids, as the deletion batch's (tasks/batch_path.py open_batch), and the file's own ids, which
    an erased or unknown id is not among (ids already in the hashed form stay as they are)."""
    if not params.deletion.hash_sample_ids:
        return None
    named = requests["sample_id"].tolist() if "sample_id" in requests.columns else []
    ids = [*manifest["sample_id"].astype(str), *(s for s in named if isinstance(s, str) and s)]
    return {s: key(s) for s in ids if not is_keyed(s)}


def keyed_check(check: RequestCheck, tracker) -> RequestCheck:
    """The check with its problem lines naming ids as the run does (quoted ids hashed under redaction): they
    become the flow's error, which Prefect logs."""
    return dataclasses.replace(check, problems=tracker.redact(list(check.problems)))


@flow(name="audit")
def audit(request_path: str, params_path: str = "params.yaml") -> dict:
    params = load_params(params_path)
    use_project_path(params)
    device = device_of(params)
    state = load_state(StateSettings.of(params), device)
    path = Path(request_path)
    df = read_request_file(path)
    from unlearning.privacy.salt import id_salt

    key = id_key(params.deletion.hash_sample_ids, id_salt(params))
    check = validate_request(str(path), df, state.manifest, params.path("gx_dir"), key)
    tracker = tracker_for(params)
    tracker.redaction = audit_redaction(params, key, state.manifest, df)  # as the batch: hashed ids only
    run_id = tracker.start_run(f"audit-{path.stem}", tags={"stage": "audit", "request_file": path.name})
    try:
        tracker.log_json(run_id, check.gx_result, "gx_result.json")
        if check.data_docs:
            tracker.log_dir(run_id, check.data_docs, "data_docs")
        raise_if_invalid(str(path), keyed_check(check, tracker))
        requests = coerce_requests(df)
        # a validation row is erased, never unlearned (no model trained on it): it has no leverage to audit
        forget_ids = requests["sample_id"][~validation_mask(state.manifest, requests)].tolist()
        if not forget_ids:
            tracker.end_run(run_id)
            run_logger().info(f"audit of {path.name}: its {len(requests)} row(s) name validation rows only: no model "
                              f"trained on them, so there is nothing to unlearn or audit (a batch erases them from "
                              f"the stores); nothing was changed")
            return {"run_id": run_id, "report": None}
        report, tables = leverage_diagnostics(params.diagnostics, params.train.weight_decay, params.base.seed,
                                              params.base.progress, state.prepared, state.manifest, forget_ids,
                                              state.model, device, params.train.label_smoothing)
        log_diagnostics(tracker, run_id, report, tables)
        tracker.end_run(run_id)
    except BaseException:
        tracker.end_run(run_id, ok=False)
        raise
    summary = report.to_dict()
    top = tracker.redact_frame(tables["forget"].sort_values("self_leverage", ascending=False).head(5))
    run_logger().info(f"audit of {path.name}: {len(forget_ids)} sample(s); solver {report.solver}, "
          f"leakage ratio {report.leakage_ratio:.3f}, ||S_F|| {report.self_leverage_spectral_norm:.3f}, "
          f"predicted gap of do_nothing {report.predicted_gap_do_nothing:.4f}; nothing was changed")
    run_logger().info("highest self-leverage:\n" + top.to_string(index=False))
    return {"run_id": run_id, "report": summary}


def main() -> None:
    """`python -m flows.audit` (and `python -m flows.warm run flows.audit` in a DVC stage)."""
    parser = base_parser(__doc__)
    parser.add_argument("request", help="request file naming the proposed forget set")
    a = parser.parse_args()
    params_or_exit(a.params)
    with one_line_errors(), prefect_api():
        audit(a.request, a.params)


if __name__ == "__main__":
    main()
