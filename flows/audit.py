"""Flow `audit`: leverage diagnostics for a PROPOSED forget set, without changing anything.

Validates the request file like a batch would, computes the diagnostics of the current production model
(forget self-leverage, retain cross-leverage, predicted output gap, leakage ratio) and logs the report,
the per-sample tables and the plots to MLflow. Model, manifest and ledger stay untouched."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.common import base_parser, device_of, params_or_exit, prefect_api, tracker_for, use_project_path
from flows.errors import one_line_errors
from tasks.diagnostics import leverage_diagnostics, log_diagnostics
from tasks.state import load_state
from tasks.validation import raise_if_invalid, validate_request
from unlearning.config import load_params
from unlearning.requests import coerce_requests, read_request_file
from tasks.reporting import run_logger


@flow(name="audit")
def audit(request_path: str, params_path: str = "params.yaml") -> dict:
    params = load_params(params_path)
    use_project_path(params)
    device = device_of(params)
    state = load_state(params, device)
    path = Path(request_path)
    df = read_request_file(path)
    check = validate_request(str(path), df, state.manifest, gx_dir=params.path("gx_dir"))
    tracker = tracker_for(params)
    run_id = tracker.start_run(f"audit-{path.stem}", tags={"stage": "audit", "request_file": path.name})
    try:
        tracker.log_json(run_id, check.gx_result, "gx_result.json")
        if check.data_docs:
            tracker.log_dir(run_id, check.data_docs, "data_docs")
        raise_if_invalid(str(path), check)
        forget_ids = coerce_requests(df)["sample_id"].tolist()
        report, tables = leverage_diagnostics(params.diagnostics, params.train.weight_decay, params.base.seed,
                                              params.base.progress, state.prepared, state.manifest, forget_ids,
                                              state.model, device, params.train.label_smoothing)
        log_diagnostics(tracker, run_id, report, tables)
        tracker.end_run(run_id)
    except BaseException:
        tracker.end_run(run_id, ok=False)
        raise
    summary = report.to_dict()
    top = tables["forget"].sort_values("self_leverage", ascending=False).head(5)
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
