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
from tasks import plots
from tasks.qualification import (original_state, qualification_path, qualify_model, table_frame,
                                 write_qualification)
from tasks.reporting import run_logger
from unlearning.config import ConfigError, Params, load_params
from unlearning.qualification import Qualification


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
    path = qualification_path(params)
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
    state = original_state(params, device)
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


def main() -> None:
    """`python -m flows.qualify` (and `python -m flows.warm run flows.qualify` in a DVC stage)."""
    params_path = params_or_exit(base_parser(__doc__).parse_args().params)
    with one_line_errors(), prefect_api():
        params = load_params(params_path)
        qualify.with_options(task_runner=task_runner_for(params))(params_path)


if __name__ == "__main__":
    main()
