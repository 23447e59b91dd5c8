"""Stage `report` (report/dvc.yaml, `make report`): the evidence studies of `report` in params.yaml (S3 random
forget sets, S4 Fashion-MNIST entanglement, S5 diagnostics against outcomes; unlearning.studies), each written to
reports/<study>.json, logged to ONE MLflow run (metrics, JSON, figures, the markdown), and the results
section of `report.readme` (docs/evidence.md) regenerated from them.

The JSON of a study that is not re-run (not in report.studies) is read back from reports/, so the page keeps
every table; a study that fails leaves the files and the page as they were (atomic writes, the page last)."""

from __future__ import annotations

import json
import time

import torch
from prefect import flow

from flows.common import base_parser, device_of, params_or_exit, prefect_api, tracker_for, use_project_path
from flows.errors import one_line_errors
from unlearning.config import load_params
from unlearning.studies import readme
from tasks.reporting import run_logger

STUDY_TITLES = {"s3": "S3 random forget sets (Ascent Fails to Forget)",
                "s4": "S4 Fashion-MNIST entanglement (Retain-Forget Entanglement)",
                "s5": "S5 diagnostics against outcomes (Loss is Not Behavior)"}


def headline_metrics(name: str, result: dict) -> dict:
    """A few numbers per study for the MLflow runs table (the full result is the JSON artifact)."""
    out = {f"{name}.wall_seconds": result["wall_seconds"]}
    if name == "s3":
        for label, row in result["summary"].items():
            key = label.replace(" ", "_").replace("=", "")
            out[f"s3.pass_rate.{key}"] = row["pass_rate"]
            if row.get("klom_to_floor/forget") is not None:
                out[f"s3.klom_to_floor_forget.{key}"] = row["klom_to_floor/forget"]
    elif name == "s5":
        out["s5.first_pick_is_best"] = result["policy"]["first_pick_is_best"] / max(result["policy"]["n"], 1)
        out["s5.max_regret_seconds"] = result["policy"]["max_regret_seconds"]
        for m, c in result["spearman"].items():
            if c["predicted_gap_vs_gap"] == c["predicted_gap_vs_gap"]:  # not nan
                out[f"s5.spearman_gap.{m}"] = c["predicted_gap_vs_gap"]
    elif name == "s4":
        for st in result["settings"]:
            for row in st["rows"]:
                key = f"s4.{st['targets']}.{st['model']}.{row['method']}"
                out[f"{key}.forget"], out[f"{key}.adjacent"] = row["forget"], row["adjacent"]
    return out


@flow(name="report")
def report(params_path: str = "params.yaml") -> dict:
    from adapters import plots
    from tasks.report import figures, provenance, regenerate_readme, run_study, write_report
    from tasks.reporting import markdown_artifact

    params = load_params(params_path)
    use_project_path(params)
    device = device_of(params)
    torch.set_num_threads(params.report.threads)
    meta = provenance(params.project_paths, params.gate, device)  # the commit and date the studies START from (edits during a run don't count)
    t0 = time.perf_counter()
    results = {}
    for name in params.report.studies:
        if not getattr(params.report, name).enabled:
            run_logger().info(f"{name}: report.{name}.enabled is false; keeping reports/{name}.json as it is")
            continue
        run_logger().info(f"{STUDY_TITLES[name]} ...")
        results[name] = {**run_study(params, name, device), "provenance": meta}
        run_logger().info(f"{name}: {results[name]['wall_seconds']:.0f} s; wrote {write_report(params.project_paths, name, results[name])}")
    reports = dict(results)
    for name in STUDY_TITLES:  # studies not re-run keep their tables (from the last run's JSON)
        path = params.path("reports_dir") / f"{name}.json"
        if name not in reports and path.exists():
            reports[name] = json.loads(path.read_text())
    from unlearning.studies.entanglement import markdown_s4

    section = readme.results_section(reports, meta, markdown_s4)
    tracker = tracker_for(params)
    run_id = tracker.start_run(f"report @ {meta['date']}", tags={"stage": "report", "commit": meta["commit"],
                                                                  "studies": ",".join(results)})
    tracker.log_params(run_id, {"report": params.report.model_dump(), "train": params.train.model_dump(),
                                "gate": params.gate.model_dump(), "device": device})
    metrics = {k: v for name, r in results.items() for k, v in headline_metrics(name, r).items()}
    tracker.log_metrics(run_id, metrics)
    for name, r in results.items():
        tracker.log_json(run_id, r, f"reports/{name}.json")
        for file, fig in figures(name, r).items():
            tracker.log_figure(run_id, fig, file)
            plots.close(fig)
    tracker.set_description(run_id, section, "report.md")
    tracker.end_run(run_id)
    markdown_artifact(section, "report", "the evidence studies (the results section of docs/evidence.md)")
    path = regenerate_readme(params.report, params.project_paths, section)
    run_logger().info(f"report: {len(results)} studies in {time.perf_counter() - t0:.0f} s; MLflow run {run_id}"
          + (f"; regenerated the results section of {path}" if path else ""))
    return {"run_id": run_id, "studies": list(results), "readme": str(path) if path else None}


def main() -> None:
    """`python -m flows.report` (and `python -m flows.warm run flows.report` in a DVC stage)."""
    params_path = params_or_exit(base_parser(__doc__).parse_args().params)
    with one_line_errors(), prefect_api():
        report(params_path)


if __name__ == "__main__":
    main()
