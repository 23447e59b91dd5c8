"""Stage `train`: train the original production model (DVC output), log it to MLflow and register it
as the first `champion`."""

from __future__ import annotations

from prefect import flow

from flows.common import base_parser, device_of, params_or_exit, prefect_api, tracker_for, use_project_path
from flows.errors import one_line_errors
from unlearning.config import load_params
from tasks.reporting import run_logger
from tasks.state import StateSettings, current_fingerprint, original_path
from adapters.store_check import store_identity
from tasks.id_key import IdKey
from tasks.training import clean_of_erased, model_spec, save_checkpoint, train_original
from unlearning.data import load_prepared
from unlearning.data.preparation import recipe_of
from unlearning.models import param_count
from unlearning.models.training import trainable_param_count
from unlearning.serving import input_example


@flow(name="train")
def train(params_path: str = "params.yaml") -> dict:
    params = load_params(params_path)
    use_project_path(params)
    device = device_of(params)
    prepared = load_prepared(params.path("prepared_dir"))
    # before training: a store with erased rows left in is refused
    erased = clean_of_erased(params.project_paths, IdKey.of(params), params.train.init_checkpoint, prepared)
    model, metrics = train_original(params, prepared, device)
    # what the original is built from (load_state checks it)
    fingerprint = current_fingerprint(StateSettings.of(params), prepared)
    tracker = tracker_for(params)
    run_id = tracker.start_run("train-original", tags={"stage": "train", "dataset": prepared.info["name"]})
    n_params, n_trainable = param_count(model), trainable_param_count(model)  # frozen parameters count in n_params
    tracker.log_params(run_id, {"train": params.train.model_dump(), "dataset": prepared.info["name"],
                                "seed": params.base.seed, "device": device, "n_params": n_params,
                                "n_trainable_params": n_trainable})
    tracker.log_metrics(run_id, metrics)
    version = tracker.log_model(run_id, model.cpu(), params.tracking.registered_model,
                                input_example=input_example(prepared.X, prepared.manifest),
                                class_names=prepared.info["class_names"], preparation=recipe_of(prepared.info))
    tracker.set_alias(params.tracking.registered_model, params.tracking.alias, version)
    tracker.set_version_tags(params.tracking.registered_model, version, {"fingerprint": fingerprint["digest"]})
    tracker.end_run(run_id)
    from adapters.dvc_metrics import write_train_metrics

    write_train_metrics(params.project_paths, metrics)
    save_checkpoint(model.cpu(), original_path(params.project_paths),
                    {"model_version": version, "spec": model_spec(params.train.model, prepared), "metrics": metrics,
                     "tracking_store": store_identity(params.mlflow_tracking_uri(), params.root),
                     "fingerprint": fingerprint, **erased})
    how = "trained" if model.origin == "trained" else f"loaded ({model.origin}, not retrained)"
    counted = f"{n_params} params" + (f", {n_trainable} trainable" if n_trainable != n_params else "")
    run_logger().info(f"{how} {params.train.model.arch} ({counted}) on {metrics['n_train']} samples: "
          f"val accuracy {metrics['val_accuracy']:.3f}; registered {params.tracking.registered_model} "
          f"v{version} as @{params.tracking.alias}")
    return {**metrics, "model_version": version}


def main() -> None:
    """`python -m flows.train` (and `python -m flows.warm run flows.train` in a DVC stage)."""
    params_path = params_or_exit(base_parser(__doc__).parse_args().params)
    with one_line_errors(), prefect_api():
        train(params_path)


if __name__ == "__main__":
    main()
